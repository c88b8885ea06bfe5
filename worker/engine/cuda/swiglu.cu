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

// One thread per element (r, i) of out (N,H): out[r,i] = silu(gate) · up
// with gate = inp[r, i], up = inp[r, H + i] (rows of 2H).
template <typename F>
__global__ void SwiGluForwardKernel(F* out, const F* inp, int64_t n, int H) {
  const int64_t e = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (e >= n) return;
  const int64_t r = e / H;
  const int i = static_cast<int>(e % H);
  const F* gate = inp + r * 2 * H;
  const float g = Load(gate[i]), u = Load(gate[H + i]);
  out[e] = Store<F>(g / (1.0f + expf(-g)) * u);
}

// One thread per element (r, i) of dout (N,H): dgate += dout · up ·
// σ(g)(1 + g(1 - σ(g))), dup += dout · silu(g), in dinp's row r of 2H.
template <typename F>
__global__ void SwiGluBackwardKernel(F* dinp, const F* inp, const F* dout, int64_t n, int H) {
  const int64_t e = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (e >= n) return;
  const int64_t r = e / H;
  const int i = static_cast<int>(e % H);
  const int64_t at = r * 2 * H + i;
  const float g = Load(inp[at]), u = Load(inp[at + H]), d = Load(dout[e]);
  const float sig = 1.0f / (1.0f + expf(-g));
  const float silu = g * sig;
  dinp[at] = Store<F>(Load(dinp[at]) + d * u * sig * (1.0f + g * (1.0f - sig)));
  dinp[at + H] = Store<F>(Load(dinp[at + H]) + d * silu);
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
    const int blocks = static_cast<int>(internal::BlocksFor(n, kThreads));
    SwiGluForwardKernel<F><<<blocks, kThreads, 0, ctx.stream>>>(static_cast<F*>(out),
                                                                static_cast<const F*>(inp), n, H);
    return internal::CheckLaunch(kName);
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
    const int blocks = static_cast<int>(internal::BlocksFor(n, kThreads));
    SwiGluBackwardKernel<F><<<blocks, kThreads, 0, ctx.stream>>>(
        static_cast<F*>(dinp), static_cast<const F*>(inp), static_cast<const F*>(dout), n, H);
    return internal::CheckLaunch(kName);
  });
}

}  // namespace shardtrain::engine::cuda
