// Fused softmax + cross-entropy over the real vocabulary, forward and
// backward (kernels.h; the CPU twin is engine/cpu/layers.cc).
#include <cmath>
#include <type_traits>

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

// launch(std::bool_constant<packed>) runs a row-per-block kernel over
// logits rows of Vp elements: packed (16-byte accesses) when the rows are
// whole int4s and logits is 16-byte aligned.
template <typename F, typename Launch>
absl::Status LaunchRows(const char* name, const void* logits, int Vp, Launch&& launch) {
  if (internal::Packable(Vp, sizeof(F), {logits})) {
    launch(std::true_type{});
  } else {
    launch(std::false_type{});
  }
  return internal::CheckLaunch(name);
}

// The block's row of logits l, columns [0,V): lse = max + log Σ exp(logit -
// max), each thread keeping a running max and sum of its columns (an online
// softmax: one pass over the row, 16-byte loads when kPacked), then
// fixed-order block reductions (fp32). Every thread gets the row's lse.
template <typename F, bool kPacked>
__device__ __forceinline__ float RowLse(const F* l, int V) {
  float m = -INFINITY, sum = 0.0f;
  auto add = [&](float x) {
    if (x > m) {
      sum = sum * expf(m - x) + 1.0f;
      m = x;
    } else {
      sum += expf(x - m);
    }
  };
  int tail = 0;  // the first column of the scalar tail
  if constexpr (kPacked) {
    constexpr int kPack = internal::kPack<F>;
    tail = V / kPack * kPack;
    const int4* packs = reinterpret_cast<const int4*>(l);
    // Unrolled: four packs' loads in flight before their exps (the adds
    // depend on each other, the loads do not).
#pragma unroll 4
    for (int p = threadIdx.x; p < V / kPack; p += blockDim.x) {
      const int4 raw = packs[p];
      const F* x = reinterpret_cast<const F*>(&raw);
#pragma unroll
      for (int j = 0; j < kPack; ++j) add(Load(x[j]));
    }
  }
  for (int j = tail + threadIdx.x; j < V; j += blockDim.x) add(Load(l[j]));
  const float max_v = BlockMax(m);
  sum = BlockSum(m == -INFINITY ? 0.0f : sum * expf(m - max_v));
  return max_v + logf(sum);
}

// Thread 0's part after RowLse: lse[row], and losses[row] = lse -
// logit[target] (NaN for a target outside [0,V); none when targets is null).
template <typename F>
__device__ __forceinline__ void StoreRowLoss(float* losses, float* lse, const F* l,
                                             const int* targets, int row, float row_lse, int V) {
  if (threadIdx.x != 0) return;
  lse[row] = row_lse;
  if (targets != nullptr) {
    const int t = targets[row];
    losses[row] = t >= 0 && t < V ? row_lse - Load(l[t]) : NAN;
  }
}

// One block per row of logits (N,Vp): RowLse and StoreRowLoss.
template <typename F, bool kPacked>
__global__ void CrossEntropyForwardKernel(float* losses, float* lse, const F* logits,
                                          const int* targets, int N, int V, int Vp) {
  const int row = blockIdx.x;
  if (row >= N) return;  // the whole block leaves together
  const F* l = logits + int64_t{row} * Vp;
  StoreRowLoss(losses, lse, l, targets, row, RowLse<F, kPacked>(l, V), V);
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
    return LaunchRows<F>(kName, logits, Vp, [&](auto packed) {
      CrossEntropyForwardKernel<F, decltype(packed)::value><<<N, kThreads, 0, ctx.stream>>>(
          losses, lse, static_cast<const F*>(logits), targets, N, V, Vp);
    });
  });
}

