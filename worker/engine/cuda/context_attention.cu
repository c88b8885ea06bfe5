// Attention by blocks of keys, for context parallelism's ring (kernels.h;
// the CPU twins are engine/cpu/layers.cc's functions of the same names).
// Plain kernels: one warp per query row (forward, the row terms, the
// queries' gradient) or per key row (the keys' and values' gradients), each
// summing in a fixed order, so results are deterministic without atomics.
// They are the reference the ring's fused kernels will be measured against.
#include <limits>

#include "absl/strings/str_cat.h"
#include "worker/engine/cuda/kernel_util.cuh"
#include "worker/engine/cuda/kernels.h"

namespace shardtrain::engine::cuda {
namespace {

using internal::kWarpSize;
using internal::Load;
using internal::Store;
using internal::WarpMax;
using internal::WarpSum;

constexpr int kThreads = 256;  // 8 warps per block
constexpr int kWarps = kThreads / kWarpSize;

// The shapes every kernel reads.
struct Shape {
  int B, Tq, Tk, C, NH, KVH, hs, KV, W;  // W = C + 2·KV: a row of qkv
  float scale;
};

Shape MakeShape(int B, int Tq, int Tk, int C, int NH, int KVH) {
  const int hs = C / NH;
  return Shape{B, Tq, Tk, C, NH, KVH, hs, KVH * hs, C + 2 * KVH * hs, 1.0f / sqrtf(float(hs))};
}

// The (sequence, head, row) of query row `row` of the B·NH·Tq rows.
struct QueryRow {
  int b, h, i;
};
__device__ __forceinline__ QueryRow QueryRowOf(int64_t row, const Shape& s) {
  return QueryRow{static_cast<int>(row / (int64_t{s.Tq} * s.NH)),
                  static_cast<int>((row / s.Tq) % s.NH), static_cast<int>(row % s.Tq)};
}

// One warp per (b, h, i): the scores of row i against the block's keys
// (masked by position), its softmax and output, merged into (out, lse).
template <typename F>
__global__ void BlockForwardKernel(F* out, float* lse, F* blk_out, float* blk_lse, F* scores,
                                   const F* qkv, const F* kv, const int* pos_q, const int* pos_k,
                                   Shape s, bool first) {
  const int64_t row = int64_t{blockIdx.x} * kWarps + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= int64_t{s.B} * s.NH * s.Tq) return;
  const QueryRow qr = QueryRowOf(row, s);
  const int b = qr.b, h = qr.h, i = qr.i;
  const int group = s.NH / s.KVH;
  const F* q = qkv + (int64_t{b} * s.Tq + i) * s.W + h * s.hs;
  const F* k0 = kv + int64_t{b} * s.Tk * 2 * s.KV + (h / group) * s.hs;
  F* sc = scores + row * s.Tk;
  const int pq = pos_q[i];
  // The scaled score of key j in fp32 (-inf where masked), computed twice
  // (for the max, then for the exponent) rather than rounded to F between:
  // the row's logsumexp stays fp32-exact for the ring's merge.
  auto score = [&](int j) {
    if (pos_k[j] > pq) return -INFINITY;
    const F* k = k0 + int64_t{j} * 2 * s.KV;
    float dot = 0;
    for (int c = 0; c < s.hs; ++c) dot += Load(q[c]) * Load(k[c]);
    return dot * s.scale;
  };
  float maxv = -INFINITY;
  for (int j = lane; j < s.Tk; j += kWarpSize) maxv = fmaxf(maxv, score(j));
  maxv = WarpMax(maxv);
  float* const row_lse = first ? lse : blk_lse;
  F* const o = (first ? out : blk_out) + (int64_t{b} * s.Tq + i) * s.C + h * s.hs;
  if (maxv == -INFINITY) {  // no key of this block is visible to the row
    if (lane == 0) row_lse[row] = -INFINITY;
    for (int c = lane; c < s.hs; c += kWarpSize) o[c] = Store<F>(0.0f);
    return;
  }
  float sum = 0;
  for (int j = lane; j < s.Tk; j += kWarpSize) {
    const float v = score(j);
    const float p = v == -INFINITY ? 0.0f : __expf(v - maxv);
    sc[j] = Store<F>(p);
    sum += p;
  }
  sum = WarpSum(sum);
  __syncwarp();
  const float inv = 1.0f / sum;
  for (int c = lane; c < s.hs; c += kWarpSize) {
    float acc = 0;
    for (int j = 0; j < s.Tk; ++j) acc += Load(sc[j]) * Load(k0[int64_t{j} * 2 * s.KV + s.KV + c]);
    o[c] = Store<F>(acc * inv);
  }
  const float blk = maxv + logf(sum);
  if (first) {
    if (lane == 0) lse[row] = blk;
    return;
  }
  __syncwarp();
  // Merge: out, lse := the softmax over both key sets, weighted by logsumexp.
  const float old = lse[row];
  const float m = fmaxf(old, blk);
  const float merged = m + logf(__expf(old - m) + __expf(blk - m));
  const float w_old = __expf(old - merged), w_new = __expf(blk - merged);
  F* const dst = out + (int64_t{b} * s.Tq + i) * s.C + h * s.hs;
  for (int c = lane; c < s.hs; c += kWarpSize) {
    dst[c] = Store<F>(w_old * Load(dst[c]) + w_new * Load(o[c]));
  }
  if (lane == 0) {
    blk_lse[row] = blk;
    lse[row] = merged;
  }
}

// One warp per (b, h, i): D = dout · out over the head's channels.
template <typename F>
__global__ void RowDotKernel(float* D, const F* dout, const F* out, int64_t rows, int T, int C,
                             int NH, int hs) {
  const int64_t row = int64_t{blockIdx.x} * kWarps + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= rows) return;
  const int i = static_cast<int>(row % T);
  const int h = static_cast<int>((row / T) % NH);
  const int64_t b = row / (int64_t{T} * NH);
  const int64_t at = (b * T + i) * C + int64_t{h} * hs;
  float d = 0;
  for (int c = lane; c < hs; c += kWarpSize) d += Load(dout[at + c]) * Load(out[at + c]);
  d = WarpSum(d);
  if (lane == 0) D[row] = d;
}

