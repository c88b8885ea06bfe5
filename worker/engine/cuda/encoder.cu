// Encoder: token + position embedding, forward and backward (kernels.h; the
// CPU twin is engine/cpu/layers.cc).
#include <algorithm>
#include <limits>
#include <vector>

#include "worker/engine/cuda/kernel_util.cuh"
#include "worker/engine/cuda/kernels.h"

namespace shardtrain::engine::cuda {
namespace {

using internal::Load;
using internal::Store;

constexpr int kThreads = 256;

// Checks B, T, C >= 0; sets *n = B*T*C.
absl::Status CheckEncoderSizes(const char* kernel, int B, int T, int C, int64_t* n) {
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckNonNegative(kernel, "B", B));
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckNonNegative(kernel, "T", T));
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckNonNegative(kernel, "C", C));
  *n = int64_t{B} * T * C;
  return absl::OkStatus();
}

// One thread per output element (b, t, c) of out (B,T,C): out[b,t,c] =
// wte[tokens[b,t] - v0, c] (0 outside [0, real)) + wpe[pos[t], c] (0 when
// null; pos null: t).
template <typename F>
__global__ void EncoderForwardKernel(F* out, const int* tokens, const F* wte, const F* wpe, int v0,
                                     int real, int B, int T, int C, const int* pos) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= int64_t{B} * T * C) return;
  const int64_t row = i / C;  // b * T + t
  const int c = static_cast<int>(i % C);
  const int t = pos != nullptr ? pos[row % T] : static_cast<int>(row % T);
  const int64_t token = int64_t{tokens[row]} - v0;
  float x = token >= 0 && token < real ? Load(wte[token * C + c]) : 0.0f;
  if (wpe != nullptr) x += Load(wpe[int64_t{t} * C + c]);
  out[i] = Store<F>(x);
}

}  // namespace

// out (B,T,C) = wte (Vp,C)[tokens (B,T)] + wpe (context,C)[t] (wpe null:
// wte alone). Saves nothing.
absl::Status EncoderForward(const KernelCtx& ctx, void* out, const int* tokens, const void* wte,
                            const void* wpe, int B, int T, int C) {
  return EncoderForwardShard(ctx, out, tokens, wte, wpe, 0, std::numeric_limits<int>::max(), B, T,
                             C);
}

absl::Status EncoderForwardShard(const KernelCtx& ctx, void* out, const int* tokens,
                                 const void* wte_shard, const void* wpe, int v0, int real, int B,
                                 int T, int C, const int* pos) {
  constexpr const char* kName = "EncoderForward";
  int64_t n = 0;
  SHARDTRAIN_RETURN_IF_ERROR(CheckEncoderSizes(kName, B, T, C, &n));
  if (n == 0) return absl::OkStatus();
  const int64_t blocks = internal::BlocksFor(n, kThreads);
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckGrid(kName, blocks));
  return internal::DispatchDtype(ctx.dtype, [&](auto tag) {
    using F = typename decltype(tag)::type;
    EncoderForwardKernel<F><<<static_cast<int>(blocks), kThreads, 0, ctx.stream>>>(
        static_cast<F*>(out), tokens, static_cast<const F*>(wte_shard), static_cast<const F*>(wpe),
        v0, real, B, T, C, pos);
    return internal::CheckLaunch(kName);
  });
}

