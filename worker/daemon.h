// The worker daemon's control loop: attach to the coordinator, renew the
// lease, and start or stop the job runner as the heartbeat answers say.
//
// The coordinator drives workers by reconciliation: each heartbeat says which
// job (and generation) this worker runs now, and the answer holds the
// commands that make it run what it should (run, abort, drain). A coordinator
// restart or a lost answer therefore needs no special handling here beyond
// re-registering (with the old id) when the coordinator does not know us.
#ifndef SHARDTRAIN_WORKER_DAEMON_H_
#define SHARDTRAIN_WORKER_DAEMON_H_

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "common/metrics.h"
#include "shardtrain/v1/coordinator.pb.h"
#include "worker/coordinator_api.h"
#include "worker/recent_collectives.h"

namespace shardtrain::worker {

struct WorkerOptions {
  std::string coordinator;                       // HOST:PORT, as logs name it
  v1::Device device;                             // what this worker drives
  int threads = 1;                               // compute threads
  std::string collective_address = "127.0.0.1";  // where peers reach our collectives
  std::string metrics_address;                   // HOST:PORT of our /metrics, if served
  int64_t heartbeat_ms = 1000;                   // upper bound; lease/3 if shorter
  // Absolute directory a job's relative checkpoint.dir (and a relative
  // resume_from) resolves against; reported at registration. All ranks of a
  // job must reach the same checkpoint files through it. Empty: relative
  // paths stay relative to the working directory.
  std::string checkpoint_root;
  // Absolute directory a job's relative data.train and data.val resolve
  // against; reported at registration. Empty: the working directory.
  std::string data_root;
  // Whether a spec path must stay inside its root (data paths under
  // data_root, checkpoint paths under checkpoint_root): set when the root
  // was given by flag. A path that escapes is a permanent failure naming
  // the field.
  bool confine_data = false;
  bool confine_checkpoints = false;
};

// Where a running job learns who it is and reports back.
struct RunContext {
  const v1::RunAssignment* assignment;
  std::string worker_id;
  CoordinatorApi* client;  // the daemon's; outlives the run
  const WorkerOptions* options;
  const std::atomic<bool>* stop;  // set when the job must end now (abort, shutdown)
  // Where the runner attaches its communicator's flight recorder for the
  // daemon's heartbeats to carry; outlives the run. May be null (tests).
  RecentCollectives* collectives = nullptr;
};

// Runs one assignment to its end (or until *ctx.stop). It reports steps,
// completion and failure to the coordinator itself. Called on its own thread.
using JobRunner = std::function<void(const RunContext& ctx)>;

// Thread-compatible: Run is called once, from one thread; worker_id() may be
// called from any thread.
//
// The heartbeat loop (Run's thread) never waits on a job: stopping a job sets
// its stop flag and hands its thread to a list that is joined once it has
// ended, so a rank stuck in a rendezvous or a collective (each bounded by its
// own timeout) cannot make this worker miss its lease. A new assignment
// starts at once, even while a stopped one is still winding down.
class WorkerDaemon {
 public:
  // `coordinator` (the real CoordinatorClient, or a fake in tests) and
  // `registry` must outlive the daemon.
  WorkerDaemon(WorkerOptions options, CoordinatorApi* coordinator, JobRunner runner,
               MetricsRegistry* registry);
  ~WorkerDaemon();

  // Registers, then heartbeats until *shutdown; retries an unreachable
  // coordinator forever (logging each outage once). On shutdown the running
  // job, if any, is stopped and joined.
  void Run(const std::atomic<bool>& shutdown);

  std::string worker_id() const;

 private:
  absl::Status Register();
  void Apply(const v1::HeartbeatResponse& resp);
  void StartJob(const v1::RunAssignment& a);
  // Asks the running job to stop and retires its thread; never blocks.
  void StopJob(const std::string& reason);
  // Joins retired job threads: those that have ended, or all when `all`.
  void JoinRetired(bool all);

  const WorkerOptions options_;
  const JobRunner runner_;
  CoordinatorApi* const client_;
  Counter& heartbeats_;
  Counter& assignments_;

  mutable std::mutex mu_;
  std::string worker_id_;      // GUARDED_BY(mu_)
  std::string worker_secret_;  // GUARDED_BY(mu_); bound to worker_id_ by the coordinator
  int64_t lease_ms_ = 10'000;  // GUARDED_BY(mu_)
  v1::RunAssignment current_;  // GUARDED_BY(mu_); job_id empty when idle
  std::unique_ptr<std::atomic<bool>> job_stop_;
  std::unique_ptr<std::atomic<bool>> job_finished_;
  // The running job's flight recorder, as its heartbeats carry it; shared
  // with the job thread, which may outlive the daemon's interest in it.
  std::shared_ptr<RecentCollectives> job_collectives_;  // GUARDED_BY(mu_)
  std::thread job_thread_;
  // Stopped jobs whose threads have not been joined yet.
  struct Retired {
    std::thread thread;
    std::unique_ptr<std::atomic<bool>> stop, finished;
  };
  std::vector<Retired> retired_;  // GUARDED_BY(mu_)
};

}  // namespace shardtrain::worker

#endif  // SHARDTRAIN_WORKER_DAEMON_H_
