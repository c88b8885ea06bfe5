// Flash attention (kernels.h): causal, multi-head or grouped-query, forward
// and backward without the (T,T) matrix, on tensor cores (WMMA, 16-bit
// operands, fp32 accumulation), for bf16 and fp16 compute and head sizes 64
// and 128. The materialized kernels of attention.cu stay the reference (and
// serve fp32, which never runs on TF32 here) — the tests compare both with
// the CPU.
//
// Tiles. A block of kThreads = 128 threads (4 warps) owns kTile = 64 rows:
// each warp 16 of them. Q, K, V and dout tiles are staged in shared memory
// as 16-bit rows of HS (+8 padding) elements, scores as fp32 rows; every
// product is a 16×16×16 WMMA fragment loop over shared memory.
//
// Forward (one block per (query tile, head, sequence); the longest rows
// first): for each key tile up to the diagonal, S = Q·K^T (scaled, in log2
// units), the online softmax per row (two lanes per row: running max m and
// sum l), P rounded to the compute type, O (fp32, in shared memory) scaled
// by exp2(m_old - m_new) and += P·V. out = O / l; lse = (m + log2 l)·ln 2,
// the natural-log logsumexp of the row, saved for backward (and for a ring's
// merge).
//
// Backward (FlashAttention-2's, without atomics): D = rowsum(dout ∘ out)
// (AttentionRowDot), then
//   - one block per (key tile, kv head, sequence): for each query head of
//     the group in order and each query tile from the diagonal on, P^T =
//     exp(K·Q^T·s − lse), dP^T = V·dout^T, dS^T = P^T ∘ (dP^T − D)·s;
//     dV += P^T·dout, dK += dS^T·Q in fragments, added to dqkv once;
//   - one block per (query tile, head, sequence): for each key tile up to
//     the diagonal the same P and dS, dQ += dS·K, added to dqkv once.
// Each element of dqkv is written by one thread after a fixed-order sum:
// the same inputs give the same bits.
#include <mma.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/model/activations.h"
#include "worker/engine/cuda/kernel_util.cuh"
#include "worker/engine/cuda/kernels.h"

