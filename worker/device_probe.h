// The device a worker drives (--device cpu | cuda:N) as it registers it with
// the coordinator, and the GPUs of this machine (--probe-devices).
//
// ProbeGpus is the one adapter: on the CUDA runtime alone in a CUDA build
// (gpu_probe_cuda.cc; never the driver library, so the worker still starts on
// a machine without a GPU or driver and says so), a stub that says the build
// has no CUDA otherwise (gpu_probe_none.cc). The rest is pure. Linked into
// the worker binary only (target shardtrain_device_probe): the CLI, which
// asks the worker binary instead, never links CUDA for it.
#ifndef SHARDTRAIN_WORKER_DEVICE_PROBE_H_
#define SHARDTRAIN_WORKER_DEVICE_PROBE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "shardtrain/v1/types.pb.h"

namespace shardtrain::worker {

// One GPU as the CUDA runtime describes it.
struct GpuInfo {
  int ordinal = 0;           // N of "cuda:N"
  std::string model;         // cudaDeviceProp::name, e.g. "NVIDIA H100 80GB HBM3"
  int64_t memory_bytes = 0;  // cudaDeviceProp::totalGlobalMem
  int major = 0;             // compute capability major.minor
  int minor = 0;
};

// The compute capability this build's kernels are compiled for at the
// least (sm_80: bf16 tensor cores): older GPUs cannot train.
inline constexpr int kMinComputeMajor = 8;

// Every GPU the CUDA runtime sees, by ordinal. FAILED_PRECONDITION
// "no CUDA device: <why>" when there is none: the runtime's error
// ("cudaGetDeviceCount: CUDA error 35 cudaErrorInsufficientDriver (...)"
// without a driver), no device, or a build without CUDA.
absl::StatusOr<std::vector<GpuInfo>> ProbeGpus();

// The precisions this build trains in on `gpu`: fp32, bf16 and fp16 from
// compute capability 8.0 on; none below.
std::vector<std::string> GpuPrecisions(const GpuInfo& gpu);

// The device named by --device ("cpu" or "cuda:N") as the worker registers
// it: name, kind, memory, model ("cpu, 4 threads"; "NVIDIA H100 80GB HBM3,
// compute capability 9.0") and precisions. INVALID_ARGUMENT for a malformed
// name (a usage error); FAILED_PRECONDITION naming --device and the reason
// when the GPU is not there ("--device cuda:0: no CUDA device: ..."; "...:
// this machine has 1 CUDA device (cuda:0)") or cannot train (compute
// capability below 8.0). `gpus` is ProbeGpus' answer; it is consulted only
// for cuda:N.
absl::StatusOr<v1::Device> DeviceFor(const std::string& name, int threads,
                                     const absl::StatusOr<std::vector<GpuInfo>>& gpus);

// DeviceFor with this machine's GPUs (probed only for cuda:N).
absl::StatusOr<v1::Device> ProbeDevice(const std::string& name, int threads);

// What --probe-devices prints: one line per GPU, tab-separated
//   NAME  PRECISIONS  MEMORY_BYTES  COMPUTE_CAPABILITY  MODEL
// e.g. "cuda:0\tfp32,bf16,fp16\t85029158912\t9.0\tNVIDIA H100 80GB HBM3\n";
// PRECISIONS is "-" for a GPU this build cannot train on. Tabs and newlines
// in the model are replaced by spaces.
std::string ProbeLines(const std::vector<GpuInfo>& gpus);

}  // namespace shardtrain::worker

#endif  // SHARDTRAIN_WORKER_DEVICE_PROBE_H_
