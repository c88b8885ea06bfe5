// Dense peak arithmetic of accelerators by model name: the one table MFU
// (model FLOPs utilisation) is measured against — the worker's progress and
// metrics, gpu_train_bench — and `plan --auto` predicts step times from.
//
// A device is looked up by its reported name (cudaDeviceProp::name, e.g.
// "NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA A100-SXM4-80GB") or a
// short name a user types ("h100", "a100"): the first row whose key occurs
// in the name, case-insensitively, so the more specific rows come first
// ("H100 PCIe" before "H100"). Figures are the vendors' dense (no
// sparsity) peaks: tensor-core bf16/fp16 with fp32 accumulation, and fp32
// on the CUDA cores (shardtrain never computes fp32 GEMMs in TF32).
#ifndef SHARDTRAIN_COMMON_DEVICE_PEAKS_H_
#define SHARDTRAIN_COMMON_DEVICE_PEAKS_H_

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/dtype.h"

namespace shardtrain {

struct DevicePeak {
  const char* key;     // matched within the device's name
  const char* label;   // how output names it, e.g. "H100 SXM"
  double bf16_tflops;  // dense bf16 and fp16 (tensor cores, fp32 accumulation)
  double fp32_tflops;  // fp32 on the CUDA cores; 0 when not listed
};

// Every row of the table, most specific first.
const std::vector<DevicePeak>& DevicePeaks();

// The row for `device_name`, or null when no row's key occurs in it.
const DevicePeak* FindDevicePeak(std::string_view device_name);

// FLOP/s of `device_name` computing in `compute` (bf16 and fp16 share the
// tensor-core peak); nullopt when the device is unknown or has no figure
// for that type — MFU is then omitted, and WhyNoPeak says why.
std::optional<double> DensePeakFlops(std::string_view device_name, DataType compute);
std::string WhyNoPeak(std::string_view device_name, DataType compute);

}  // namespace shardtrain

#endif  // SHARDTRAIN_COMMON_DEVICE_PEAKS_H_
