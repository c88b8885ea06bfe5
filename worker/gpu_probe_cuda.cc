// ProbeGpus of a CUDA build: the CUDA runtime's view of this machine. Uses
// only cudaGetDeviceCount and cudaGetDeviceProperties, which need no context
// on the device (no memory is allocated on it).
#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "worker/device_probe.h"

namespace shardtrain::worker {
namespace {

absl::Status NoDevice(absl::string_view call, cudaError_t e) {
  return absl::FailedPreconditionError(absl::StrCat("no CUDA device: ", call, ": CUDA error ",
                                                    static_cast<int>(e), " ", cudaGetErrorName(e),
                                                    " (", cudaGetErrorString(e), ")"));
}

}  // namespace

absl::StatusOr<std::vector<GpuInfo>> ProbeGpus() {
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    return NoDevice("cudaGetDeviceCount", e);
  }
  if (count <= 0) {
    return absl::FailedPreconditionError("no CUDA device: cudaGetDeviceCount found none");
  }
  std::vector<GpuInfo> gpus;
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp p{};
    if (cudaError_t e = cudaGetDeviceProperties(&p, i); e != cudaSuccess) {
      return NoDevice(absl::StrCat("cudaGetDeviceProperties(", i, ")"), e);
    }
    GpuInfo g;
    g.ordinal = i;
    g.model = p.name;
    g.memory_bytes = static_cast<int64_t>(p.totalGlobalMem);
    g.major = p.major;
    g.minor = p.minor;
    gpus.push_back(std::move(g));
  }
  return gpus;
}

}  // namespace shardtrain::worker
