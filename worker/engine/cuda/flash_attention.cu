// Flash attention (kernels.h): causal, multi-head or grouped-query, forward
// and backward without the (T,T) matrix, on tensor cores (mma.sync
// m16n8k16, 16-bit operands, fp32 accumulation), for bf16 and fp16 compute
// and head sizes 64 and 128. The materialized kernels of attention.cu stay
// the reference (and serve fp32, which never runs on TF32 here) — the tests
// compare both with the CPU.
//
// Tiles. A block of kThreads = 128 threads (4 warps) owns kTile = 64 rows:
// each warp 16 of them. Q, K, V and dout tiles are staged in shared memory
// (cp.async, double-buffered) as 16-bit rows of HS (+8 padding: ldmatrix
// without bank conflicts). Products run from registers: operands arrive by
// ldmatrix, scores stay in the accumulators' layout, and a score tile
// becomes the next product's A operand in place (FlashAttention-2's trick:
// an m16n8 accumulator pair is an m16k16 A fragment) — no score, P or dS
// ever touches shared memory.
//
// Forward (one block per (query tile, head, sequence); the longest rows
// first): for each key tile up to the diagonal, S = Q·K^T (scaled, in log2
// units), the online softmax per row (running max m and sum l; a row's 64
// scores live in the 4 lanes of a quad), P rounded to the compute type, O
// (fp32 registers) scaled by exp2(m_old - m_new) and += P·V. out = O / l;
// lse = (m + log2 l)·ln 2, the natural-log logsumexp of the row, saved for
// backward (and for a ring's merge).
//
// Backward (FlashAttention-2's, without atomics):
//   - one block per (query tile, head, sequence): D = rowsum(dout ∘ out) of
//     its rows, then for each key tile up to the diagonal P = exp(Q·K^T·s −
//     lse), dP = dout·V^T, dS = P ∘ (dP − D)·s, dQ += dS·K, added to dqkv
//     once;
//   - then one block per (key tile, kv head, sequence): for each query head of
//     the group in order and each query tile from the diagonal on, P^T =
//     exp(K·Q^T·s − lse), dP^T = V·dout^T, dS^T = P^T ∘ (dP^T − D)·s;
//     dV += P^T·dout, dK += dS^T·Q in registers, added to dqkv once.
// Each element of dqkv is written by one thread after a fixed-order sum:
// the same inputs give the same bits.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/model/activations.h"
#include "worker/engine/cuda/flash_attention_tiles.cuh"
#include "worker/engine/cuda/kernel_util.cuh"
#include "worker/engine/cuda/kernels.h"

