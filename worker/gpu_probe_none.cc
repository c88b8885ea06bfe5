// ProbeGpus of a build without CUDA (no nvcc when it was configured): there
// is no GPU it could drive, whatever the machine has.
#include "worker/device_probe.h"

namespace shardtrain::worker {

absl::StatusOr<std::vector<GpuInfo>> ProbeGpus() {
  return absl::FailedPreconditionError(
      "no CUDA device: this shardtrain-worker was built without CUDA (no nvcc when it was "
      "configured)");
}

}  // namespace shardtrain::worker
