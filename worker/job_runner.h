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

// The device named by --device ("cpu", "cuda:N"). INVALID_ARGUMENT for a
// malformed name; FAILED_PRECONDITION for a GPU this build or machine lacks.
absl::StatusOr<v1::Device> ProbeDevice(const std::string& name, int threads);

// The runner the daemon uses for every assignment.
JobRunner NewJobRunner(MetricsRegistry* registry);

}  // namespace shardtrain::worker

#endif  // SHARDTRAIN_WORKER_JOB_RUNNER_H_