namespace shardtrain::engine::cuda {
namespace {

using namespace flash;  // NOLINT: the tile primitives of this file's kernels

template <typename F, int HS>
__global__ void __launch_bounds__(kThreads)
    FlashForwardKernel(F* out, float* lse, const F* qkv, int T, int C, int NH, int KVH,
                       float scale_log2) {
  using S = Smem<HS>;
  extern __shared__ __align__(128) unsigned char smem[];
  F* const sq = reinterpret_cast<F*>(smem);
  // Buffer i of K and of V (pointer arithmetic: an array would live in
  // local memory).
  auto sk = [&](int i) { return reinterpret_cast<F*>(smem + (1 + i) * S::kTileBytes); };
  auto sv = [&](int i) { return reinterpret_cast<F*>(smem + (3 + i) * S::kTileBytes); };
  const int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int KV = KVH * HS, W = C + 2 * KV, kvh = h / (NH / KVH);
  const int warp = threadIdx.x / kWarpSize;
  const int q0 = qt * kTile, row0 = q0 + warp * kWarpRows;  // the warp's first query
  const F* const seq = qkv + int64_t{b} * T * W;
  const F* const keys = seq + C + kvh * HS;
  const F* const values = seq + C + KV + kvh * HS;
  LoadTile<F, HS, kTile>(sq, seq + h * HS, q0, T, W);
  LoadTile<F, HS, kTile>(sk(0), keys, 0, T, W);
  LoadTile<F, HS, kTile>(sv(0), values, 0, T, W);
  CpAsyncCommit();
  // The lane's two rows (FragRow(0), FragRow(2)): running max (log2 units)
  // and the lane's part of the running sum.
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float o[HS / 8][4] = {};
  const F* const wq = sq + warp * kWarpRows * S::kLd;
  for (int kt = 0; kt <= qt; ++kt) {
    const int buf = kt & 1;
    if (kt < qt) {  // the next tile's K and V arrive while this one is used
      LoadTile<F, HS, kTile>(sk(buf ^ 1), keys, (kt + 1) * kTile, T, W);
      LoadTile<F, HS, kTile>(sv(buf ^ 1), values, (kt + 1) * kTile, T, W);
      CpAsyncCommit();
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();
    float s[kTile / 8][4];
    RowsTimesTileT<F, HS, kTile>(s, wq, sk(buf));
    // Every tile up to the diagonal holds a visible key for each row
    // (key kt·64 <= q0 <= the row), so the new max is finite.
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < kTile / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const bool masked = kt == qt && FragCol(nt, e) > warp * kWarpRows + FragRow(e);
        s[nt][e] = masked ? -INFINITY : s[nt][e] * scale_log2;
        mx[e / 2] = fmaxf(mx[e / 2], s[nt][e]);
      }
    }
    float alpha[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {  // a row's columns are spread over a quad's lanes
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(kFullMask, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(kFullMask, mx[i], 2));
      const float m_new = fmaxf(m[i], mx[i]);
      alpha[i] = exp2f(m[i] - m_new);
      m[i] = m_new;
      l[i] *= alpha[i];
    }
#pragma unroll
    for (int nt = 0; nt < kTile / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nt][e] = exp2f(s[nt][e] - m[e / 2]);
        l[e / 2] += s[nt][e];
      }
    }
#pragma unroll
    for (int nt = 0; nt < HS / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[nt][e] *= alpha[e / 2];
    }
    AccumulateRowsTimesTile<F, HS, kTile>(o, s, sv(buf));
    __syncthreads();  // this tile's K and V are consumed: the next load may reuse them
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(kFullMask, l[i], 1);
    l[i] += __shfl_xor_sync(kFullMask, l[i], 2);
    const int qi = row0 + FragRow(2 * i);
    if (qi >= T) continue;
    const float inv = 1.0f / l[i];
    F* const orow = out + (int64_t{b} * T + qi) * C + h * HS;
#pragma unroll
    for (int nt = 0; nt < HS / 8; ++nt) {
      *reinterpret_cast<uint32_t*>(orow + FragCol(nt, 0)) =
          Pack<F>(o[nt][2 * i] * inv, o[nt][2 * i + 1] * inv);
    }
    if (threadIdx.x % 4 == 0) lse[(int64_t{b} * NH + h) * T + qi] = (m[i] + log2f(l[i])) * kLn2;
  }
}