namespace {

// (softmax_j - 1{j == target}) · dloss for j < V, 0 for the padding j >= V.
template <typename F>
__device__ __forceinline__ float CrossEntropyGrad(float logit, int j, float row_lse, int target,
                                                  float dloss, int V) {
  if (j >= V) return 0.0f;
  const float g = expf(logit - row_lse) * dloss;
  return j == target ? g - dloss : g;  // as the CPU: p·dloss - dloss
}
// The block's row l (Vp columns) in place becomes its gradient; 16-byte
// accesses when kPacked.
template <typename F, bool kPacked>
__device__ __forceinline__ void WriteRowGrad(F* l, float row_lse, int target, float dloss, int V,
                                             int Vp) {
  if constexpr (kPacked) {
    constexpr int kPack = internal::kPack<F>;
    int4* packs = reinterpret_cast<int4*>(l);
    for (int p = threadIdx.x; p < Vp / kPack; p += blockDim.x) {
      int4 raw = packs[p];
      F* x = reinterpret_cast<F*>(&raw);
#pragma unroll
      for (int j = 0; j < kPack; ++j) {
        x[j] = Store<F>(CrossEntropyGrad<F>(Load(x[j]), p * kPack + j, row_lse, target, dloss, V));
      }
      packs[p] = raw;
    }
  } else {
    for (int j = threadIdx.x; j < Vp; j += blockDim.x) {
      l[j] = Store<F>(CrossEntropyGrad<F>(Load(l[j]), j, row_lse, target, dloss, V));
    }
  }
}

// One block per row of logits (N,Vp), in place: WriteRowGrad from the
// forward's lse.
template <typename F, bool kPacked>
__global__ void CrossEntropyBackwardKernel(F* logits, const float* lse, const int* targets,
                                           float dloss, int N, int V, int Vp) {
  const int row = blockIdx.x;
  if (row >= N) return;
  WriteRowGrad<F, kPacked>(logits + int64_t{row} * Vp, lse[row], targets[row], dloss, V, Vp);
}

// Both in one launch, a block of kFusedThreads per row: RowLse and
// StoreRowLoss, then WriteRowGrad. The row is read twice, the second time
// just after the first by the same block: with 1024-thread blocks (two per
// SM) the rows in flight (~26 MB on an H100 at V = 50257) stay in its
// 50 MB L2, so the logits cross the memory bus once each way instead of
// three times.
constexpr int kFusedThreads = 1024;
template <typename F, bool kPacked>
__global__ void __launch_bounds__(kFusedThreads)
    CrossEntropyFusedKernel(float* losses, float* lse, F* logits, const int* targets, float dloss,
                            int N, int V, int Vp) {
  const int row = blockIdx.x;
  if (row >= N) return;
  F* l = logits + int64_t{row} * Vp;
  const float row_lse = RowLse<F, kPacked>(l, V);
  StoreRowLoss(losses, lse, l, targets, row, row_lse, V);
  __syncthreads();  // every thread read the row (and thread 0 its target's logit)
  WriteRowGrad<F, kPacked>(l, row_lse, targets[row], dloss, V, Vp);
}

}  // namespace

// In place on logits (N,Vp): dL/dlogits for L = dloss · Σ losses; the
// padding columns [V,Vp) become 0. Uses lse and targets (N) from the forward.
absl::Status CrossEntropyBackward(const KernelCtx& ctx, void* logits, const float* lse,
                                  const int* targets, float dloss, int N, int V, int Vp) {
  constexpr const char* kName = "CrossEntropyBackward";
  SHARDTRAIN_RETURN_IF_ERROR(CheckCrossEntropySizes(kName, N, V, Vp));
  if (N == 0) return absl::OkStatus();
  return internal::DispatchDtype(ctx.dtype, [&](auto tag) {
    using F = typename decltype(tag)::type;
    return LaunchRows<F>(kName, logits, Vp, [&](auto packed) {
      CrossEntropyBackwardKernel<F, decltype(packed)::value>
          <<<N, kThreads, 0, ctx.stream>>>(static_cast<F*>(logits), lse, targets, dloss, N, V, Vp);
    });
  });
}

absl::Status CrossEntropyForwardBackward(const KernelCtx& ctx, float* losses, float* lse,
                                         void* logits, const int* targets, float dloss, int N,
                                         int V, int Vp) {
  constexpr const char* kName = "CrossEntropyForwardBackward";
  SHARDTRAIN_RETURN_IF_ERROR(CheckCrossEntropySizes(kName, N, V, Vp));
  if (targets == nullptr)
    return absl::InvalidArgumentError("CrossEntropyForwardBackward: no targets");
  if (N == 0) return absl::OkStatus();
  return internal::DispatchDtype(ctx.dtype, [&](auto tag) {
    using F = typename decltype(tag)::type;
    return LaunchRows<F>(kName, logits, Vp, [&](auto packed) {
      CrossEntropyFusedKernel<F, decltype(packed)::value><<<N, kFusedThreads, 0, ctx.stream>>>(
          losses, lse, static_cast<F*>(logits), targets, dloss, N, V, Vp);
    });
  });
}

}  // namespace shardtrain::engine::cuda