// One warp per (b, h, i): P and dS of row i against the block (saved in
// scores and dscores), and dq_i += dS · K.
template <typename F>
__global__ void BlockBackwardRowsKernel(F* dqkv, F* scores, F* dscores, const F* dout, const F* qkv,
                                        const F* kv, const float* lse, const float* D,
                                        const int* pos_q, const int* pos_k, Shape s) {
  const int64_t row = int64_t{blockIdx.x} * kWarps + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= int64_t{s.B} * s.NH * s.Tq) return;
  const QueryRow qr = QueryRowOf(row, s);
  const int b = qr.b, h = qr.h, i = qr.i;
  const int group = s.NH / s.KVH;
  const F* q = qkv + (int64_t{b} * s.Tq + i) * s.W + h * s.hs;
  const F* d = dout + (int64_t{b} * s.Tq + i) * s.C + h * s.hs;
  const F* k0 = kv + int64_t{b} * s.Tk * 2 * s.KV + (h / group) * s.hs;
  F* p = scores + row * s.Tk;
  F* g = dscores + row * s.Tk;
  const float l = lse[row], di = D[row];
  const int pq = pos_q[i];
  for (int j = lane; j < s.Tk; j += kWarpSize) {
    float pv = 0, gv = 0;
    if (pos_k[j] <= pq) {
      const F* k = k0 + int64_t{j} * 2 * s.KV;
      const F* v = k + s.KV;
      float dot = 0, dp = 0;
      for (int c = 0; c < s.hs; ++c) {
        dot += Load(q[c]) * Load(k[c]);
        dp += Load(d[c]) * Load(v[c]);
      }
      pv = __expf(dot * s.scale - l);
      gv = pv * (dp - di) * s.scale;
    }
    p[j] = Store<F>(pv);
    g[j] = Store<F>(gv);
  }
  __syncwarp();
  F* dq = dqkv + (int64_t{b} * s.Tq + i) * s.W + h * s.hs;
  for (int c = lane; c < s.hs; c += kWarpSize) {
    float acc = 0;
    for (int j = 0; j < s.Tk; ++j) acc += Load(g[j]) * Load(k0[int64_t{j} * 2 * s.KV + c]);
    dq[c] = Store<F>(Load(dq[c]) + acc);
  }
}

