// Causal self-attention, multi-head or grouped-query, forward and backward
// (kernels.h; the CPU twin is engine/cpu/layers.cc): strided-batched cuBLAS
// GEMMs and a causal softmax kernel.
//
// Batching. qkv rows are W = C + 2KV wide: [Q | K | V], NH query heads and
// KVH key/value heads of hs channels, query head h reading kv head h / G
// (G = NH/KVH heads per group). For each sequence b and each position g in
// a group (0 <= g < G) one GEMM call batches the KVH heads h = j·G + g, j =
// 0..KVH-1: their Q (and out, dout) blocks lie G·hs apart, their K and V
// blocks hs apart, their (T,T) att / scores / scratch matrices G·T·T apart.
// With KVH == NH (G = 1) that is one call per sequence with the NH heads
// batched, multi-head attention as it always ran. In backward the G calls of
// a sequence add into the shared dK and dV (beta = 1) one after the other on
// the stream, g = 0 first: each kv head's gradient sums its query heads in
// head order, deterministically, without atomics.
//
// Row-major <-> column-major (cuBLAS is column-major): a row-major (R,K)
// matrix with row stride ld is the column-major (K,R) matrix with leading
// dimension ld, its transpose. Per head, Q, K, V are row-major (T,hs) inside
// the qkv rows (row stride W, head h at column h*hs); att, scores and
// scratch are row-major (T,T); out and dout are row-major (T,hs) inside rows
// of stride C. Each row-major product
// X = Y·Z is computed as the column-major X^T = Z^T·Y^T:
//   scores = s·Q·K^T      -> scores^T = s·K·Q^T       (A = K, op T; B = Q)
//   out    = att·V        -> out^T    = V^T·att^T     (A = V; B = att)
//   datt   = dout·V^T     -> datt^T   = V·dout^T      (A = V, op T; B = dout)
//   dV    += att^T·dout   -> dV^T    += dout^T·att    (A = dout; B = att, op T)
//   dQ    += dscore·K     -> dQ^T    += K^T·dscore^T  (A = K; B = dscore)
//   dK    += dscore^T·Q   -> dK^T    += Q^T·dscore    (A = Q; B = dscore, op T)
// where "A = K" means the column-major (hs,T) matrix K^T as it lies in
// memory. Every GEMM computes in fp32 (CUBLAS_COMPUTE_32F) on ctx.dtype
// operands; s = 1/sqrt(hs).
#include <cmath>
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "worker/engine/cuda/kernel_util.cuh"
#include "worker/engine/cuda/kernels.h"

namespace shardtrain::engine::cuda {
namespace {

using internal::CublasStatus;
using internal::kWarpSize;
using internal::Load;
using internal::Store;
using internal::WarpMax;
using internal::WarpSum;

constexpr int kThreads = 256;                        // 8 warps
constexpr int kRowsPerBlock = kThreads / kWarpSize;  // one warp per row of T

// The element `elems` elements after p, for elements of elem_bytes bytes.
const void* At(const void* p, int64_t elems, size_t elem_bytes) {
  return static_cast<const char*>(p) + elems * static_cast<int64_t>(elem_bytes);
}
void* At(void* p, int64_t elems, size_t elem_bytes) {
  return static_cast<char*>(p) + elems * static_cast<int64_t>(elem_bytes);
}

// A matrix operand of a strided-batched GEMM: its pointer, leading dimension
// and batch stride, in elements.
struct Operand {
  const void* ptr;
  int ld;
  int64_t stride;
};

// C_i = alpha·op(A_i)·op(B_i) + beta·C_i for the `batch` matrices i, all of
// type ctx.dtype, column-major, fp32 compute and scalars.
absl::Status BatchedGemm(const KernelCtx& ctx, const char* what, bool trans_a, bool trans_b, int m,
                         int n, int k, float alpha, const Operand& a, const Operand& b, float beta,
                         const Operand& c, int batch) {
  const cudaDataType_t t = internal::CudaDataType(ctx.dtype);
  return CublasStatus(cublasGemmStridedBatchedEx(
                          ctx.blas, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                          trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha, a.ptr, t, a.ld,
                          a.stride, b.ptr, t, b.ld, b.stride, &beta, const_cast<void*>(c.ptr), t,
                          c.ld, c.stride, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                      absl::StrCat(what, ": cublasGemmStridedBatchedEx"));
}

// The shapes of one attention call: hs, the group size G = NH/KVH, KV =
// KVH·hs and the qkv row width W = C + 2KV.
struct AttentionShape {
  int hs, group, KV, W;
  explicit AttentionShape(int C, int NH, int KVH)
      : hs(C / NH), group(NH / KVH), KV(KVH * (C / NH)), W(C + 2 * KVH * (C / NH)) {}
};

absl::Status CheckAttentionSizes(const char* kernel, int B, int T, int C, int NH, int KVH) {
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckNonNegative(kernel, "B", B));
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckNonNegative(kernel, "T", T));
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckNonNegative(kernel, "C", C));
  if (NH < 1 || C % NH != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kernel, ": NH must be >= 1 and divide C, got NH ", NH, " and C ", C));
  }
  if (KVH < 1 || NH % KVH != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kernel, ": KVH must be >= 1 and divide NH, got KVH ", KVH, " and NH ", NH));
  }
  if (int64_t{C} + int64_t{2} * KVH * (C / NH) > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kernel, ": the qkv row C + 2·KVH·hs exceeds int32, C ", C));
  }
  const int64_t rows = int64_t{B} * NH * T;
  return internal::CheckGrid(kernel, internal::BlocksFor(rows, kRowsPerBlock));
}

