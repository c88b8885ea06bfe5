// Conversions between fp32 and the compute type (kernels.h).
#include "worker/engine/cuda/kernel_util.cuh"
#include "worker/engine/cuda/kernels.h"

namespace shardtrain::engine::cuda {
namespace {

using internal::Load;
using internal::Store;

constexpr int kThreads = 256;

// The launchers' shared checks; n == 0 launches nothing.
absl::Status CheckConvert(const char* kernel, const void* dst, const void* src, int64_t n) {
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckNonNegative(kernel, "n", n));
  if (n == 0) return absl::OkStatus();
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckPointer(kernel, "dst", dst));
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckPointer(kernel, "src", src));
  return internal::CheckGrid(kernel, internal::BlocksFor(n, kThreads));
}

// One thread per V elements. dst (n, F) = src (n, fp32), rounded to nearest
// even.
template <typename F, int V>
__global__ void FromFloat32Kernel(F* dst, const float* src, int64_t n) {
  const int64_t i = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) * V;
  if (i >= n) return;
  float v[V];
  internal::LoadVec<float, V>(v, src + i);
  internal::StoreVec<F, V>(dst + i, v);
}

}  // namespace

absl::Status ConvertFromFloat32(const KernelCtx& ctx, void* dst, const float* src, int64_t n) {
  SHARDTRAIN_RETURN_IF_ERROR(CheckConvert("ConvertFromFloat32", dst, src, n));
  if (n == 0) return absl::OkStatus();
  return internal::DispatchDtype(ctx.dtype, [&](auto tag) {
    using F = typename decltype(tag)::type;
    return internal::LaunchElementwise<F, kThreads>(
        "ConvertFromFloat32", n, true, {dst, src}, [&](auto v, int blocks) {
          FromFloat32Kernel<F, decltype(v)::value>
              <<<blocks, kThreads, 0, ctx.stream>>>(static_cast<F*>(dst), src, n);
        });
  });
}

namespace {

// One thread per V elements. dst (n, fp32) = src (n, F).
template <typename F, int V>
__global__ void ToFloat32Kernel(float* dst, const F* src, int64_t n) {
  const int64_t i = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) * V;
  if (i >= n) return;
  float v[V];
  internal::LoadVec<F, V>(v, src + i);
  internal::StoreVec<float, V>(dst + i, v);
}

}  // namespace

absl::Status ConvertToFloat32(const KernelCtx& ctx, float* dst, const void* src, int64_t n) {
  SHARDTRAIN_RETURN_IF_ERROR(CheckConvert("ConvertToFloat32", dst, src, n));
  if (n == 0) return absl::OkStatus();
  return internal::DispatchDtype(ctx.dtype, [&](auto tag) {
    using F = typename decltype(tag)::type;
    return internal::LaunchElementwise<F, kThreads>(
        "ConvertToFloat32", n, true, {dst, src}, [&](auto v, int blocks) {
          ToFloat32Kernel<F, decltype(v)::value>
              <<<blocks, kThreads, 0, ctx.stream>>>(dst, static_cast<const F*>(src), n);
        });
  });
}

}  // namespace shardtrain::engine::cuda