namespace {

// dwte[tokens[r], c] += dout[r, c] for every row r, in row order per token
// (the CPU's order: same bits run after run, no atomics). The reference
// for the bucketed kernel below (the engine's path), which needs the rows
// grouped on the host; this one needs nothing but the tokens. A warp per tile
// of 32 channels and token class k: it reads the B*T tokens 32 at a time
// (a lane each), and a ballot names the rows whose token ≡ k (mod
// kTokenClasses), which the warp then adds in row order; no two warps write
// one element. Grid: (channel tiles, kTokenClasses / warps per block).
constexpr int kTokenClasses = 64;
constexpr int kClassWarps = 8;  // token classes per block (blockDim.y)
// Tokens outside this rank's rows [v0, v0 + real) are skipped.
template <typename F>
__global__ void EncoderBackwardWteKernel(float* dwte, const F* dout, const int* tokens, int v0,
                                         int real, int rows, int C) {
  const int lane = threadIdx.x;
  const int c = blockIdx.x * internal::kWarpSize + lane;
  const int token_class = blockIdx.y * kClassWarps + threadIdx.y;
  for (int base = 0; base < rows; base += internal::kWarpSize) {
    const int r = base + lane;
    const int64_t token = r < rows ? int64_t{tokens[r]} - v0 : -1;
    const bool mine = token >= 0 && token < real && token % kTokenClasses == token_class;
    for (unsigned m = __ballot_sync(internal::kFullMask, mine); m != 0; m &= m - 1) {
      const int j = __ffs(m) - 1;  // the lowest row first: row order
      const int64_t t = __shfl_sync(internal::kFullMask, token, j);
      if (c < C) dwte[t * C + c] += Load(dout[int64_t{base + j} * C + c]);
    }
  }
}

// A block per (bucket, 256 channels): dwte[token, c] += dout[r, c] over the
// bucket's rows r in row order (TokenBuckets), each row read once; the rows
// are loaded kUnroll at a time and added in order (the same bits as the
// scan above, which adds in row order too). No two blocks write one
// element: every token has one bucket.
constexpr int kBucketThreads = 256;
constexpr int kUnroll = 4;
template <typename F>
__global__ void EncoderBackwardWteBucketsKernel(float* dwte, const F* dout, const int* tokens,
                                                const int* data, int buckets, int v0, int C) {
  const int g = blockIdx.x;
  const int c = blockIdx.y * kBucketThreads + threadIdx.x;
  if (c >= C) return;
  const int first = data[g], size = data[buckets + g];
  const int* rows = data + 2 * buckets + first;
  float* w = dwte + (int64_t{tokens[rows[0]]} - v0) * C + c;
  float acc = *w;
  int i = 0;
  for (; i + kUnroll <= size; i += kUnroll) {
    float x[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) x[u] = Load(dout[int64_t{rows[i + u]} * C + c]);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc += x[u];
  }
  for (; i < size; ++i) acc += Load(dout[int64_t{rows[i]} * C + c]);
  *w = acc;
}

// One thread per element (t, c) of the T columns: dwpe[pos[t], c] (pos
// null: t) += dout[b, t, c] for b = 0..B-1 in order (the positions are
// distinct: no two threads write one element).
template <typename F>
__global__ void EncoderBackwardWpeKernel(float* dwpe, const F* dout, int B, int T, int C,
                                         const int* pos) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= int64_t{T} * C) return;
  const int64_t t = i / C, c = i % C;
  float* w = dwpe + (pos != nullptr ? int64_t{pos[t]} : t) * C + c;
  float acc = *w;
  for (int b = 0; b < B; ++b) acc += Load(dout[int64_t{b} * T * C + i]);
  *w = acc;
}

}  // namespace

// dwte (Vp,C, fp32) += scatter of dout (B,T,C) rows by token; dwpe (first T
// rows of (context,C), fp32) += sum over B (skipped when null).
absl::Status EncoderBackward(const KernelCtx& ctx, float* dwte, float* dwpe, const void* dout,
                             const int* tokens, int B, int T, int C) {
  return EncoderBackwardShard(ctx, dwte, dwpe, dout, tokens, 0, std::numeric_limits<int>::max(), B,
                              T, C);
}