// One warp per (b, key/value head, key row j): dk_j += Σ_h Σ_i dS_hij q_hi,
// dv_j += Σ_h Σ_i P_hij dout_hi, the group's heads in order.
template <typename F>
__global__ void BlockBackwardKeysKernel(F* dkv, const F* scores, const F* dscores, const F* dout,
                                        const F* qkv, Shape s) {
  const int64_t row = int64_t{blockIdx.x} * kWarps + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= int64_t{s.B} * s.KVH * s.Tk) return;
  const int j = static_cast<int>(row % s.Tk);
  const int kvh = static_cast<int>((row / s.Tk) % s.KVH);
  const int b = static_cast<int>(row / (int64_t{s.Tk} * s.KVH));
  const int group = s.NH / s.KVH;
  F* dk = dkv + (int64_t{b} * s.Tk + j) * 2 * s.KV + kvh * s.hs;
  F* dv = dk + s.KV;
  for (int c = lane; c < s.hs; c += kWarpSize) {
    float ak = 0, av = 0;
    for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
      const int64_t base = (int64_t{b} * s.NH + h) * s.Tq;
      for (int i = 0; i < s.Tq; ++i) {
        const int64_t at = (base + i) * s.Tk + j;
        const int64_t r = int64_t{b} * s.Tq + i;
        ak += Load(dscores[at]) * Load(qkv[r * s.W + h * s.hs + c]);
        av += Load(scores[at]) * Load(dout[r * s.C + h * s.hs + c]);
      }
    }
    dk[c] = Store<F>(Load(dk[c]) + ak);
    dv[c] = Store<F>(Load(dv[c]) + av);
  }
}

// kv (rows, 2KV) = qkv's [K | V] columns (add: kv's gradient into them).
template <typename F>
__global__ void KvColumnsKernel(F* dst, const F* src, int64_t n, int C, int KV, bool to_qkv) {
  const int64_t e = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (e >= n) return;
  const int64_t r = e / (2 * KV);
  const int c = static_cast<int>(e % (2 * KV));
  const int64_t at = r * (C + 2 * KV) + C + c;
  if (to_qkv) {
    dst[at] = Store<F>(Load(dst[at]) + Load(src[e]));
  } else {
    dst[e] = src[at];
  }
}

absl::Status CheckShape(const char* name, int B, int Tq, int Tk, int C, int NH, int KVH) {
  for (auto [what, v] : {std::pair<const char*, int>{"B", B}, {"Tq", Tq}, {"Tk", Tk}, {"C", C}}) {
    SHARDTRAIN_RETURN_IF_ERROR(internal::CheckNonNegative(name, what, v));
  }
  if (NH < 1 || KVH < 1 || C % NH != 0 || NH % KVH != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": need NH >= 1 dividing C and KVH >= 1 dividing NH, got C ", C, ", NH ",
                     NH, ", KVH ", KVH));
  }
  return absl::OkStatus();
}

// KvColumnsKernel's launcher: n elements of kv, copied out of qkv's [K | V]
// columns or (to_qkv) added into them.
absl::Status KvColumns(const KernelCtx& ctx, const char* name, void* dst, const void* src,
                       int64_t n, int C, int KV, bool to_qkv) {
  if (n <= 0) return absl::OkStatus();
  const int64_t blocks = internal::BlocksFor(n, kThreads);
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckGrid(name, blocks));
  return internal::DispatchDtype(ctx.dtype, [&](auto tag) -> absl::Status {
    using F = typename decltype(tag)::type;
    KvColumnsKernel<F><<<static_cast<int>(blocks), kThreads, 0, ctx.stream>>>(
        static_cast<F*>(dst), static_cast<const F*>(src), n, C, KV, to_qkv);
    return internal::CheckLaunch(name);
  });
}

// Blocks of kWarps warps covering `rows` warps.
int64_t WarpBlocks(int64_t rows) { return (rows + kWarps - 1) / kWarps; }

}  // namespace

