// The Mixture-of-Experts layers' kernels (kernels.h; the CPU twins are
// engine/cpu/moe_layers.cc): the router's scores, top-K choice and gates and
// their backward, the permutation of rows into expert blocks and back, and
// the gate-weighted combine. The experts' GEMMs are the engine's matmuls on
// each expert's block of rows.
#include <limits>

#include "absl/strings/str_cat.h"
#include "worker/engine/cuda/kernel_util.cuh"
#include "worker/engine/cuda/kernels.h"

namespace shardtrain::engine::cuda {
namespace {

using internal::Load;
using internal::Store;

constexpr int kThreads = 256;

absl::Status CheckExperts(const char* kernel, int N, int E, int K) {
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckNonNegative(kernel, "N", N));
  if (E < 1 || E > kMaxMoeExperts || K < 1 || K > E) {
    return absl::InvalidArgumentError(
        absl::StrCat(kernel, ": E ", E, " (1..", kMaxMoeExperts, ") and K ", K, " (1..E)"));
  }
  return internal::CheckGrid(kernel, internal::BlocksFor(N, kThreads));
}

absl::Status CheckRows(const char* kernel, int64_t rows, int C, int64_t* n) {
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckNonNegative(kernel, "rows", rows));
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckNonNegative(kernel, "C", C));
  *n = rows * C;
  return internal::CheckGrid(kernel, internal::BlocksFor(*n, kThreads));
}

// One thread per token: scores (softmax or sigmoid of the logits, in fp32),
// the K largest score + bias (ties to the lower expert), gates = their
// scores, renormalised when asked.
template <typename F>
__global__ void RouterForwardKernel(F* scores, int* experts, F* gates, const F* logits,
                                    const F* bias, int N, int E, int K, bool sigmoid, bool norm) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= N) return;
  float s[kMaxMoeExperts];
  const F* l = logits + int64_t{t} * E;
  if (sigmoid) {
    for (int e = 0; e < E; ++e) s[e] = 1.0f / (1.0f + expf(-Load(l[e])));
  } else {
    float maxv = Load(l[0]);
    for (int e = 1; e < E; ++e) maxv = fmaxf(maxv, Load(l[e]));
    float sum = 0;
    for (int e = 0; e < E; ++e) sum += expf(Load(l[e]) - maxv);
    const float lse = maxv + logf(sum);
    for (int e = 0; e < E; ++e) s[e] = expf(Load(l[e]) - lse);
  }
  for (int e = 0; e < E; ++e) scores[int64_t{t} * E + e] = Store<F>(s[e]);
  unsigned chosen[kMaxMoeExperts / 32] = {};
  float sum = 0;
  for (int k = 0; k < K; ++k) {
    int best = -1;
    float best_key = 0;
    for (int e = 0; e < E; ++e) {
      if (chosen[e / 32] & (1u << (e % 32))) continue;
      const float key = bias == nullptr ? s[e] : s[e] + Load(bias[e]);
      if (best < 0 || key > best_key) {  // strictly larger: a tie keeps the lower index
        best = e;
        best_key = key;
      }
    }
    chosen[best / 32] |= 1u << (best % 32);
    experts[int64_t{t} * K + k] = best;
    sum += s[best];
  }
  for (int k = 0; k < K; ++k) {
    const float g = s[experts[int64_t{t} * K + k]];
    gates[int64_t{t} * K + k] = Store<F>(norm ? g / sum : g);
  }
}

// One thread per token: dscores += the gates' gradient, then dlogits +=
// all of dscores through the softmax or sigmoid (RouterBackward's first
// part on the CPU).
template <typename F>
__global__ void RouterBackwardKernel(F* dlogits, F* dscores, const F* dgates, const F* scores,
                                     const int* experts, int N, int E, int K, bool sigmoid,
                                     bool norm) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= N) return;
  const F* s = scores + int64_t{t} * E;
  const int* ex = experts + int64_t{t} * K;
  const F* dg = dgates + int64_t{t} * K;
  float ds[kMaxMoeExperts];
  for (int e = 0; e < E; ++e) ds[e] = Load(dscores[int64_t{t} * E + e]);
  if (norm) {
    float sum = 0, dot = 0;
    for (int k = 0; k < K; ++k) sum += Load(s[ex[k]]);
    for (int k = 0; k < K; ++k) dot += Load(dg[k]) * Load(s[ex[k]]) / sum;
    for (int k = 0; k < K; ++k) ds[ex[k]] += (Load(dg[k]) - dot) / sum;
  } else {
    for (int k = 0; k < K; ++k) ds[ex[k]] += Load(dg[k]);
  }
  F* dl = dlogits + int64_t{t} * E;
  if (sigmoid) {
    for (int e = 0; e < E; ++e) {
      const float se = Load(s[e]);
      dl[e] = Store<F>(Load(dl[e]) + ds[e] * se * (1.0f - se));
    }
  } else {
    float dot = 0;
    for (int e = 0; e < E; ++e) dot += Load(s[e]) * ds[e];
    for (int e = 0; e < E; ++e) dl[e] = Store<F>(Load(dl[e]) + Load(s[e]) * (ds[e] - dot));
  }
  for (int e = 0; e < E; ++e) dscores[int64_t{t} * E + e] = Store<F>(ds[e]);
}