namespace shardtrain::engine::cuda {
namespace {

using internal::kFullMask;
using internal::kWarpSize;
using internal::Load;
using internal::Store;
namespace wmma = nvcuda::wmma;

constexpr int kTile = 64;                      // rows (queries or keys) per tile
constexpr int kThreads = 128;                  // 4 warps of 16 rows
constexpr int kWarpRows = 16;                  // a WMMA fragment's rows
constexpr int kVec = 8;                        // 16-bit elements per int4
constexpr float kLog2e = 1.4426950408889634f;  // log2(e)
constexpr float kLn2 = 0.6931471805599453f;    // ln(2)

// Shared-memory strides (elements) and region sizes (bytes): all multiples
// of 32 bytes, as WMMA's pointers must be.
template <int HS>
struct Smem {
  static constexpr int kLd = HS + 8;                          // 16-bit rows of HS
  static constexpr int kLdP = kTile + 8;                      // 16-bit rows of kTile
  static constexpr int kLdF = (HS > kTile ? HS : kTile) + 4;  // fp32 rows
  static constexpr int kRows16 = kTile * kLd * 2;             // bytes of one HS tile
  static constexpr int kRowsP = kTile * kLdP * 2;             // bytes of one P tile
  static constexpr int kRowsF = kTile * kLdF * 4;             // bytes of one fp32 tile
  static constexpr int kStats = 2 * kTile * 4;                // lse and D of a tile, fp32
  // Forward: q, k and v twice (double-buffered), f (fp32 scores; P in
  // place), o (fp32).
  static constexpr int kForward = 5 * kRows16 + 2 * kRowsF;
  // dK/dV: k, v, q and dout twice, f (fp32; dS in place), p, lse and D
  // twice.
  static constexpr int kBackwardKv = 6 * kRows16 + kRowsF + kRowsP + 2 * kStats;
  // dQ: q, dout, k and v twice, f (fp32; dS in place).
  static constexpr int kBackwardQ = 6 * kRows16 + kRowsF;
};

template <typename F>
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, F, wmma::row_major>;
template <typename F, typename Layout>
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, F, Layout>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// ---- asynchronous copies (sm_80+): a tile arrives while the last one is used

__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N of this thread's committed groups are in flight.
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Starts dst[r][c] (stride Smem::kLd) = src[(row0 + r)·ld + c] for the
// tile's 64 rows and HS columns, 16 bytes per copy; rows at or past T are
// zeros (stored at once). Visible to the block after CpAsyncWait and
// __syncthreads.
template <typename F, int HS>
__device__ __forceinline__ void LoadTile(F* dst, const F* src, int row0, int T, int64_t ld) {
  constexpr int kPerRow = HS / kVec;
  for (int e = threadIdx.x; e < kTile * kPerRow; e += kThreads) {
    const int r = e / kPerRow, c = (e % kPerRow) * kVec;
    F* d = dst + r * Smem<HS>::kLd + c;
    if (row0 + r < T) {
      CpAsync16(d, src + (row0 + r) * ld + c);
    } else {
      *reinterpret_cast<int4*>(d) = make_int4(0, 0, 0, 0);
    }
  }
}

// The warp's 16 rows of a tile (row-major, stride Smem::kLd) as A fragments,
// held in registers across the key (or query) tiles.
template <typename F, int HS>
__device__ __forceinline__ void LoadRows(FragA<F> (&a)[HS / 16], const F* rows) {
#pragma unroll
  for (int kk = 0; kk < HS / 16; ++kk) wmma::load_matrix_sync(a[kk], rows + kk * 16, Smem<HS>::kLd);
}

// f (16 × kTile, stride ldf, fp32) = a · b^T, a the warp's 16 rows of HS
// (held fragments), b kTile rows of HS (stride Smem::kLd): the warp's rows
// against a tile's rows (Q·K^T, K·Q^T, dout·V^T, V·dout^T).
template <typename F, int HS>
__device__ __forceinline__ void RowsTimesTileT(float* f, int ldf, const FragA<F> (&a)[HS / 16],
                                               const F* b) {
#pragma unroll
  for (int nb = 0; nb < kTile / 16; ++nb) {
    FragC acc;
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int kk = 0; kk < HS / 16; ++kk) {
      FragB<F, wmma::col_major> fb;
      wmma::load_matrix_sync(fb, b + nb * 16 * Smem<HS>::kLd + kk * 16, Smem<HS>::kLd);
      wmma::mma_sync(acc, a[kk], fb, acc);
    }
    wmma::store_matrix_sync(f + nb * 16, acc, ldf, wmma::mem_row_major);
  }
}

// acc[n] (16 × HS in fragments) += p (16 × kTile, row-major, stride ldp) ·
// tile (kTile × HS, row-major, stride Smem::kLd).
template <typename F, int HS>
__device__ __forceinline__ void AccumulateRowsTimesTile(FragC (&acc)[HS / 16], const F* p, int ldp,
                                                        const F* tile) {
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) {
    FragA<F> fa;
    wmma::load_matrix_sync(fa, p + kk * 16, ldp);
#pragma unroll
    for (int nb = 0; nb < HS / 16; ++nb) {
      FragB<F, wmma::row_major> fb;
      wmma::load_matrix_sync(fb, tile + kk * 16 * Smem<HS>::kLd + nb * 16, Smem<HS>::kLd);
      wmma::mma_sync(acc[nb], fa, fb, acc[nb]);
    }
  }
}

// dst (global, 16 rows of stride ld from row0, HS columns) += acc, through
// the warp's fp32 rows f (stride Smem::kLdF); rows at or past T skipped.
template <typename F, int HS>
__device__ __forceinline__ void AddRows(F* dst, int64_t ld, int row0, int T, FragC (&acc)[HS / 16],
                                        float* f) {
#pragma unroll
  for (int nb = 0; nb < HS / 16; ++nb) {
    wmma::store_matrix_sync(f + nb * 16, acc[nb], Smem<HS>::kLdF, wmma::mem_row_major);
  }
  __syncwarp();
  const int lane = threadIdx.x % kWarpSize;
  for (int e = lane; e < kWarpRows * HS; e += kWarpSize) {
    const int r = e / HS, c = e % HS;
    if (row0 + r >= T) continue;
    F* d = dst + (row0 + r) * ld + c;
    *d = Store<F>(Load(*d) + f[r * Smem<HS>::kLdF + c]);
  }
  __syncwarp();
}