// One warp per row (b, h, t) of scores and att (B,NH,T,T): att[j] =
// exp(scores[j] - max) / Σ exp(scores[i] - max) over j, i <= t; 0 for j > t.
template <typename F>
__global__ void CausalSoftmaxForwardKernel(F* att, const F* scores, int64_t rows, int T) {
  const int64_t row = int64_t{blockIdx.x} * kRowsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= rows) return;  // the whole warp leaves together
  const int t = static_cast<int>(row % T);
  const F* s = scores + row * T;
  F* a = att + row * T;
  float max_v = -INFINITY;
  for (int j = lane; j <= t; j += kWarpSize) max_v = fmaxf(max_v, Load(s[j]));
  max_v = WarpMax(max_v);
  float sum = 0.0f;
  for (int j = lane; j <= t; j += kWarpSize) sum += expf(Load(s[j]) - max_v);
  const float inv = 1.0f / WarpSum(sum);
  for (int j = lane; j < T; j += kWarpSize) {
    a[j] = Store<F>(j <= t ? expf(Load(s[j]) - max_v) * inv : 0.0f);
  }
}

// Writes a causal row's packs [0, T / kPack<F>) to `out`, a warp's lanes
// striding: pack k < live (holding a column <= the row's t) is make(k), the
// ones above are zeros (all-zero bits: 0 in fp32, bf16 and fp16).
template <typename F, typename Make>
__device__ __forceinline__ void WriteCausalPacks(int4* out, int T, int live, int lane, Make make) {
  for (int k = lane; k < T / internal::kPack<F>; k += kWarpSize) {
    out[k] = k < live ? make(k) : make_int4(0, 0, 0, 0);
  }
}

