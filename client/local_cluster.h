// `shardtrain local`: a whole cluster on this machine for one job. Starts a
// coordinator (127.0.0.1, port 0, temporary state dir) and N workers as child
// processes, submits the job, prints its progress, and tears everything down
// when the job ends, on Ctrl-C/SIGTERM, or if this process dies (children
// get SIGTERM via PR_SET_PDEATHSIG). Nothing is left running.
//
// A job with resources.device: cuda gets GPU workers: `shardtrain-worker
// --probe-devices` lists the GPUs (the CLI links no CUDA), worker i runs
// --device cuda:(i mod GPUs). Without a GPU that can train, the job is
// refused (FAILED_PRECONDITION naming resources.device and the reason: exit
// 1, an unrunnable job, not a bad spec) before anything starts.
#ifndef SHARDTRAIN_CLIENT_LOCAL_CLUSTER_H_
#define SHARDTRAIN_CLIENT_LOCAL_CLUSTER_H_

#include <string>
#include <vector>

#include "client/commands.h"

namespace shardtrain::client {

struct LocalOptions {
  std::string spec_path;
  std::vector<std::string> sets;  // --set overrides
  int workers = 0;                // 0: the spec's world
  int threads = 0;                // per worker; 0: cores / workers (at least 1)
  int64_t lease_ms = 10'000;
  bool keep = false;        // keep the temp dir (state + logs)
  bool plot = false;        // draw the loss curve when the job ends
  std::string resume_from;  // checkpoint dir (or one step-N dir) to start from
};

// Exit code (client/errors.h): 0 when the job SUCCEEDED, 1 when it did not or
// the cluster failed, 2 for bad input, 130 when interrupted.
int Local(const GlobalFlags& g, const LocalOptions& o);

}  // namespace shardtrain::client

#endif  // SHARDTRAIN_CLIENT_LOCAL_CLUSTER_H_
