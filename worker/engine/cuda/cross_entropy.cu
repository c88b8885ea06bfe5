// Fused softmax + cross-entropy over the real vocabulary, forward and
// backward (kernels.h; the CPU twin is engine/cpu/layers.cc).
#include <cmath>

#include "absl/strings/str_cat.h"
#include "worker/engine/cuda/kernel_util.cuh"
#include "worker/engine/cuda/kernels.h"

namespace shardtrain::engine::cuda {
namespace {

using internal::BlockMax;
using internal::BlockSum;
using internal::Load;
using internal::Store;

constexpr int kThreads = 256;  // a multiple of 32 (the block reductions)

absl::Status CheckCrossEntropySizes(const char* kernel, int N, int V, int Vp) {
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckNonNegative(kernel, "N", N));
  if (V < 1 || Vp < V) {
    return absl::InvalidArgumentError(
        absl::StrCat(kernel, ": need 1 <= V <= Vp, got V ", V, " and Vp ", Vp));
  }
  return absl::OkStatus();
}

// One block per row of logits (N,Vp), over columns [0,V): lse = max +
// log Σ exp(logit - max) (fixed-order block reductions, fp32); losses =
// lse - logit[target], NaN for a target outside [0,V); no loss when targets
// is null.
template <typename F>
__global__ void CrossEntropyForwardKernel(float* losses, float* lse, const F* logits,
                                          const int* targets, int N, int V, int Vp) {
  const int row = blockIdx.x;
  if (row >= N) return;  // the whole block leaves together
  const F* l = logits + int64_t{row} * Vp;
  float max_v = -INFINITY;
  for (int j = threadIdx.x; j < V; j += blockDim.x) max_v = fmaxf(max_v, Load(l[j]));
  max_v = BlockMax(max_v);
  float sum = 0.0f;
  for (int j = threadIdx.x; j < V; j += blockDim.x) sum += expf(Load(l[j]) - max_v);
  sum = BlockSum(sum);
  if (threadIdx.x == 0) {
    const float row_lse = max_v + logf(sum);
    lse[row] = row_lse;
    if (targets != nullptr) {
      const int t = targets[row];
      losses[row] = t >= 0 && t < V ? row_lse - Load(l[t]) : NAN;
    }
  }
}

}  // namespace

// logits (N,Vp), columns [0,V) read; targets (N) (may be null: lse only);
// losses (N, fp32) = lse - logit[target]; saves lse (N, fp32).
absl::Status CrossEntropyForward(const KernelCtx& ctx, float* losses, float* lse,
                                 const void* logits, const int* targets, int N, int V, int Vp) {
  constexpr const char* kName = "CrossEntropyForward";
  SHARDTRAIN_RETURN_IF_ERROR(CheckCrossEntropySizes(kName, N, V, Vp));
  if (N == 0) return absl::OkStatus();
  return internal::DispatchDtype(ctx.dtype, [&](auto tag) {
    using F = typename decltype(tag)::type;
    CrossEntropyForwardKernel<F><<<N, kThreads, 0, ctx.stream>>>(
        losses, lse, static_cast<const F*>(logits), targets, N, V, Vp);
    return internal::CheckLaunch(kName);
  });
}

namespace {

// One thread per element (i, j) of logits (N,Vp), in place: (softmax_j -
// 1{j == targets[i]}) · dloss for j < V, 0 for the padding j >= V.
template <typename F>
__global__ void CrossEntropyBackwardKernel(F* logits, const float* lse, const int* targets,
                                           float dloss, int N, int V, int Vp) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= int64_t{N} * Vp) return;
  const int64_t row = i / Vp;
  const int j = static_cast<int>(i % Vp);
  float g = 0.0f;
  if (j < V) {
    g = expf(Load(logits[i]) - lse[row]) * dloss;
    if (j == targets[row]) g -= dloss;  // as the CPU: p·dloss - dloss
  }
  logits[i] = Store<F>(g);
}

}  // namespace

// In place on logits (N,Vp): dL/dlogits for L = dloss · Σ losses; the
// padding columns [V,Vp) become 0. Uses lse and targets (N) from the forward.
absl::Status CrossEntropyBackward(const KernelCtx& ctx, void* logits, const float* lse,
                                  const int* targets, float dloss, int N, int V, int Vp) {
  constexpr const char* kName = "CrossEntropyBackward";
  SHARDTRAIN_RETURN_IF_ERROR(CheckCrossEntropySizes(kName, N, V, Vp));
  if (N == 0) return absl::OkStatus();
  const int64_t blocks = internal::BlocksFor(int64_t{N} * Vp, kThreads);
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckGrid(kName, blocks));
  return internal::DispatchDtype(ctx.dtype, [&](auto tag) {
    using F = typename decltype(tag)::type;
    CrossEntropyBackwardKernel<F><<<static_cast<int>(blocks), kThreads, 0, ctx.stream>>>(
        static_cast<F*>(logits), lse, targets, dloss, N, V, Vp);
    return internal::CheckLaunch(kName);
  });
}

}  // namespace shardtrain::engine::cuda