// CausalSoftmaxForwardKernel with 16-byte accesses (rows of whole packs on
// aligned arrays):
// the scalar kernel's 2-byte loads, one column per lane, used a fraction of
// the bandwidth on the T² rows (the H100's profile). Sums and maxima in a
// fixed order per lane, then the warp's butterfly: deterministic.
template <typename F>
__global__ void CausalSoftmaxForwardPackedKernel(F* att, const F* scores, int64_t rows, int T) {
  constexpr int P = internal::kPack<F>;
  const int64_t row = int64_t{blockIdx.x} * kRowsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= rows) return;
  const int t = static_cast<int>(row % T);
  const int4* s = reinterpret_cast<const int4*>(scores + row * T);
  int4* a = reinterpret_cast<int4*>(att + row * T);
  const int live = t / P + 1;  // packs holding a column <= t
  float max_v = -INFINITY;
  for (int k = lane; k < live; k += kWarpSize) {
    const int4 v = s[k];
    const F* e = reinterpret_cast<const F*>(&v);
#pragma unroll
    for (int j = 0; j < P; ++j) {
      if (k * P + j <= t) max_v = fmaxf(max_v, Load(e[j]));
    }
  }
  max_v = WarpMax(max_v);
  float sum = 0.0f;
  for (int k = lane; k < live; k += kWarpSize) {
    const int4 v = s[k];
    const F* e = reinterpret_cast<const F*>(&v);
#pragma unroll
    for (int j = 0; j < P; ++j) {
      if (k * P + j <= t) sum += expf(Load(e[j]) - max_v);
    }
  }
  const float inv = 1.0f / WarpSum(sum);
  WriteCausalPacks<F>(a, T, live, lane, [&](int k) {
    const int4 v = s[k];
    const F* e = reinterpret_cast<const F*>(&v);
    int4 out;
    F* o = reinterpret_cast<F*>(&out);
#pragma unroll
    for (int j = 0; j < P; ++j) {
      o[j] = Store<F>(k * P + j <= t ? expf(Load(e[j]) - max_v) * inv : 0.0f);
    }
    return out;
  });
}

}  // namespace

// qkv (B,T,C+2KV) = [Q | K | V]; out (B,T,C); att (B,NH,T,T) saved;
// scratch (B,NH,T,T) gets the scaled scores.
absl::Status AttentionForward(const KernelCtx& ctx, void* out, void* att, void* scratch,
                              const void* qkv, int B, int T, int C, int NH, int KVH) {
  constexpr const char* kName = "AttentionForward";
  SHARDTRAIN_RETURN_IF_ERROR(CheckAttentionSizes(kName, B, T, C, NH, KVH));
  if (B == 0 || T == 0 || C == 0) return absl::OkStatus();
  SHARDTRAIN_RETURN_IF_ERROR(
      CublasStatus(cublasSetStream(ctx.blas, ctx.stream), "AttentionForward: cublasSetStream"));
  const size_t eb = DataTypeSize(ctx.dtype);
  const AttentionShape sh(C, NH, KVH);
  const int hs = sh.hs, G = sh.group, W = sh.W;
  const int64_t TT = int64_t{T} * T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  // scores[b, h] (T,T) = scale · Q_h K_{h/G}^T, the heads h = j·G + g batched
  for (int b = 0; b < B; ++b) {
    const int64_t row0 = int64_t{b} * T * W;
    for (int g = 0; g < G; ++g) {
      const void* q = At(qkv, row0 + int64_t{g} * hs, eb);
      const void* k = At(qkv, row0 + C, eb);
      SHARDTRAIN_RETURN_IF_ERROR(
          BatchedGemm(ctx, "AttentionForward (scores = Q K^T)", /*trans_a=*/true, /*trans_b=*/false,
                      T, T, hs, scale, {k, W, hs}, {q, W, int64_t{G} * hs}, 0.0f,
                      {At(scratch, (int64_t{b} * NH + g) * TT, eb), T, G * TT}, KVH));
    }
  }
  const int64_t rows = int64_t{B} * NH * T;
  SHARDTRAIN_RETURN_IF_ERROR(internal::DispatchDtype(ctx.dtype, [&](auto tag) {
    using F = typename decltype(tag)::type;
    const int blocks = static_cast<int>(internal::BlocksFor(rows, kRowsPerBlock));
    if (internal::Packable(T, sizeof(F), {att, scratch})) {
      CausalSoftmaxForwardPackedKernel<F><<<blocks, kThreads, 0, ctx.stream>>>(
          static_cast<F*>(att), static_cast<const F*>(scratch), rows, T);
    } else {
      CausalSoftmaxForwardKernel<F><<<blocks, kThreads, 0, ctx.stream>>>(
          static_cast<F*>(att), static_cast<const F*>(scratch), rows, T);
    }
    return internal::CheckLaunch("AttentionForward (causal softmax)");
  }));
  // out[b] (T,C), head h in columns [h*hs, (h+1)*hs) = att_h V_{h/G}
  for (int b = 0; b < B; ++b) {
    const void* v = At(qkv, int64_t{b} * T * W + C + sh.KV, eb);
    for (int g = 0; g < G; ++g) {
      SHARDTRAIN_RETURN_IF_ERROR(BatchedGemm(
          ctx, "AttentionForward (out = att V)", /*trans_a=*/false,
          /*trans_b=*/false, hs, T, T, 1.0f, {v, W, hs},
          {At(att, (int64_t{b} * NH + g) * TT, eb), T, G * TT}, 0.0f,
          {At(out, int64_t{b} * T * C + int64_t{g} * hs, eb), C, int64_t{G} * hs}, KVH));
    }
  }
  return absl::OkStatus();
}