// dK and dV of one key tile of one kv head: its query heads in order, each
// query tile (kQTile rows) from the diagonal on (double-buffered); the warp's
// 16 keys' dK and dV in registers.
template <typename F, int HS>
__global__ void __launch_bounds__(kThreads)
    FlashBackwardKvKernel(F* dqkv, const F* dout, const F* qkv, const float* lse_all,
                          const float* D_all, int T, int C, int NH, int KVH, float scale) {
  using S = Smem<HS>;
  constexpr int QT = S::kQTile;
  extern __shared__ __align__(128) unsigned char smem[];
  F* const sk = reinterpret_cast<F*>(smem);
  F* const sv = reinterpret_cast<F*>(smem + S::kTileBytes);
  auto sq = [&](int i) { return reinterpret_cast<F*>(smem + 2 * S::kTileBytes + i * S::kQBytes); };
  auto sd = [&](int i) {
    return reinterpret_cast<F*>(smem + 2 * S::kTileBytes + (2 + i) * S::kQBytes);
  };
  float* const stats = reinterpret_cast<float*>(smem + 2 * S::kTileBytes + 4 * S::kQBytes);
  const int kt = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
  const int G = NH / KVH, KV = KVH * HS, W = C + 2 * KV;
  const int warp = threadIdx.x / kWarpSize;
  const int k0 = kt * kTile, row0 = k0 + warp * kWarpRows;  // the warp's first key
  const F* const seq = qkv + int64_t{b} * T * W;
  const float scale_log2 = scale * kLog2e;
  // The (head, query tile) pairs this block visits, in order: n per head,
  // from the query tile holding key k0 on.
  const int first = k0 / QT, n = (T + QT - 1) / QT - first, pairs = G * n;
  // Starts the loads of pair idx into buffer buf: Q, dout, lse·log2(e), D.
  auto load = [&](int idx, int buf) {
    const int h = kvh * G + idx / n, q0 = (first + idx % n) * QT;
    LoadTile<F, HS, QT>(sq(buf), seq + h * HS, q0, T, W);
    LoadTile<F, HS, QT>(sd(buf), dout + int64_t{b} * T * C + h * HS, q0, T, C);
    const int64_t at = (int64_t{b} * NH + h) * T + q0;
    float* const st = stats + buf * 2 * QT;
    for (int e = threadIdx.x; e < QT; e += kThreads) {
      st[e] = q0 + e < T ? lse_all[at + e] * kLog2e : 0.0f;
      st[QT + e] = q0 + e < T ? D_all[at + e] : 0.0f;
    }
  };
  LoadTile<F, HS, kTile>(sk, seq + C + kvh * HS, k0, T, W);
  LoadTile<F, HS, kTile>(sv, seq + C + KV + kvh * HS, k0, T, W);
  load(0, 0);
  CpAsyncCommit();
  float dk[HS / 8][4] = {}, dv[HS / 8][4] = {};
  const F* const wk = sk + warp * kWarpRows * S::kLd;
  const F* const wv = sv + warp * kWarpRows * S::kLd;
  for (int idx = 0; idx < pairs; ++idx) {
    const int buf = idx & 1;
    if (idx + 1 < pairs) {
      load(idx + 1, buf ^ 1);
      CpAsyncCommit();
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();
    const float* const slse = stats + buf * 2 * QT;
    const float* const sD = slse + QT;
    const int q0 = (first + idx % n) * QT;
    // Tiles across the diagonal or past T hold invisible pairs.
    const bool edge = q0 < k0 + kTile || q0 + QT > T;
    // P^T: this warp's keys against the tile's queries.
    float p[QT / 8][4];
    RowsTimesTileT<F, HS, QT>(p, wk, sq(buf));
#pragma unroll
    for (int nt = 0; nt < QT / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = FragCol(nt, e), qi = q0 + c;
        const bool hidden = edge && (row0 + FragRow(e) > qi || qi >= T);
        p[nt][e] = hidden ? 0.0f : exp2f(p[nt][e] * scale_log2 - slse[c]);
      }
    }
    // dP^T = V · dout^T, then dS^T = P^T ∘ (dP^T − D) · s in place.
    float ds[QT / 8][4];
    RowsTimesTileT<F, HS, QT>(ds, wv, sd(buf));
    AccumulateRowsTimesTile<F, HS, QT>(dv, p, sd(buf));
#pragma unroll
    for (int nt = 0; nt < QT / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) ds[nt][e] = p[nt][e] * (ds[nt][e] - sD[FragCol(nt, e)]) * scale;
    }
    AccumulateRowsTimesTile<F, HS, QT>(dk, ds, sq(buf));
    __syncthreads();  // this pair's buffers are consumed: the next load may reuse them
  }
  F* const dseq = dqkv + int64_t{b} * T * W;
  AddRows<F, HS>(dseq + C + kvh * HS, W, row0, T, dk);
  AddRows<F, HS>(dseq + C + KV + kvh * HS, W, row0, T, dv);
}