absl::Status AttentionBlockForward(const KernelCtx& ctx, void* out, float* lse, void* blk_out,
                                   float* blk_lse, void* scores, const void* qkv, const void* kv,
                                   const int* pos_q, const int* pos_k, int B, int Tq, int Tk, int C,
                                   int NH, int KVH, bool first) {
  constexpr const char* kName = "AttentionBlockForward";
  SHARDTRAIN_RETURN_IF_ERROR(CheckShape(kName, B, Tq, Tk, C, NH, KVH));
  const Shape s = MakeShape(B, Tq, Tk, C, NH, KVH);
  const int64_t rows = int64_t{B} * NH * Tq;
  if (rows == 0) return absl::OkStatus();
  const int64_t blocks = WarpBlocks(rows);
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckGrid(kName, blocks));
  return internal::DispatchDtype(ctx.dtype, [&](auto tag) -> absl::Status {
    using F = typename decltype(tag)::type;
    BlockForwardKernel<F><<<static_cast<int>(blocks), kThreads, 0, ctx.stream>>>(
        static_cast<F*>(out), lse, static_cast<F*>(blk_out), blk_lse, static_cast<F*>(scores),
        static_cast<const F*>(qkv), static_cast<const F*>(kv), pos_q, pos_k, s, first);
    return internal::CheckLaunch(kName);
  });
}

absl::Status AttentionRowDot(const KernelCtx& ctx, float* D, const void* dout, const void* out,
                             int B, int T, int C, int NH) {
  constexpr const char* kName = "AttentionRowDot";
  SHARDTRAIN_RETURN_IF_ERROR(CheckShape(kName, B, T, T, C, NH, NH));
  const int64_t rows = int64_t{B} * NH * T;
  if (rows == 0) return absl::OkStatus();
  const int64_t blocks = WarpBlocks(rows);
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckGrid(kName, blocks));
  return internal::DispatchDtype(ctx.dtype, [&](auto tag) -> absl::Status {
    using F = typename decltype(tag)::type;
    RowDotKernel<F><<<static_cast<int>(blocks), kThreads, 0, ctx.stream>>>(
        D, static_cast<const F*>(dout), static_cast<const F*>(out), rows, T, C, NH, C / NH);
    return internal::CheckLaunch(kName);
  });
}

absl::Status AttentionBlockBackward(const KernelCtx& ctx, void* dqkv, void* dkv, void* scores,
                                    void* dscores, const void* dout, const void* qkv,
                                    const void* kv, const float* lse, const float* D,
                                    const int* pos_q, const int* pos_k, int B, int Tq, int Tk,
                                    int C, int NH, int KVH) {
  constexpr const char* kName = "AttentionBlockBackward";
  SHARDTRAIN_RETURN_IF_ERROR(CheckShape(kName, B, Tq, Tk, C, NH, KVH));
  const Shape s = MakeShape(B, Tq, Tk, C, NH, KVH);
  const int64_t rows = int64_t{B} * NH * Tq, keys = int64_t{B} * KVH * Tk;
  if (rows == 0 || keys == 0) return absl::OkStatus();
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckGrid(kName, WarpBlocks(rows)));
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckGrid(kName, WarpBlocks(keys)));
  return internal::DispatchDtype(ctx.dtype, [&](auto tag) -> absl::Status {
    using F = typename decltype(tag)::type;
    BlockBackwardRowsKernel<F><<<static_cast<int>(WarpBlocks(rows)), kThreads, 0, ctx.stream>>>(
        static_cast<F*>(dqkv), static_cast<F*>(scores), static_cast<F*>(dscores),
        static_cast<const F*>(dout), static_cast<const F*>(qkv), static_cast<const F*>(kv), lse, D,
        pos_q, pos_k, s);
    SHARDTRAIN_RETURN_IF_ERROR(internal::CheckLaunch(kName));
    BlockBackwardKeysKernel<F><<<static_cast<int>(WarpBlocks(keys)), kThreads, 0, ctx.stream>>>(
        static_cast<F*>(dkv), static_cast<const F*>(scores), static_cast<const F*>(dscores),
        static_cast<const F*>(dout), static_cast<const F*>(qkv), s);
    return internal::CheckLaunch(kName);
  });
}

absl::Status CopyKv(const KernelCtx& ctx, void* kv, const void* qkv, int B, int T, int C, int KV) {
  return KvColumns(ctx, "CopyKv", kv, qkv, int64_t{B} * T * 2 * KV, C, KV, /*to_qkv=*/false);
}

absl::Status AddKvGrad(const KernelCtx& ctx, void* dqkv, const void* dkv, int B, int T, int C,
                       int KV) {
  return KvColumns(ctx, "AddKvGrad", dqkv, dkv, int64_t{B} * T * 2 * KV, C, KV, /*to_qkv=*/true);
}

}  // namespace shardtrain::engine::cuda