// One thread per element (i, c): dst[i] = src[index[i] / div].
template <typename F>
__global__ void GatherRowsKernel(F* dst, const F* src, const int* index, int64_t n, int C,
                                 int div) {
  const int64_t e = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (e >= n) return;
  const int64_t i = e / C;
  dst[e] = src[int64_t{index[i] / div} * C + e % C];
}

// One thread per element (i, c): dst[index[i]] = src[i].
template <typename F>
__global__ void ScatterRowsKernel(F* dst, const F* src, const int* index, int64_t n, int C) {
  const int64_t e = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (e >= n) return;
  const int64_t i = e / C;
  dst[int64_t{index[i]} * C + e % C] = src[e];
}

// One thread per element (t, c): out = Σ_k gates[t,k] · y[row of (t, k)]
// over the kept pairs, in slot order (add = false); or dx += Σ_k y[row]
// (add = true, gates null: the permutation's backward).
template <typename F>
__global__ void CombineKernel(F* out, const F* y, const F* gates, const int* row_of_pair, int64_t n,
                              int K, int C, bool add) {
  const int64_t e = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (e >= n) return;
  const int64_t t = e / C;
  const int c = static_cast<int>(e % C);
  float acc = add ? Load(out[e]) : 0.0f;
  for (int k = 0; k < K; ++k) {
    const int row = row_of_pair[t * K + k];
    if (row < 0) continue;
    const float v = Load(y[int64_t{row} * C + c]);
    acc += gates == nullptr ? v : Load(gates[t * K + k]) * v;
  }
  out[e] = Store<F>(acc);
}

// One warp per pair (t, k) kept: dy[row] += gate · dout[t], dgates[t,k] +=
// dout[t] · y[row] (a fixed-order warp sum).
template <typename F>
__global__ void CombineBackwardKernel(F* dy, F* dgates, const F* dout, const F* y, const F* gates,
                                      const int* row_of_pair, int pairs, int K, int C) {
  const int pair = (blockIdx.x * blockDim.x + threadIdx.x) / internal::kWarpSize;
  const int lane = threadIdx.x % internal::kWarpSize;
  if (pair >= pairs) return;
  const int row = row_of_pair[pair];
  if (row < 0) return;
  const int64_t t = pair / K;
  const float g = Load(gates[pair]);
  float dot = 0;
  for (int c = lane; c < C; c += internal::kWarpSize) {
    const float d = Load(dout[t * C + c]);
    const int64_t at = int64_t{row} * C + c;
    dot += d * Load(y[at]);
    dy[at] = Store<F>(Load(dy[at]) + g * d);
  }
  dot = internal::WarpSum(dot);
  if (lane == 0) dgates[pair] = Store<F>(Load(dgates[pair]) + dot);
}

}  // namespace

absl::Status MoeRouterForward(const KernelCtx& ctx, void* scores, int* experts, void* gates,
                              const void* logits, const void* bias, int N, int E, int K,
                              bool sigmoid, bool norm_topk_prob) {
  constexpr const char* kName = "MoeRouterForward";
  SHARDTRAIN_RETURN_IF_ERROR(CheckExperts(kName, N, E, K));
  if (N == 0) return absl::OkStatus();
  return internal::DispatchDtype(ctx.dtype, [&](auto tag) {
    using F = typename decltype(tag)::type;
    const int blocks = static_cast<int>(internal::BlocksFor(N, kThreads));
    RouterForwardKernel<F><<<blocks, kThreads, 0, ctx.stream>>>(
        static_cast<F*>(scores), experts, static_cast<F*>(gates), static_cast<const F*>(logits),
        static_cast<const F*>(bias), N, E, K, sigmoid, norm_topk_prob);
    return internal::CheckLaunch(kName);
  });
}

absl::Status MoeRouterBackward(const KernelCtx& ctx, void* dlogits, void* dscores,
                               const void* dgates, const void* scores, const int* experts, int N,
                               int E, int K, bool sigmoid, bool norm_topk_prob) {
  constexpr const char* kName = "MoeRouterBackward";
  SHARDTRAIN_RETURN_IF_ERROR(CheckExperts(kName, N, E, K));
  if (N == 0) return absl::OkStatus();
  return internal::DispatchDtype(ctx.dtype, [&](auto tag) {
    using F = typename decltype(tag)::type;
    const int blocks = static_cast<int>(internal::BlocksFor(N, kThreads));
    RouterBackwardKernel<F><<<blocks, kThreads, 0, ctx.stream>>>(
        static_cast<F*>(dlogits), static_cast<F*>(dscores), static_cast<const F*>(dgates),
        static_cast<const F*>(scores), experts, N, E, K, sigmoid, norm_topk_prob);
    return internal::CheckLaunch(kName);
  });
}

