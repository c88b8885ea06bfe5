// Causal multi-head self-attention, forward and backward (kernels.h; the CPU
// twin is engine/cpu/layers.cc): strided-batched cuBLAS GEMMs, one call per
// sequence b with the NH heads batched, and a causal softmax kernel.
//
// Row-major <-> column-major (cuBLAS is column-major): a row-major (R,K)
// matrix with row stride ld is the column-major (K,R) matrix with leading
// dimension ld, its transpose. Per head, Q, K, V are row-major (T,hs) inside
// the qkv rows (row stride 3C, head h at column h*hs: batch stride hs);
// att, scores and scratch are row-major (T,T) (batch stride T*T); out and
// dout are row-major (T,hs) inside rows of stride C. Each row-major product
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

absl::Status CheckAttentionSizes(const char* kernel, int B, int T, int C, int NH) {
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckNonNegative(kernel, "B", B));
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckNonNegative(kernel, "T", T));
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckNonNegative(kernel, "C", C));
  if (NH < 1 || C % NH != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kernel, ": NH must be >= 1 and divide C, got NH ", NH, " and C ", C));
  }
  if (int64_t{3} * C > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(kernel, ": 3*C exceeds int32, C ", C));
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

// qkv (B,T,3C) = [Q | K | V]; out (B,T,C); att (B,NH,T,T) saved; scratch
// (B,NH,T,T) gets the scaled scores.
absl::Status AttentionForward(const KernelCtx& ctx, void* out, void* att, void* scratch,
                              const void* qkv, int B, int T, int C, int NH) {
  constexpr const char* kName = "AttentionForward";
  SHARDTRAIN_RETURN_IF_ERROR(CheckAttentionSizes(kName, B, T, C, NH));
  if (B == 0 || T == 0 || C == 0) return absl::OkStatus();
  SHARDTRAIN_RETURN_IF_ERROR(
      CublasStatus(cublasSetStream(ctx.blas, ctx.stream), "AttentionForward: cublasSetStream"));
  const size_t eb = DataTypeSize(ctx.dtype);
  const int hs = C / NH, C3 = 3 * C;
  const int64_t TT = int64_t{T} * T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  // scores[b] (NH,T,T) = scale · Q K^T
  for (int b = 0; b < B; ++b) {
    const void* q = At(qkv, int64_t{b} * T * C3, eb);
    const void* k = At(q, C, eb);
    SHARDTRAIN_RETURN_IF_ERROR(BatchedGemm(
        ctx, "AttentionForward (scores = Q K^T)", /*trans_a=*/true, /*trans_b=*/false, T, T, hs,
        scale, {k, C3, hs}, {q, C3, hs}, 0.0f, {At(scratch, b * NH * TT, eb), T, TT}, NH));
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
  // out[b] (T,C), head h in columns [h*hs, (h+1)*hs) = att V
  for (int b = 0; b < B; ++b) {
    const void* v = At(qkv, int64_t{b} * T * C3 + 2 * C, eb);
    SHARDTRAIN_RETURN_IF_ERROR(BatchedGemm(ctx, "AttentionForward (out = att V)", /*trans_a=*/false,
                                           /*trans_b=*/false, hs, T, T, 1.0f, {v, C3, hs},
                                           {At(att, b * NH * TT, eb), T, TT}, 0.0f,
                                           {At(out, int64_t{b} * T * C, eb), C, hs}, NH));
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

// dqkv (B,T,3C) += ; dout (B,T,C); qkv and att from the forward; scratch
// (B,NH,T,T) overwritten (dL/datt, then dL/dscores).
absl::Status AttentionBackward(const KernelCtx& ctx, void* dqkv, void* scratch, const void* dout,
                               const void* qkv, const void* att, int B, int T, int C, int NH) {
  constexpr const char* kName = "AttentionBackward";
  SHARDTRAIN_RETURN_IF_ERROR(CheckAttentionSizes(kName, B, T, C, NH));
  if (B == 0 || T == 0 || C == 0) return absl::OkStatus();
  SHARDTRAIN_RETURN_IF_ERROR(
      CublasStatus(cublasSetStream(ctx.blas, ctx.stream), "AttentionBackward: cublasSetStream"));
  const size_t eb = DataTypeSize(ctx.dtype);
  const int hs = C / NH, C3 = 3 * C;
  const int64_t TT = int64_t{T} * T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  // out = att V: datt = dout V^T into scratch, dV += att^T dout
  for (int b = 0; b < B; ++b) {
    const int64_t qkv_off = int64_t{b} * T * C3;
    const void* v = At(qkv, qkv_off + 2 * C, eb);
    const void* d = At(dout, int64_t{b} * T * C, eb);
    const void* a = At(att, b * NH * TT, eb);
    SHARDTRAIN_RETURN_IF_ERROR(
        BatchedGemm(ctx, "AttentionBackward (datt = dout V^T)", /*trans_a=*/true,
                    /*trans_b=*/false, T, T, hs, 1.0f, {v, C3, hs}, {d, C, hs}, 0.0f,
                    {At(scratch, b * NH * TT, eb), T, TT}, NH));
    SHARDTRAIN_RETURN_IF_ERROR(BatchedGemm(ctx, "AttentionBackward (dV += att^T dout)",
                                           /*trans_a=*/false,
                                           /*trans_b=*/true, hs, T, T, 1.0f, {d, C, hs}, {a, T, TT},
                                           1.0f, {At(dqkv, qkv_off + 2 * C, eb), C3, hs}, NH));
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
  // scores = Q K^T: dQ += dscores K, dK += dscores^T Q
  for (int b = 0; b < B; ++b) {
    const int64_t qkv_off = int64_t{b} * T * C3;
    const void* q = At(qkv, qkv_off, eb);
    const void* k = At(qkv, qkv_off + C, eb);
    const void* g = At(scratch, b * NH * TT, eb);
    SHARDTRAIN_RETURN_IF_ERROR(BatchedGemm(ctx, "AttentionBackward (dQ += dscores K)",
                                           /*trans_a=*/false,
                                           /*trans_b=*/false, hs, T, T, 1.0f, {k, C3, hs},
                                           {g, T, TT}, 1.0f, {At(dqkv, qkv_off, eb), C3, hs}, NH));
    SHARDTRAIN_RETURN_IF_ERROR(
        BatchedGemm(ctx, "AttentionBackward (dK += dscores^T Q)", /*trans_a=*/false,
                    /*trans_b=*/true, hs, T, T, 1.0f, {q, C3, hs}, {g, T, TT}, 1.0f,
                    {At(dqkv, qkv_off + C, eb), C3, hs}, NH));
  }
  return absl::OkStatus();
}

}  // namespace shardtrain::engine::cuda