// Causal visibility of (row, column) pairs of a warp's 16 rows against a
// tile: rows are queries (forward, dQ) or keys (dK/dV).
struct PairGeometry {
  int row0, col0;  // the first row's and column's positions
  bool rows_are_queries;
  int T;
  __device__ __forceinline__ bool Visible(int r, int c) const {
    const int i = rows_are_queries ? row0 + r : col0 + c;  // query
    const int j = rows_are_queries ? col0 + c : row0 + r;  // key
    return j <= i && i < T;
  }
};

template <typename F, int HS>
__global__ void __launch_bounds__(kThreads)
    FlashForwardKernel(F* out, float* lse, const F* qkv, int T, int C, int NH, int KVH,
                       float scale_log2) {
  using S = Smem<HS>;
  extern __shared__ __align__(128) unsigned char smem[];
  F* const sq = reinterpret_cast<F*>(smem);
  // Buffer i of K and of V (pointer arithmetic: an array would live in
  // local memory).
  auto sk = [&](int i) { return reinterpret_cast<F*>(smem + (1 + i) * S::kRows16); };
  auto sv = [&](int i) { return reinterpret_cast<F*>(smem + (3 + i) * S::kRows16); };
  float* const sf = reinterpret_cast<float*>(smem + 5 * S::kRows16);
  float* const so = reinterpret_cast<float*>(smem + 5 * S::kRows16 + S::kRowsF);
  const int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int KV = KVH * HS, W = C + 2 * KV, kvh = h / (NH / KVH);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int q0 = qt * kTile;
  const F* const seq = qkv + int64_t{b} * T * W;
  const F* const keys = seq + C + kvh * HS;
  const F* const values = seq + C + KV + kvh * HS;
  LoadTile<F, HS>(sq, seq + h * HS, q0, T, W);
  LoadTile<F, HS>(sk(0), keys, 0, T, W);
  LoadTile<F, HS>(sv(0), values, 0, T, W);
  CpAsyncCommit();
  for (int e = threadIdx.x; e < kTile * S::kLdF; e += kThreads) so[e] = 0.0f;
  // Two lanes per row: r the block's row, half the columns [32·half, +32)
  // of a score row.
  const int rl = lane / 2, r = warp * kWarpRows + rl, half = lane % 2, qi = q0 + r;
  float m = -INFINITY, l = 0.0f;
  float* const wf = sf + warp * kWarpRows * S::kLdF;
  F* const wp = reinterpret_cast<F*>(wf);  // P over the warp's scores, once read
  float* const wo = so + warp * kWarpRows * S::kLdF;
  FragA<F> qa[HS / 16];
  for (int kt = 0; kt <= qt; ++kt) {
    const int buf = kt & 1;
    if (kt < qt) {  // the next tile's K and V arrive while this one is used
      LoadTile<F, HS>(sk(buf ^ 1), keys, (kt + 1) * kTile, T, W);
      LoadTile<F, HS>(sv(buf ^ 1), values, (kt + 1) * kTile, T, W);
      CpAsyncCommit();
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();
    if (kt == 0) LoadRows<F, HS>(qa, sq + warp * kWarpRows * S::kLd);
    RowsTimesTileT<F, HS>(wf, S::kLdF, qa, sk(buf));
    __syncwarp();
    // Every tile up to the diagonal holds a visible key for each row
    // (key kt·64 <= q0 <= qi), so the new max is finite.
    float v[32];
    float mx = -INFINITY;
    const float* srow = wf + rl * S::kLdF + half * 32;
#pragma unroll
    for (int c = 0; c < 32; ++c) {
      const int j = kt * kTile + half * 32 + c;
      v[c] = j <= qi ? srow[c] * scale_log2 : -INFINITY;
      mx = fmaxf(mx, v[c]);
    }
    mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 1));
    const float m_new = fmaxf(m, mx), alpha = exp2f(m - m_new);
    __syncwarp();  // every lane has read its scores: P may overwrite them
    float sum = 0.0f;
    F* const prow = wp + rl * S::kLdP + half * 32;
#pragma unroll
    for (int c = 0; c < 32; ++c) {
      const float p = exp2f(v[c] - m_new);
      prow[c] = Store<F>(p);
      sum += p;
    }
    sum += __shfl_xor_sync(kFullMask, sum, 1);
    l = l * alpha + sum;
    m = m_new;
    float* const orow = so + r * S::kLdF + half * (HS / 2);
#pragma unroll
    for (int c = 0; c < HS / 2; ++c) orow[c] *= alpha;
    __syncwarp();
    FragC acc[HS / 16];
#pragma unroll
    for (int nb = 0; nb < HS / 16; ++nb) {
      wmma::load_matrix_sync(acc[nb], wo + nb * 16, S::kLdF, wmma::mem_row_major);
    }
    AccumulateRowsTimesTile<F, HS>(acc, wp, S::kLdP, sv(buf));
#pragma unroll
    for (int nb = 0; nb < HS / 16; ++nb) {
      wmma::store_matrix_sync(wo + nb * 16, acc[nb], S::kLdF, wmma::mem_row_major);
    }
    __syncthreads();  // this tile's K and V are consumed: the next load may reuse them
  }
  if (qi >= T) return;
  const float inv = 1.0f / l;
  F* const orow = out + (int64_t{b} * T + qi) * C + h * HS + half * (HS / 2);
  const float* const src = so + r * S::kLdF + half * (HS / 2);
  for (int c = 0; c < HS / 2; ++c) orow[c] = Store<F>(src[c] * inv);
  if (half == 0) lse[(int64_t{b} * NH + h) * T + qi] = (m + log2f(l)) * kLn2;
}