absl::Status MoeGatherRows(const KernelCtx& ctx, void* dst, const void* src, const int* index,
                           int rows, int C, int div) {
  constexpr const char* kName = "MoeGatherRows";
  int64_t n = 0;
  SHARDTRAIN_RETURN_IF_ERROR(CheckRows(kName, rows, C, &n));
  if (div < 1) return absl::InvalidArgumentError(absl::StrCat(kName, ": div ", div));
  if (n == 0) return absl::OkStatus();
  return internal::DispatchDtype(ctx.dtype, [&](auto tag) {
    using F = typename decltype(tag)::type;
    const int blocks = static_cast<int>(internal::BlocksFor(n, kThreads));
    GatherRowsKernel<F><<<blocks, kThreads, 0, ctx.stream>>>(
        static_cast<F*>(dst), static_cast<const F*>(src), index, n, C, div);
    return internal::CheckLaunch(kName);
  });
}

absl::Status MoeScatterRows(const KernelCtx& ctx, void* dst, const void* src, const int* index,
                            int rows, int C) {
  constexpr const char* kName = "MoeScatterRows";
  int64_t n = 0;
  SHARDTRAIN_RETURN_IF_ERROR(CheckRows(kName, rows, C, &n));
  if (n == 0) return absl::OkStatus();
  return internal::DispatchDtype(ctx.dtype, [&](auto tag) {
    using F = typename decltype(tag)::type;
    const int blocks = static_cast<int>(internal::BlocksFor(n, kThreads));
    ScatterRowsKernel<F><<<blocks, kThreads, 0, ctx.stream>>>(
        static_cast<F*>(dst), static_cast<const F*>(src), index, n, C);
    return internal::CheckLaunch(kName);
  });
}

namespace {

// CombineKernel over N·C elements: the combine (gates) or the permutation's
// backward (add, no gates).
absl::Status LaunchCombine(const char* name, const KernelCtx& ctx, void* out, const void* y,
                           const void* gates, const int* row_of_pair, int N, int K, int C,
                           bool add) {
  int64_t n = 0;
  SHARDTRAIN_RETURN_IF_ERROR(CheckRows(name, N, C, &n));
  if (n == 0) return absl::OkStatus();
  return internal::DispatchDtype(ctx.dtype, [&](auto tag) {
    using F = typename decltype(tag)::type;
    const int blocks = static_cast<int>(internal::BlocksFor(n, kThreads));
    CombineKernel<F><<<blocks, kThreads, 0, ctx.stream>>>(
        static_cast<F*>(out), static_cast<const F*>(y), static_cast<const F*>(gates), row_of_pair,
        n, K, C, add);
    return internal::CheckLaunch(name);
  });
}

}  // namespace

absl::Status MoeCombineForward(const KernelCtx& ctx, void* out, const void* y, const void* gates,
                               const int* row_of_pair, int N, int K, int C) {
  return LaunchCombine("MoeCombineForward", ctx, out, y, gates, row_of_pair, N, K, C,
                       /*add=*/false);
}

absl::Status MoePermuteBackward(const KernelCtx& ctx, void* dx, const void* dxp,
                                const int* row_of_pair, int N, int K, int C) {
  return LaunchCombine("MoePermuteBackward", ctx, dx, dxp, nullptr, row_of_pair, N, K, C,
                       /*add=*/true);
}

absl::Status MoeCombineBackward(const KernelCtx& ctx, void* dy, void* dgates, const void* dout,
                                const void* y, const void* gates, const int* row_of_pair, int N,
                                int K, int C) {
  constexpr const char* kName = "MoeCombineBackward";
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckNonNegative(kName, "N", N));
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckNonNegative(kName, "C", C));
  const int64_t pairs = int64_t{N} * K, threads = pairs * internal::kWarpSize;
  if (pairs > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(kName, ": N·K ", pairs, " exceeds int32"));
  }
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckGrid(kName, internal::BlocksFor(threads, kThreads)));
  if (pairs == 0 || C == 0) return absl::OkStatus();
  return internal::DispatchDtype(ctx.dtype, [&](auto tag) {
    using F = typename decltype(tag)::type;
    const int blocks = static_cast<int>(internal::BlocksFor(threads, kThreads));
    CombineBackwardKernel<F><<<blocks, kThreads, 0, ctx.stream>>>(
        static_cast<F*>(dy), static_cast<F*>(dgates), static_cast<const F*>(dout),
        static_cast<const F*>(y), static_cast<const F*>(gates), row_of_pair,
        static_cast<int>(pairs), K, C);
    return internal::CheckLaunch(kName);
  });
}

}  // namespace shardtrain::engine::cuda
