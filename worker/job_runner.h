// What a worker does with an assignment: build the rank's part of the job
// from the spec and run it, reporting to the coordinator as it goes.
#ifndef SHARDTRAIN_WORKER_JOB_RUNNER_H_
#define SHARDTRAIN_WORKER_JOB_RUNNER_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/metrics.h"
#include "shardtrain/v1/types.pb.h"
#include "worker/daemon.h"

namespace shardtrain::worker {

// The runner the daemon uses for every assignment.
JobRunner NewJobRunner(MetricsRegistry* registry);

}  // namespace shardtrain::worker

#endif  // SHARDTRAIN_WORKER_JOB_RUNNER_H_
