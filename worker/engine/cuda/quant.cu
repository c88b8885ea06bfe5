// Frozen weights in int8 or NF4, dequantized a tile of rows at a time
// (kernels.h; the formats and the CPU twin are worker/quant/weight_quant.h,
// model/weight_quant.h).
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/model/weight_quant.h"
#include "worker/engine/cuda/kernel_util.cuh"
#include "worker/engine/cuda/kernels.h"

namespace shardtrain::engine::cuda {
namespace {

using internal::Store;

constexpr int kThreads = 256;

// The 16 NF4 levels by value (a kernel argument: no constant memory to set).
struct Nf4Levels {
  float v[16];
};

// One thread per element e0 + i of the flattened weight: tile[i] = its
// value, as the CPU's DequantizeRows computes it.
template <typename F>
__global__ void DequantizeKernel(F* tile, DeviceQuantWeight w, Nf4Levels levels, int64_t e0,
                                 int64_t n) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t e = e0 + i;
  float v;
  if (w.int8) {
    const float s = w.absmax[e / w.cols] / 127.0f;
    v = static_cast<float>(static_cast<int8_t>(w.codes[e])) * s;
  } else {
    const int64_t b = e / model::kNf4BlockSize;
    const float absmax =
        w.absmax != nullptr
            ? w.absmax[b]
            : w.dynamic_map[w.absmax_codes[b]] * w.absmax_scale[b / model::kNf4AbsmaxBlockSize] +
                  w.absmax_offset;
    const uint8_t byte = w.codes[e / 2];
    const int code = (e % 2 == 0) ? (byte >> 4) : (byte & 0x0F);
    v = levels.v[code] * absmax;
  }
  tile[i] = Store<F>(v);
}

}  // namespace

absl::Status DequantizeRows(const KernelCtx& ctx, void* tile, const DeviceQuantWeight& w,
                            int64_t r0, int64_t rows) {
  constexpr const char* kName = "DequantizeRows";
  if (r0 < 0 || rows < 0 || r0 + rows > w.rows) {
    return absl::InvalidArgumentError(
        absl::StrCat(kName, ": rows [", r0, ", ", r0 + rows, ") outside [0, ", w.rows, ")"));
  }
  if (!w.int8 && w.absmax == nullptr && w.dynamic_map == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(kName, ": a double-quantized NF4 weight needs the dynamic map"));
  }
  const int64_t n = rows * w.cols;
  if (n == 0) return absl::OkStatus();
  const int64_t blocks = internal::BlocksFor(n, kThreads);
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckGrid(kName, blocks));
  Nf4Levels levels;
  for (int i = 0; i < 16; ++i) levels.v[i] = model::kNf4Levels[i];
  return internal::DispatchDtype(ctx.dtype, [&](auto tag) {
    using F = typename decltype(tag)::type;
    DequantizeKernel<F><<<static_cast<unsigned>(blocks), kThreads, 0, ctx.stream>>>(
        static_cast<F*>(tile), w, levels, r0 * w.cols, n);
    return internal::CheckLaunch(kName);
  });
}

}  // namespace shardtrain::engine::cuda