// dQ of one query tile of one head: every key tile up to the diagonal
// (double-buffered); the warp's 16 rows' dQ in registers. Runs first: it
// also computes the rows' D = dout · out (a quad of lanes per row) and
// saves it in D_all for the dK/dV kernel.
template <typename F, int HS>
__global__ void __launch_bounds__(kThreads)
    FlashBackwardQKernel(F* dqkv, float* D_all, const F* dout, const F* qkv, const F* out,
                         const float* lse_all, int T, int C, int NH, int KVH, float scale) {
  using S = Smem<HS>;
  extern __shared__ __align__(128) unsigned char smem[];
  F* const sq = reinterpret_cast<F*>(smem);
  F* const sd = reinterpret_cast<F*>(smem + S::kTileBytes);
  auto sk = [&](int i) { return reinterpret_cast<F*>(smem + (2 + i) * S::kTileBytes); };
  auto sv = [&](int i) { return reinterpret_cast<F*>(smem + (4 + i) * S::kTileBytes); };
  const int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int KV = KVH * HS, W = C + 2 * KV, kvh = h / (NH / KVH);
  const int warp = threadIdx.x / kWarpSize;
  const int q0 = qt * kTile, row0 = q0 + warp * kWarpRows;  // the warp's first query
  const F* const seq = qkv + int64_t{b} * T * W;
  const F* const keys = seq + C + kvh * HS;
  const F* const values = seq + C + KV + kvh * HS;
  LoadTile<F, HS, kTile>(sq, seq + h * HS, q0, T, W);
  LoadTile<F, HS, kTile>(sd, dout + int64_t{b} * T * C + h * HS, q0, T, C);
  LoadTile<F, HS, kTile>(sk(0), keys, 0, T, W);
  LoadTile<F, HS, kTile>(sv(0), values, 0, T, W);
  CpAsyncCommit();
  // The lane's two rows' lse (log2 units) and D, each lane of the row's
  // quad summing HS/4 of its channels.
  float lse[2], D[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int qi = row0 + FragRow(2 * i);
    const int64_t at = (int64_t{b} * NH + h) * T + qi;
    float d = 0.0f;
    if (qi < T) {
      constexpr int kQuarter = HS / 4;
      const int64_t x = (int64_t{b} * T + qi) * C + h * HS + (threadIdx.x % 4) * kQuarter;
      float o[kQuarter], g[kQuarter];
      internal::LoadVec<F, kQuarter>(o, out + x);
      internal::LoadVec<F, kQuarter>(g, dout + x);
#pragma unroll
      for (int c = 0; c < kQuarter; ++c) d += o[c] * g[c];
    }
    d += __shfl_xor_sync(kFullMask, d, 1);
    d += __shfl_xor_sync(kFullMask, d, 2);
    D[i] = d;
    if (qi < T && threadIdx.x % 4 == 0) D_all[at] = d;
    lse[i] = qi < T ? lse_all[at] * kLog2e : 0.0f;
  }
  const float scale_log2 = scale * kLog2e;
  float dq[HS / 8][4] = {};
  const F* const wq = sq + warp * kWarpRows * S::kLd;
  const F* const wd = sd + warp * kWarpRows * S::kLd;
  for (int kt = 0; kt <= qt; ++kt) {
    const int buf = kt & 1;
    if (kt < qt) {
      LoadTile<F, HS, kTile>(sk(buf ^ 1), keys, (kt + 1) * kTile, T, W);
      LoadTile<F, HS, kTile>(sv(buf ^ 1), values, (kt + 1) * kTile, T, W);
      CpAsyncCommit();
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();
    float p[kTile / 8][4];
    RowsTimesTileT<F, HS, kTile>(p, wq, sk(buf));
#pragma unroll
    for (int nt = 0; nt < kTile / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        // Rows past T: zero Q and dout make P·(dP − D) zero.
        const bool hidden = kt == qt && FragCol(nt, e) > warp * kWarpRows + FragRow(e);
        p[nt][e] = hidden ? 0.0f : exp2f(p[nt][e] * scale_log2 - lse[e / 2]);
      }
    }
    float ds[kTile / 8][4];
    RowsTimesTileT<F, HS, kTile>(ds, wd, sv(buf));
#pragma unroll
    for (int nt = 0; nt < kTile / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) ds[nt][e] = p[nt][e] * (ds[nt][e] - D[e / 2]) * scale;
    }
    AccumulateRowsTimesTile<F, HS, kTile>(dq, ds, sk(buf));
    __syncthreads();
  }
  AddRows<F, HS>(dqkv + int64_t{b} * T * W + h * HS, W, row0, T, dq);
}

template <typename Kernel, typename... Args>
absl::Status Launch(const char* what, Kernel kernel, dim3 grid, int smem_bytes, cudaStream_t stream,
                    Args... args) {
  // Above 48 KiB a kernel must ask for its dynamic shared memory (once per
  // kernel; repeating it is cheap and thread-safe).
  if (cudaError_t e =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
      e != cudaSuccess) {
    return absl::InternalError(absl::StrCat(what, ": cudaFuncSetAttribute(", smem_bytes,
                                            " bytes of shared memory): ", cudaGetErrorString(e)));
  }
  kernel<<<grid, kThreads, smem_bytes, stream>>>(args...);
  return internal::CheckLaunch(what);
}

// Calls fn(TypeTag<F>{}, std::integral_constant<int, HS>{}) for a supported
// (dtype, hs).
template <typename Fn>
absl::Status DispatchFlash(DataType dtype, int hs, Fn&& fn) {
  auto by_hs = [&](auto tag) -> absl::Status {
    if (hs == 64) return fn(tag, std::integral_constant<int, 64>{});
    if (hs == 128) return fn(tag, std::integral_constant<int, 128>{});
    return absl::InvalidArgumentError(
        absl::StrCat("flash attention: head size ", hs, " (supported: 64, 128)"));
  };
  if (dtype == DataType::kBFloat16) return by_hs(internal::TypeTag<__nv_bfloat16>{});
  if (dtype == DataType::kFloat16) return by_hs(internal::TypeTag<__half>{});
  return absl::InvalidArgumentError("flash attention: the compute type must be bf16 or fp16");
}