int BuildTokenBuckets(const int* tokens, int n, int v0, int real, std::vector<int>* out,
                      std::vector<int>* counts) {
  // Counting by token (ids relative to v0, those kept below `span`).
  int span = 0;
  for (int r = 0; r < n; ++r) {
    const int64_t t = int64_t{tokens[r]} - v0;
    if (t >= 0 && t < real) span = std::max(span, static_cast<int>(t) + 1);
  }
  counts->assign(span, 0);
  int kept = 0;
  for (int r = 0; r < n; ++r) {
    const int64_t t = int64_t{tokens[r]} - v0;
    if (t >= 0 && t < span) ++(*counts)[t], ++kept;
  }
  std::vector<int> ids;  // the tokens kept, largest count first (ties: smaller id)
  for (int t = 0; t < span; ++t) {
    if ((*counts)[t] > 0) ids.push_back(t);
  }
  std::stable_sort(ids.begin(), ids.end(),
                   [&](int a, int b) { return (*counts)[a] > (*counts)[b]; });
  const int buckets = static_cast<int>(ids.size());
  out->assign(size_t{2} * buckets + kept, 0);
  int* first = out->data();
  int* size = first + buckets;
  int* rows = size + buckets;
  // counts becomes each token's next slot in rows.
  int at = 0;
  for (int g = 0; g < buckets; ++g) {
    first[g] = at;
    size[g] = (*counts)[ids[g]];
    (*counts)[ids[g]] = at;
    at += size[g];
  }
  for (int r = 0; r < n; ++r) {  // row order within each bucket
    const int64_t t = int64_t{tokens[r]} - v0;
    if (t >= 0 && t < span) rows[(*counts)[t]++] = r;
  }
  return buckets;
}

absl::Status EncoderBackwardShard(const KernelCtx& ctx, float* dwte, float* dwpe, const void* dout,
                                  const int* tokens, int v0, int real, int B, int T, int C,
                                  const int* pos, const TokenBuckets* buckets) {
  constexpr const char* kName = "EncoderBackward";
  int64_t n = 0;
  SHARDTRAIN_RETURN_IF_ERROR(CheckEncoderSizes(kName, B, T, C, &n));
  if (n == 0) return absl::OkStatus();
  const int64_t rows = int64_t{B} * T;
  if (rows > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError("EncoderBackward: B*T exceeds int32");
  }
  const int64_t wpe_blocks = internal::BlocksFor(int64_t{T} * C, kThreads);
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckGrid(kName, wpe_blocks));
  return internal::DispatchDtype(ctx.dtype, [&](auto tag) {
    using F = typename decltype(tag)::type;
    const F* d = static_cast<const F*>(dout);
    if (buckets != nullptr) {
      if (buckets->count > 0) {
        const dim3 grid(static_cast<unsigned>(buckets->count),
                        static_cast<unsigned>(internal::BlocksFor(C, kBucketThreads)));
        EncoderBackwardWteBucketsKernel<F><<<grid, kBucketThreads, 0, ctx.stream>>>(
            dwte, d, tokens, buckets->data, buckets->count, v0, C);
        SHARDTRAIN_RETURN_IF_ERROR(internal::CheckLaunch("EncoderBackward (dwte by token)"));
      }
    } else {
      const dim3 wte_grid(static_cast<unsigned>(internal::BlocksFor(C, internal::kWarpSize)),
                          kTokenClasses / kClassWarps);
      EncoderBackwardWteKernel<F>
          <<<wte_grid, dim3(internal::kWarpSize, kClassWarps), 0, ctx.stream>>>(
              dwte, d, tokens, v0, real, static_cast<int>(rows), C);
      SHARDTRAIN_RETURN_IF_ERROR(internal::CheckLaunch("EncoderBackward (dwte)"));
    }
    if (dwpe == nullptr) return absl::OkStatus();  // no learned positions
    EncoderBackwardWpeKernel<F>
        <<<static_cast<int>(wpe_blocks), kThreads, 0, ctx.stream>>>(dwpe, d, B, T, C, pos);
    return internal::CheckLaunch("EncoderBackward (dwpe)");
  });
}

}  // namespace shardtrain::engine::cuda