namespace {

// One warp per row (b, h, t) of att and g (B,NH,T,T), in place on g: g holds
// dL/datt and becomes dL/dscores = att · (g - Σ_i att_i g_i) · scale for
// j <= t (the sum over i <= t), 0 above the diagonal.
template <typename F>
__global__ void CausalSoftmaxBackwardKernel(F* g, const F* att, int64_t rows, int T, float scale) {
  const int64_t row = int64_t{blockIdx.x} * kRowsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= rows) return;
  const int t = static_cast<int>(row % T);
  const F* a = att + row * T;
  F* gr = g + row * T;
  float dot = 0.0f;
  for (int j = lane; j <= t; j += kWarpSize) dot += Load(a[j]) * Load(gr[j]);
  dot = WarpSum(dot);  // each lane rewrites only the elements it read
  for (int j = lane; j < T; j += kWarpSize) {
    gr[j] = Store<F>(j <= t ? Load(a[j]) * (Load(gr[j]) - dot) * scale : 0.0f);
  }
}

// CausalSoftmaxBackwardKernel with 16-byte accesses (see the forward's).
template <typename F>
__global__ void CausalSoftmaxBackwardPackedKernel(F* g, const F* att, int64_t rows, int T,
                                                  float scale) {
  constexpr int P = internal::kPack<F>;
  const int64_t row = int64_t{blockIdx.x} * kRowsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= rows) return;
  const int t = static_cast<int>(row % T);
  const int4* a = reinterpret_cast<const int4*>(att + row * T);
  int4* gr = reinterpret_cast<int4*>(g + row * T);
  const int live = t / P + 1;
  float dot = 0.0f;
  for (int k = lane; k < live; k += kWarpSize) {
    const int4 av = a[k], gv = gr[k];
    const F* ae = reinterpret_cast<const F*>(&av);
    const F* ge = reinterpret_cast<const F*>(&gv);
#pragma unroll
    for (int j = 0; j < P; ++j) {
      if (k * P + j <= t) dot += Load(ae[j]) * Load(ge[j]);
    }
  }
  dot = WarpSum(dot);  // each lane rewrites only the packs it read
  WriteCausalPacks<F>(gr, T, live, lane, [&](int k) {
    const int4 av = a[k], gv = gr[k];
    const F* ae = reinterpret_cast<const F*>(&av);
    const F* ge = reinterpret_cast<const F*>(&gv);
    int4 out;
    F* o = reinterpret_cast<F*>(&out);
#pragma unroll
    for (int j = 0; j < P; ++j) {
      o[j] = Store<F>(k * P + j <= t ? Load(ae[j]) * (Load(ge[j]) - dot) * scale : 0.0f);
    }
    return out;
  });
}

}  // namespace

