#include "client/local_gpus.h"

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace shardtrain::client {

std::vector<std::string> UsableGpus(const std::string& probe_output) {
  std::vector<std::string> gpus;
  for (absl::string_view line : absl::StrSplit(probe_output, '\n', absl::SkipEmpty())) {
    const std::vector<absl::string_view> f = absl::StrSplit(line, '\t');
    if (f.size() < 2 || !absl::StartsWith(f[0], "cuda:") || f[1].empty() || f[1] == "-") continue;
    gpus.emplace_back(f[0]);
  }
  return gpus;
}

std::string WorkerGpu(int index, const std::vector<std::string>& gpus) {
  return gpus[static_cast<size_t>(index) % gpus.size()];
}

absl::Status CheckWorkersFitGpus(const JobSpec& spec, int workers, int gpus) {
  if (spec.parallel.comm != CommBackend::kNccl || spec.World() <= 1 || workers <= gpus) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrFormat(
      "parallel.comm: nccl needs one GPU per worker (%d workers, %d GPUs here: NCCL refuses two "
      "ranks on one GPU); use fewer workers or parallel.comm: gloo, which shares GPUs",
      workers, gpus));
}

}  // namespace shardtrain::client