absl::Status CheckFlash(const char* kernel, DataType dtype, int B, int T, int C, int NH, int KVH,
                        std::initializer_list<const void*> pointers) {
  if (!FlashAttentionSupports(dtype, C, NH, KVH)) {
    return absl::InvalidArgumentError(absl::StrCat(kernel, ": unsupported (", DataTypeName(dtype),
                                                   ", C ", C, ", NH ", NH, ", KVH ", KVH,
                                                   "): see FlashAttentionSupports"));
  }
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckNonNegative(kernel, "B", B));
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckNonNegative(kernel, "T", T));
  if (B > 65535) return absl::InvalidArgumentError(absl::StrCat(kernel, ": B > 65535: ", B));
  for (const void* p : pointers) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) {
      return absl::InvalidArgumentError(absl::StrCat(kernel, ": a tensor is not 16-byte aligned"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

bool FlashAttentionSupports(DataType dtype, int C, int NH, int KVH) {
  if (NH < 1 || KVH < 1 || C % NH != 0 || NH % KVH != 0 || NH > 65535) return false;
  // hs 64 or 128: C and the qkv rows are then whole int4s.
  return model::FlashAttentionApplies(dtype, C / NH);
}

absl::Status FlashAttentionForward(const KernelCtx& ctx, void* out, float* lse, const void* qkv,
                                   int B, int T, int C, int NH, int KVH) {
  constexpr const char* kName = "FlashAttentionForward";
  SHARDTRAIN_RETURN_IF_ERROR(CheckFlash(kName, ctx.dtype, B, T, C, NH, KVH, {out, qkv}));
  if (B == 0 || T == 0) return absl::OkStatus();
  const int hs = C / NH;
  const float scale_log2 = kLog2e / std::sqrt(static_cast<float>(hs));
  const dim3 grid((T + kTile - 1) / kTile, NH, B);
  return DispatchFlash(ctx.dtype, hs, [&](auto tag, auto hs_c) {
    using F = typename decltype(tag)::type;
    constexpr int HS = decltype(hs_c)::value;
    return Launch(kName, FlashForwardKernel<F, HS>, grid, Smem<HS>::kForward, ctx.stream,
                  static_cast<F*>(out), lse, static_cast<const F*>(qkv), T, C, NH, KVH, scale_log2);
  });
}

absl::Status FlashAttentionBackward(const KernelCtx& ctx, void* dqkv, float* D, const void* dout,
                                    const void* qkv, const void* out, const float* lse, int B,
                                    int T, int C, int NH, int KVH) {
  constexpr const char* kName = "FlashAttentionBackward";
  SHARDTRAIN_RETURN_IF_ERROR(
      CheckFlash(kName, ctx.dtype, B, T, C, NH, KVH, {dqkv, dout, qkv, out}));
  if (B == 0 || T == 0) return absl::OkStatus();
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int tiles = (T + kTile - 1) / kTile;
  return DispatchFlash(ctx.dtype, hs, [&](auto tag, auto hs_c) -> absl::Status {
    using F = typename decltype(tag)::type;
    constexpr int HS = decltype(hs_c)::value;
    // dQ first: it leaves D for dK/dV.
    SHARDTRAIN_RETURN_IF_ERROR(Launch(
        "FlashAttentionBackward (dQ)", FlashBackwardQKernel<F, HS>, dim3(tiles, NH, B),
        Smem<HS>::kBackwardQ, ctx.stream, static_cast<F*>(dqkv), D, static_cast<const F*>(dout),
        static_cast<const F*>(qkv), static_cast<const F*>(out), lse, T, C, NH, KVH, scale));
    return Launch("FlashAttentionBackward (dK, dV)", FlashBackwardKvKernel<F, HS>,
                  dim3(tiles, KVH, B), Smem<HS>::kBackwardKv, ctx.stream, static_cast<F*>(dqkv),
                  static_cast<const F*>(dout), static_cast<const F*>(qkv), lse,
                  static_cast<const float*>(D), T, C, NH, KVH, scale);
  });
}

}  // namespace shardtrain::engine::cuda