// dqkv (B,T,C+2KV) += ; dout (B,T,C); qkv and att from the forward;
// scratch (B,NH,T,T) overwritten (dL/datt, then dL/dscores).
absl::Status AttentionBackward(const KernelCtx& ctx, void* dqkv, void* scratch, const void* dout,
                               const void* qkv, const void* att, int B, int T, int C, int NH,
                               int KVH) {
  constexpr const char* kName = "AttentionBackward";
  SHARDTRAIN_RETURN_IF_ERROR(CheckAttentionSizes(kName, B, T, C, NH, KVH));
  if (B == 0 || T == 0 || C == 0) return absl::OkStatus();
  SHARDTRAIN_RETURN_IF_ERROR(
      CublasStatus(cublasSetStream(ctx.blas, ctx.stream), "AttentionBackward: cublasSetStream"));
  const size_t eb = DataTypeSize(ctx.dtype);
  const AttentionShape sh(C, NH, KVH);
  const int hs = sh.hs, G = sh.group, W = sh.W;
  const int64_t TT = int64_t{T} * T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  // out = att V: datt = dout V^T into scratch, dV += att^T dout (the G
  // query heads of a group into their kv head's dV, g = 0 first)
  for (int b = 0; b < B; ++b) {
    const int64_t qkv_off = int64_t{b} * T * W;
    const void* v = At(qkv, qkv_off + C + sh.KV, eb);
    void* dv = At(dqkv, qkv_off + C + sh.KV, eb);
    for (int g = 0; g < G; ++g) {
      const void* d = At(dout, int64_t{b} * T * C + int64_t{g} * hs, eb);
      const int64_t bh = (int64_t{b} * NH + g) * TT;
      SHARDTRAIN_RETURN_IF_ERROR(
          BatchedGemm(ctx, "AttentionBackward (datt = dout V^T)", /*trans_a=*/true,
                      /*trans_b=*/false, T, T, hs, 1.0f, {v, W, hs}, {d, C, int64_t{G} * hs}, 0.0f,
                      {At(scratch, bh, eb), T, G * TT}, KVH));
      SHARDTRAIN_RETURN_IF_ERROR(
          BatchedGemm(ctx, "AttentionBackward (dV += att^T dout)", /*trans_a=*/false,
                      /*trans_b=*/true, hs, T, T, 1.0f, {d, C, int64_t{G} * hs},
                      {At(att, bh, eb), T, G * TT}, 1.0f, {dv, W, hs}, KVH));
    }
  }
  // softmax backward in place: scratch becomes dL/dscores (scale folded in)
  const int64_t rows = int64_t{B} * NH * T;
  SHARDTRAIN_RETURN_IF_ERROR(internal::DispatchDtype(ctx.dtype, [&](auto tag) {
    using F = typename decltype(tag)::type;
    const int blocks = static_cast<int>(internal::BlocksFor(rows, kRowsPerBlock));
    if (internal::Packable(T, sizeof(F), {att, scratch})) {
      CausalSoftmaxBackwardPackedKernel<F><<<blocks, kThreads, 0, ctx.stream>>>(
          static_cast<F*>(scratch), static_cast<const F*>(att), rows, T, scale);
    } else {
      CausalSoftmaxBackwardKernel<F><<<blocks, kThreads, 0, ctx.stream>>>(
          static_cast<F*>(scratch), static_cast<const F*>(att), rows, T, scale);
    }
    return internal::CheckLaunch("AttentionBackward (causal softmax)");
  }));
  // scores = Q K^T: dQ += dscores K, dK += dscores^T Q (the G query heads
  // of a group into their kv head's dK, g = 0 first)
  for (int b = 0; b < B; ++b) {
    const int64_t qkv_off = int64_t{b} * T * W;
    const void* k = At(qkv, qkv_off + C, eb);
    void* dk = At(dqkv, qkv_off + C, eb);
    for (int g = 0; g < G; ++g) {
      const int64_t q_off = qkv_off + int64_t{g} * hs;
      const void* q = At(qkv, q_off, eb);
      const void* ds = At(scratch, (int64_t{b} * NH + g) * TT, eb);
      SHARDTRAIN_RETURN_IF_ERROR(
          BatchedGemm(ctx, "AttentionBackward (dQ += dscores K)", /*trans_a=*/false,
                      /*trans_b=*/false, hs, T, T, 1.0f, {k, W, hs}, {ds, T, G * TT}, 1.0f,
                      {At(dqkv, q_off, eb), W, int64_t{G} * hs}, KVH));
      SHARDTRAIN_RETURN_IF_ERROR(
          BatchedGemm(ctx, "AttentionBackward (dK += dscores^T Q)", /*trans_a=*/false,
                      /*trans_b=*/true, hs, T, T, 1.0f, {q, W, int64_t{G} * hs}, {ds, T, G * TT},
                      1.0f, {dk, W, hs}, KVH));
    }
  }
  return absl::OkStatus();
}

}  // namespace shardtrain::engine::cuda