// dK and dV of one key tile of one kv head: its query heads in order, each
// query tile from the diagonal on (double-buffered), the warp's 16 keys'
// K and V held as fragments.
template <typename F, int HS>
__global__ void __launch_bounds__(kThreads)
    FlashBackwardKvKernel(F* dqkv, const F* dout, const F* qkv, const float* lse_all,
                          const float* D_all, int T, int C, int NH, int KVH, float scale) {
  using S = Smem<HS>;
  extern __shared__ __align__(128) unsigned char smem[];
  F* const sk = reinterpret_cast<F*>(smem);
  F* const sv = reinterpret_cast<F*>(smem + S::kRows16);
  auto sq = [&](int i) { return reinterpret_cast<F*>(smem + (2 + i) * S::kRows16); };
  auto sd = [&](int i) { return reinterpret_cast<F*>(smem + (4 + i) * S::kRows16); };
  float* const sf = reinterpret_cast<float*>(smem + 6 * S::kRows16);
  F* const sp = reinterpret_cast<F*>(smem + 6 * S::kRows16 + S::kRowsF);
  float* const stats = reinterpret_cast<float*>(smem + 6 * S::kRows16 + S::kRowsF + S::kRowsP);
  const int tiles = (T + kTile - 1) / kTile;
  const int kt = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
  const int G = NH / KVH, KV = KVH * HS, W = C + 2 * KV;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int k0 = kt * kTile;
  const F* const seq = qkv + int64_t{b} * T * W;
  const float scale_log2 = scale * kLog2e;
  // The (head, query tile) pairs this block visits, in order: n per head.
  const int n = tiles - kt, pairs = G * n;
  // Starts the loads of pair idx into buffer buf: Q, dout, lse·log2(e), D.
  auto load = [&](int idx, int buf) {
    const int h = kvh * G + idx / n, q0 = (kt + idx % n) * kTile;
    LoadTile<F, HS>(sq(buf), seq + h * HS, q0, T, W);
    LoadTile<F, HS>(sd(buf), dout + int64_t{b} * T * C + h * HS, q0, T, C);
    const int64_t at = (int64_t{b} * NH + h) * T + q0;
    float* const st = stats + buf * 2 * kTile;
    for (int e = threadIdx.x; e < kTile; e += kThreads) {
      st[e] = q0 + e < T ? lse_all[at + e] * kLog2e : 0.0f;
      st[kTile + e] = q0 + e < T ? D_all[at + e] : 0.0f;
    }
  };
  LoadTile<F, HS>(sk, seq + C + kvh * HS, k0, T, W);
  LoadTile<F, HS>(sv, seq + C + KV + kvh * HS, k0, T, W);
  load(0, 0);
  CpAsyncCommit();
  FragC dk[HS / 16], dv[HS / 16];
#pragma unroll
  for (int nb = 0; nb < HS / 16; ++nb) {
    wmma::fill_fragment(dk[nb], 0.0f);
    wmma::fill_fragment(dv[nb], 0.0f);
  }
  const int rl = lane / 2, half = lane % 2;
  float* const wf = sf + warp * kWarpRows * S::kLdF;
  F* const wds = reinterpret_cast<F*>(wf);  // dS^T over the warp's dP^T, once read
  F* const wp = sp + warp * kWarpRows * S::kLdP;
  FragA<F> ka[HS / 16], va[HS / 16];
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
    if (idx == 0) {
      LoadRows<F, HS>(ka, sk + warp * kWarpRows * S::kLd);
      LoadRows<F, HS>(va, sv + warp * kWarpRows * S::kLd);
    }
    const float* const slse = stats + buf * 2 * kTile;
    const float* const sD = slse + kTile;
    const int q0 = (kt + idx % n) * kTile;
    const PairGeometry geo{k0 + warp * kWarpRows, q0 + half * 32, false, T};
    // P^T: this warp's keys against the tile's queries.
    RowsTimesTileT<F, HS>(wf, S::kLdF, ka, sq(buf));
    __syncwarp();
    float p[32];
    {
      const float* srow = wf + rl * S::kLdF + half * 32;
      F* const prow = wp + rl * S::kLdP + half * 32;
#pragma unroll
      for (int c = 0; c < 32; ++c) {
        p[c] = geo.Visible(rl, c) ? exp2f(srow[c] * scale_log2 - slse[half * 32 + c]) : 0.0f;
        prow[c] = Store<F>(p[c]);
      }
    }
    __syncwarp();
    // dP^T = V · dout^T, then dS^T = P^T ∘ (dP^T − D) · s over it.
    RowsTimesTileT<F, HS>(wf, S::kLdF, va, sd(buf));
    __syncwarp();
    {
      const float* srow = wf + rl * S::kLdF + half * 32;
#pragma unroll
      for (int c = 0; c < 32; ++c) p[c] = p[c] * (srow[c] - sD[half * 32 + c]) * scale;
      __syncwarp();
      F* const dsrow = wds + rl * S::kLdP + half * 32;
#pragma unroll
      for (int c = 0; c < 32; ++c) dsrow[c] = Store<F>(p[c]);
    }
    __syncwarp();
    AccumulateRowsTimesTile<F, HS>(dv, wp, S::kLdP, sd(buf));
    AccumulateRowsTimesTile<F, HS>(dk, wds, S::kLdP, sq(buf));
    __syncthreads();  // this pair's buffers are consumed: the next load may reuse them
  }
  F* const dseq = dqkv + int64_t{b} * T * W;
  AddRows<F, HS>(dseq + C + kvh * HS, W, k0 + warp * kWarpRows, T, dk, wf);
  AddRows<F, HS>(dseq + C + KV + kvh * HS, W, k0 + warp * kWarpRows, T, dv, wf);
}

