#include "worker/job_runner.h"

#include <chrono>
#include <iostream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "common/process.h"

namespace shardtrain::worker {

absl::StatusOr<v1::Device> ProbeDevice(const std::string& name, int threads) {
  v1::Device d;
  if (name == "cpu") {
    d.set_name("cpu");
    d.set_kind("cpu");
    d.set_memory_bytes(TotalMemoryBytes());
    d.set_model(absl::StrCat("cpu, ", threads, " threads"));
    return d;
  }
  int index = -1;
  if (name.rfind("cuda:", 0) != 0 || !absl::SimpleAtoi(name.substr(5), &index) || index < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device: '", name, "' is not cpu or cuda:N"));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "--device ", name, ": GPU training is not available in this build yet; use --device cpu"));
}

JobRunner NewJobRunner(MetricsRegistry* registry) {
  return [](const RunContext& ctx) {
    const v1::RunAssignment& a = *ctx.assignment;
    absl::StatusOr<JobSpec> spec = ParseJobSpec(a.spec_yaml());
    if (!spec.ok()) {
      v1::ReportFailureRequest f;
      f.set_job_id(a.job_id());
      f.set_generation(a.generation());
      f.set_rank(a.rank());
      f.set_worker_id(ctx.worker_id);
      f.set_reason(absl::StrCat("spec: ", spec.status().message()));
      ctx.client->ReportFailure(f).IgnoreError();
      return;
    }
    std::cerr << "shardtrain-worker[" << ctx.worker_id << "]: holding rank " << a.rank()
              << " of job " << a.job_id() << " (" << spec->name << ")" << std::endl;
    while (!*ctx.stop) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  };
}

}  // namespace shardtrain::worker
