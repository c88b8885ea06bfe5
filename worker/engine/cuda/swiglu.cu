// SwiGLU, Llama's MLP activation, forward and backward (kernels.h; the CPU
// twin is engine/cpu/layers.cc).
#include <limits>

#include "absl/strings/str_cat.h"
#include "worker/engine/cuda/kernel_util.cuh"
#include "worker/engine/cuda/kernels.h"

namespace shardtrain::engine::cuda {
namespace {

using internal::Load;
using internal::Store;

constexpr int kThreads = 256;

// Checks N, H and the grid over N·H threads; *n = N·H.
absl::Status CheckSwiGluSizes(const char* kernel, int N, int H, int64_t* n) {
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckNonNegative(kernel, "N", N));
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckNonNegative(kernel, "H", H));
  if (int64_t{2} * H > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(kernel, ": 2*H exceeds int32, H ", H));
  }
  *n = int64_t{N} * H;
  return internal::CheckGrid(kernel, internal::BlocksFor(*n, kThreads));
}

// One thread per V elements (r, i..i+V) of out (N,H): out[r,i] =
// silu(gate) · up with gate = inp[r, i], up = inp[r, H + i] (rows of 2H).
// V > 1 (16-byte accesses) when H is a multiple of V: a thread's run stays
// in one row's gate half and in its up half. The one-element kernel (V = 1)
// moved ~1.3 TB/s on an H200 (Llama 3.2 1B: 4.9 ms forward, 8.7 ms backward
// of 164 ms a step at B = 8).
template <typename F, int V>
__global__ void SwiGluForwardKernel(F* out, const F* inp, int64_t n, int H) {
  const int64_t e = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) * V;
  if (e >= n) return;
  const int64_t r = e / H;
  const int i = static_cast<int>(e % H);
  const F* gate = inp + r * 2 * H + i;
  float g[V], u[V], o[V];
  internal::LoadVec<F, V>(g, gate);
  internal::LoadVec<F, V>(u, gate + H);
#pragma unroll
  for (int j = 0; j < V; ++j) o[j] = g[j] / (1.0f + expf(-g[j])) * u[j];
  internal::StoreVec<F, V>(out + e, o);
}

// One thread per V elements of dout (N,H): dgate += dout · up ·
// σ(g)(1 + g(1 - σ(g))), dup += dout · silu(g), in dinp's row r of 2H.
template <typename F, int V>
__global__ void SwiGluBackwardKernel(F* dinp, const F* inp, const F* dout, int64_t n, int H) {
  const int64_t e = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) * V;
  if (e >= n) return;
  const int64_t r = e / H;
  const int i = static_cast<int>(e % H);
  const int64_t at = r * 2 * H + i;
  float g[V], u[V], d[V], dg[V], du[V];
  internal::LoadVec<F, V>(g, inp + at);
  internal::LoadVec<F, V>(u, inp + at + H);
  internal::LoadVec<F, V>(d, dout + e);
  internal::LoadVec<F, V>(dg, dinp + at);
  internal::LoadVec<F, V>(du, dinp + at + H);
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const float sig = 1.0f / (1.0f + expf(-g[j]));
    dg[j] += d[j] * u[j] * sig * (1.0f + g[j] * (1.0f - sig));
    du[j] += d[j] * g[j] * sig;
  }
  internal::StoreVec<F, V>(dinp + at, dg);
  internal::StoreVec<F, V>(dinp + at + H, du);
}

}  // namespace

// inp (N, 2H) = [gate | up]; out (N, H). Saves nothing (backward reads inp).
absl::Status SwiGluForward(const KernelCtx& ctx, void* out, const void* inp, int N, int H) {
  constexpr const char* kName = "SwiGluForward";
  int64_t n = 0;
  SHARDTRAIN_RETURN_IF_ERROR(CheckSwiGluSizes(kName, N, H, &n));
  if (n == 0) return absl::OkStatus();
  return internal::DispatchDtype(ctx.dtype, [&](auto tag) {
    using F = typename decltype(tag)::type;
    return internal::LaunchElementwise<F, kThreads>(
        kName, n, ctx.fused && H % internal::kPack<F> == 0, {out, inp}, [&](auto v, int blocks) {
          SwiGluForwardKernel<F, decltype(v)::value><<<blocks, kThreads, 0, ctx.stream>>>(
              static_cast<F*>(out), static_cast<const F*>(inp), n, H);
        });
  });
}

// dinp (N, 2H) += ; inp (N, 2H); dout (N, H).
absl::Status SwiGluBackward(const KernelCtx& ctx, void* dinp, const void* inp, const void* dout,
                            int N, int H) {
  constexpr const char* kName = "SwiGluBackward";
  int64_t n = 0;
  SHARDTRAIN_RETURN_IF_ERROR(CheckSwiGluSizes(kName, N, H, &n));
  if (n == 0) return absl::OkStatus();
  return internal::DispatchDtype(ctx.dtype, [&](auto tag) {
    using F = typename decltype(tag)::type;
    return internal::LaunchElementwise<F, kThreads>(
        kName, n, ctx.fused && H % internal::kPack<F> == 0, {dinp, inp, dout},
        [&](auto v, int blocks) {
          SwiGluBackwardKernel<F, decltype(v)::value><<<blocks, kThreads, 0, ctx.stream>>>(
              static_cast<F*>(dinp), static_cast<const F*>(inp), static_cast<const F*>(dout), n, H);
        });
  });
}

}  // namespace shardtrain::engine::cuda