// dQ of one query tile of one head: every key tile up to the diagonal
// (double-buffered), the warp's 16 rows of Q and dout held as fragments.
template <typename F, int HS>
__global__ void __launch_bounds__(kThreads)
    FlashBackwardQKernel(F* dqkv, const F* dout, const F* qkv, const float* lse_all,
                         const float* D_all, int T, int C, int NH, int KVH, float scale) {
  using S = Smem<HS>;
  extern __shared__ __align__(128) unsigned char smem[];
  F* const sq = reinterpret_cast<F*>(smem);
  F* const sd = reinterpret_cast<F*>(smem + S::kRows16);
  auto sk = [&](int i) { return reinterpret_cast<F*>(smem + (2 + i) * S::kRows16); };
  auto sv = [&](int i) { return reinterpret_cast<F*>(smem + (4 + i) * S::kRows16); };
  float* const sf = reinterpret_cast<float*>(smem + 6 * S::kRows16);
  const int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int KV = KVH * HS, W = C + 2 * KV, kvh = h / (NH / KVH);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int q0 = qt * kTile;
  const F* const seq = qkv + int64_t{b} * T * W;
  const F* const keys = seq + C + kvh * HS;
  const F* const values = seq + C + KV + kvh * HS;
  LoadTile<F, HS>(sq, seq + h * HS, q0, T, W);
  LoadTile<F, HS>(sd, dout + int64_t{b} * T * C + h * HS, q0, T, C);
  LoadTile<F, HS>(sk(0), keys, 0, T, W);
  LoadTile<F, HS>(sv(0), values, 0, T, W);
  CpAsyncCommit();
  const int rl = lane / 2, r = warp * kWarpRows + rl, half = lane % 2, qi = q0 + r;
  const int64_t at = (int64_t{b} * NH + h) * T + qi;
  const float lse = qi < T ? lse_all[at] * kLog2e : 0.0f, D = qi < T ? D_all[at] : 0.0f;
  const float scale_log2 = scale * kLog2e;
  float* const wf = sf + warp * kWarpRows * S::kLdF;
  F* const wds = reinterpret_cast<F*>(wf);
  FragC dq[HS / 16];
#pragma unroll
  for (int nb = 0; nb < HS / 16; ++nb) wmma::fill_fragment(dq[nb], 0.0f);
  FragA<F> qa[HS / 16], da[HS / 16];
  for (int kt = 0; kt <= qt; ++kt) {
    const int buf = kt & 1;
    if (kt < qt) {
      LoadTile<F, HS>(sk(buf ^ 1), keys, (kt + 1) * kTile, T, W);
      LoadTile<F, HS>(sv(buf ^ 1), values, (kt + 1) * kTile, T, W);
      CpAsyncCommit();
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();
    if (kt == 0) {
      LoadRows<F, HS>(qa, sq + warp * kWarpRows * S::kLd);
      LoadRows<F, HS>(da, sd + warp * kWarpRows * S::kLd);
    }
    const PairGeometry geo{q0 + warp * kWarpRows, kt * kTile + half * 32, true, T};
    RowsTimesTileT<F, HS>(wf, S::kLdF, qa, sk(buf));
    __syncwarp();
    float p[32];
    const float* srow = wf + rl * S::kLdF + half * 32;
#pragma unroll
    for (int c = 0; c < 32; ++c) {
      p[c] = geo.Visible(rl, c) ? exp2f(srow[c] * scale_log2 - lse) : 0.0f;
    }
    __syncwarp();
    RowsTimesTileT<F, HS>(wf, S::kLdF, da, sv(buf));
    __syncwarp();
#pragma unroll
    for (int c = 0; c < 32; ++c) p[c] = p[c] * (srow[c] - D) * scale;
    __syncwarp();
    F* const dsrow = wds + rl * S::kLdP + half * 32;
#pragma unroll
    for (int c = 0; c < 32; ++c) dsrow[c] = Store<F>(p[c]);
    __syncwarp();
    AccumulateRowsTimesTile<F, HS>(dq, wds, S::kLdP, sk(buf));
    __syncthreads();
  }
  AddRows<F, HS>(dqkv + int64_t{b} * T * W + h * HS, W, q0 + warp * kWarpRows, T, dq, wf);
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
  SHARDTRAIN_RETURN_IF_ERROR(AttentionRowDot(ctx, D, dout, out, B, T, C, NH));
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int tiles = (T + kTile - 1) / kTile;
  return DispatchFlash(ctx.dtype, hs, [&](auto tag, auto hs_c) -> absl::Status {
    using F = typename decltype(tag)::type;
    constexpr int HS = decltype(hs_c)::value;
    SHARDTRAIN_RETURN_IF_ERROR(Launch(
        "FlashAttentionBackward (dK, dV)", FlashBackwardKvKernel<F, HS>, dim3(tiles, KVH, B),
        Smem<HS>::kBackwardKv, ctx.stream, static_cast<F*>(dqkv), static_cast<const F*>(dout),
        static_cast<const F*>(qkv), lse, static_cast<const float*>(D), T, C, NH, KVH, scale));
    return Launch("FlashAttentionBackward (dQ)", FlashBackwardQKernel<F, HS>, dim3(tiles, NH, B),
                  Smem<HS>::kBackwardQ, ctx.stream, static_cast<F*>(dqkv),
                  static_cast<const F*>(dout), static_cast<const F*>(qkv), lse,
                  static_cast<const float*>(D), T, C, NH, KVH, scale);
  });
}

}  // namespace shardtrain::engine::cuda
