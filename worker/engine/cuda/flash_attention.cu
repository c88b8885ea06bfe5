// Flash attention (kernels.h): causal, multi-head or grouped-query, forward
// and backward without the (T,T) matrix, on tensor cores (mma.sync
// m16n8k16, 16-bit operands, fp32 accumulation), for bf16 and fp16 compute
// and head sizes 64 and 128. The materialized kernels of attention.cu stay
// the reference (and serve fp32, which never runs on TF32 here) — the tests
// compare both with the CPU.
//
// Tiles. A block of kThreads = 128 threads (4 warps) owns 64·MT rows: each
// warp 16·MT of them (Smem: MT = 2 for head size 64). Q, K, V and dout tiles are staged in shared memory
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
#include "worker/engine/cuda/kernel_util.cuh"
#include "worker/engine/cuda/kernels.h"

namespace shardtrain::engine::cuda {
namespace {

using internal::kFullMask;
using internal::kWarpSize;

constexpr int kTile = 64;                      // keys per forward / dQ step
constexpr int kThreads = 128;                  // 4 warps
constexpr int kWarps = kThreads / 32;
constexpr int kWarpRows = 16;                  // an m16 fragment's rows
constexpr int kVec = 8;                        // 16-bit elements per int4
constexpr float kLog2e = 1.4426950408889634f;  // log2(e)
constexpr float kLn2 = 0.6931471805599453f;    // ln(2)

// Shapes by head size: each warp owns MT m16 fragments of rows (queries in
// forward and dQ, keys in dK/dV), so every K, V (or Q, dout) fragment read
// from shared memory feeds MT products; a block owns 4·16·MT rows. Each
// kernel has its own MT, chosen by the bench's per-kernel profile (H200,
// GPT-2 124M, ms per step at MT = 1 → 2): forward 2.48 → 2.44, dQ 3.27 →
// 4.06, dK/dV 4.47 → 8.67 — the backward kernels' accumulators then fill
// the registers (one or two blocks per SM), so they keep MT = 1.
template <int HS>
struct Smem {
  static constexpr int kForwardMT = HS == 64 ? 2 : 1;
  static constexpr int kQMT = 1;
  static constexpr int kKvMT = 1;
  static constexpr int Rows(int mt) { return kWarps * kWarpRows * mt; }
  // dK/dV's queries per step: as many as the registers allow.
  static constexpr int kKvQTile = HS == 64 && kKvMT == 1 ? 64 : 32;
  static constexpr int kLd = HS + 8;  // 16-bit rows of HS: 16 bytes of skew
  static constexpr int kRowBytes = kLd * 2;
  // Forward: q, then k and v (kTile each) twice (double-buffered).
  static constexpr int kForward = (Rows(kForwardMT) + 4 * kTile) * kRowBytes;
  // dK/dV: k, v, then q and dout (kKvQTile each) twice, then lse and D
  // twice.
  static constexpr int kBackwardKv =
      (2 * Rows(kKvMT) + 4 * kKvQTile) * kRowBytes + 2 * 2 * kKvQTile * 4;
  // dQ: q, dout, then k and v (kTile each) twice.
  static constexpr int kBackwardQ = (2 * Rows(kQMT) + 4 * kTile) * kRowBytes;
};

// ---- asynchronous copies (sm_80+): a tile arrives while the last one is used

__device__ __forceinline__ unsigned SmemAddress(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(SmemAddress(smem)), "l"(gmem));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N of this thread's committed groups are in flight.
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Starts dst[r][c] (stride Smem::kLd) = src[(row0 + r)·ld + c] for ROWS
// rows and HS columns, 16 bytes per copy; rows at or past T are zeros
// (stored at once). Visible to the block after CpAsyncWait and
// __syncthreads.
template <typename F, int HS, int ROWS>
__device__ __forceinline__ void LoadTile(F* dst, const F* src, int row0, int T, int64_t ld) {
  constexpr int kPerRow = HS / kVec;
  for (int e = threadIdx.x; e < ROWS * kPerRow; e += kThreads) {
    const int r = e / kPerRow, c = (e % kPerRow) * kVec;
    F* d = dst + r * Smem<HS>::kLd + c;
    if (row0 + r < T) {
      CpAsync16(d, src + (row0 + r) * ld + c);
    } else {
      *reinterpret_cast<int4*>(d) = make_int4(0, 0, 0, 0);
    }
  }
}

// ---- warp-level tensor-core products (PTX ISA: mma.m16n8k16, ldmatrix)
//
// A lane = 4·g + t holds, of an m16n8 fp32 accumulator, rows g and g + 8 at
// columns 2t, 2t + 1 (c[0], c[1] row g; c[2], c[3] row g + 8); of an m16k16
// A operand the same rows at k = 2t, 2t + 1 (a[0], a[1]) and 2t + 8, 2t + 9
// (a[2], a[3]), two 16-bit values per register; of a k16n8 B operand column
// g at k = 2t, 2t + 1 and 2t + 8, 2t + 9.

template <typename F>
__device__ __forceinline__ uint32_t Pack(float lo, float hi) {
  uint32_t r;
  if constexpr (std::is_same_v<F, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    memcpy(&r, &v, 4);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    memcpy(&r, &v, 4);
  }
  return r;
}
template <typename F>
__device__ __forceinline__ float2 Unpack(uint32_t r) {
  if constexpr (std::is_same_v<F, __nv_bfloat16>) {
    __nv_bfloat162 v;
    memcpy(&v, &r, 4);
    return __bfloat1622float2(v);
  } else {
    __half2 v;
    memcpy(&v, &r, 4);
    return __half22float2(v);
  }
}

// d (m16n8, fp32) += a (m16k16) · (b0, b1) (k16n8).
template <typename F>
__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  if constexpr (std::is_same_v<F, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Four 8×8 matrices of 16-bit values from shared memory; lane l gives the
// address of row l % 8 of matrix l / 8. Transposed: each lane receives a
// column pair instead of a row pair.
__device__ __forceinline__ void LdMatrix(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddress(p)));
}
__device__ __forceinline__ void LdMatrixTrans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddress(p)));
}

// The warp's MT·16 rows of HS (row-major in shared memory, stride
// Smem::kLd) as A fragments, per m-tile and k chunk.
template <typename F, int HS, int MT>
__device__ __forceinline__ void LoadRowFrags(uint32_t (&af)[MT][HS / 16][4], const F* a) {
  constexpr int kLd = Smem<HS>::kLd;
  const int lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int kk = 0; kk < HS / 16; ++kk) {  // rows 0-7 | 8-15 at k 0-7, then at k 8-15
      LdMatrix(af[mt][kk], a + (mt * 16 + lane % 16) * kLd + kk * 16 + (lane / 16) * 8);
    }
  }
}

// s (MT·16 × N, accumulators) = a · b^T: a the warp's rows of HS (held
// fragments), b N rows of HS, row-major in shared memory (stride
// Smem::kLd): the warp's rows against a tile's rows (Q·K^T, K·Q^T,
// dout·V^T, V·dout^T). Each fragment of b feeds MT products.
template <typename F, int HS, int N, int MT>
__device__ __forceinline__ void RowsTimesTileT(float (&s)[MT][N / 8][4],
                                               const uint32_t (&af)[MT][HS / 16][4], const F* b) {
  constexpr int kLd = Smem<HS>::kLd;
  const int lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int nt = 0; nt < N / 8; ++nt) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0;
  }
#pragma unroll
  for (int kk = 0; kk < HS / 16; ++kk) {
#pragma unroll
    for (int nb = 0; nb < N / 16; ++nb) {
      uint32_t bf[4];  // b rows 0-7 at k 0-7 | k 8-15, then rows 8-15
      LdMatrix(bf, b + (nb * 16 + lane % 8 + (lane / 16) * 8) * kLd + kk * 16 + (lane / 8 % 2) * 8);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        Mma<F>(s[mt][2 * nb], af[mt][kk], bf[0], bf[1]);
        Mma<F>(s[mt][2 * nb + 1], af[mt][kk], bf[2], bf[3]);
      }
    }
  }
}
// The same with a's fragments read from shared memory (a the warp's first
// row) one k chunk at a time: fewer registers held.
template <typename F, int HS, int N, int MT>
__device__ __forceinline__ void RowsTimesTileT(float (&s)[MT][N / 8][4], const F* a, const F* b) {
  constexpr int kLd = Smem<HS>::kLd;
  const int lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int nt = 0; nt < N / 8; ++nt) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0;
  }
#pragma unroll
  for (int kk = 0; kk < HS / 16; ++kk) {
    uint32_t af[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      LdMatrix(af[mt], a + (mt * 16 + lane % 16) * kLd + kk * 16 + (lane / 16) * 8);
    }
#pragma unroll
    for (int nb = 0; nb < N / 16; ++nb) {
      uint32_t bf[4];
      LdMatrix(bf, b + (nb * 16 + lane % 8 + (lane / 16) * 8) * kLd + kk * 16 + (lane / 8 % 2) * 8);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        Mma<F>(s[mt][2 * nb], af[mt], bf[0], bf[1]);
        Mma<F>(s[mt][2 * nb + 1], af[mt], bf[2], bf[3]);
      }
    }
  }
}

// acc (MT·16 × HS, accumulators) += p (MT·16 × N, accumulators, rounded to
// F) · tile (N × HS, row-major in shared memory): P·V, P^T·dout, dS^T·Q,
// dS·K.
template <typename F, int HS, int N, int MT>
__device__ __forceinline__ void AccumulateRowsTimesTile(float (&acc)[MT][HS / 8][4],
                                                        const float (&p)[MT][N / 8][4],
                                                        const F* tile) {
  constexpr int kLd = Smem<HS>::kLd;
  const int lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk) {
    uint32_t af[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      af[mt][0] = Pack<F>(p[mt][2 * kk][0], p[mt][2 * kk][1]);
      af[mt][1] = Pack<F>(p[mt][2 * kk][2], p[mt][2 * kk][3]);
      af[mt][2] = Pack<F>(p[mt][2 * kk + 1][0], p[mt][2 * kk + 1][1]);
      af[mt][3] = Pack<F>(p[mt][2 * kk + 1][2], p[mt][2 * kk + 1][3]);
    }
#pragma unroll
    for (int nb = 0; nb < HS / 16; ++nb) {
      uint32_t bf[4];  // tile rows k 0-7 | 8-15 at columns 0-7, then 8-15
      LdMatrixTrans(bf, tile + (kk * 16 + lane % 8 + (lane / 8 % 2) * 8) * kLd + nb * 16 +
                            (lane / 16) * 8);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        Mma<F>(acc[mt][2 * nb], af[mt], bf[0], bf[1]);
        Mma<F>(acc[mt][2 * nb + 1], af[mt], bf[2], bf[3]);
      }
    }
  }
}

// The accumulator element e of column tile nt: its row (0..15 of the warp's)
// and column.
__device__ __forceinline__ int FragRow(int e) { return threadIdx.x % kWarpSize / 4 + (e / 2) * 8; }
__device__ __forceinline__ int FragCol(int nt, int e) {
  return nt * 8 + (threadIdx.x % 4) * 2 + e % 2;
}

// dst (global, the warp's MT·16 rows of stride ld from row0, HS columns)
// += acc, each element by the one lane that holds it; rows at or past T
// skipped.
template <typename F, int HS, int MT>
__device__ __forceinline__ void AddRows(F* dst, int64_t ld, int row0, int T,
                                        const float (&acc)[MT][HS / 8][4]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row0 + mt * 16 + FragRow(2 * half);
      if (row >= T) continue;
#pragma unroll
      for (int nt = 0; nt < HS / 8; ++nt) {
        uint32_t* const d = reinterpret_cast<uint32_t*>(dst + row * ld + FragCol(nt, 0));
        const float2 old = Unpack<F>(*d);
        *d = Pack<F>(old.x + acc[mt][nt][2 * half], old.y + acc[mt][nt][2 * half + 1]);
      }
    }
  }
}

// The lane's softmax state of its 2·MT rows: scores s (log2 units, masked)
// folded in: running max m and the lane's part of the running sum l; o
// rescaled; s becomes P.
template <int HS, int N, int MT>
__device__ __forceinline__ void OnlineSoftmax(float (&s)[MT][N / 8][4], float (&m)[MT][2],
                                              float (&l)[MT][2], float (&o)[MT][HS / 8][4]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < N / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) mx[e / 2] = fmaxf(mx[e / 2], s[mt][nt][e]);
    }
    float alpha[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {  // a row's columns are spread over a quad's lanes
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(kFullMask, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(kFullMask, mx[i], 2));
      // Every row saw a visible key in its first tile (key 0), so m is
      // finite after it, even where this tile hides all of a row's keys.
      const float m_new = fmaxf(m[mt][i], mx[i]);
      alpha[i] = exp2f(m[mt][i] - m_new);
      m[mt][i] = m_new;
      l[mt][i] *= alpha[i];
    }
#pragma unroll
    for (int nt = 0; nt < N / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[mt][nt][e] = exp2f(s[mt][nt][e] - m[mt][e / 2]);
        l[mt][e / 2] += s[mt][nt][e];
      }
    }
#pragma unroll
    for (int nt = 0; nt < HS / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][nt][e] *= alpha[e / 2];
    }
  }
}

template <typename F, int HS>
__global__ void __launch_bounds__(kThreads)
    FlashForwardKernel(F* out, float* lse, const F* qkv, int T, int C, int NH, int KVH,
                       float scale_log2) {
  using S = Smem<HS>;
  constexpr int MT = S::kForwardMT, kRows = S::Rows(MT);
  extern __shared__ __align__(128) unsigned char smem[];
  F* const sq = reinterpret_cast<F*>(smem);
  // Buffer i of K and of V (pointer arithmetic: an array would live in
  // local memory).
  auto sk = [&](int i) { return reinterpret_cast<F*>(smem + (kRows + i * kTile) * S::kRowBytes); };
  auto sv = [&](int i) {
    return reinterpret_cast<F*>(smem + (kRows + (2 + i) * kTile) * S::kRowBytes);
  };
  const int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int KV = KVH * HS, W = C + 2 * KV, kvh = h / (NH / KVH);
  const int warp = threadIdx.x / kWarpSize;
  const int q0 = qt * kRows, row0 = q0 + warp * kWarpRows * MT;  // the warp's first query
  const int row_end = row0 + kWarpRows * MT;                      // past its last
  // Key tiles up to the block's last row (and T).
  const int tiles = (min(q0 + kRows, T) - 1) / kTile + 1;
  const F* const seq = qkv + int64_t{b} * T * W;
  const F* const keys = seq + C + kvh * HS;
  const F* const values = seq + C + KV + kvh * HS;
  LoadTile<F, HS, kRows>(sq, seq + h * HS, q0, T, W);
  LoadTile<F, HS, kTile>(sk(0), keys, 0, T, W);
  LoadTile<F, HS, kTile>(sv(0), values, 0, T, W);
  CpAsyncCommit();
  float m[MT][2], l[MT][2], o[MT][HS / 8][4] = {};
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.0f;
  uint32_t qf[MT][HS / 16][4];
  for (int kt = 0; kt < tiles; ++kt) {
    const int buf = kt & 1;
    if (kt + 1 < tiles) {  // the next tile's K and V arrive while this one is used
      LoadTile<F, HS, kTile>(sk(buf ^ 1), keys, (kt + 1) * kTile, T, W);
      LoadTile<F, HS, kTile>(sv(buf ^ 1), values, (kt + 1) * kTile, T, W);
      CpAsyncCommit();
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();
    if (kt == 0) LoadRowFrags<F, HS, MT>(qf, sq + warp * kWarpRows * MT * S::kLd);
    const int k0 = kt * kTile;
    if (k0 < row_end) {  // some key of the tile is visible to the warp's rows
      float s[MT][kTile / 8][4];
      RowsTimesTileT<F, HS, kTile, MT>(s, qf, sk(buf));
      const bool diagonal = k0 + kTile - 1 > row0;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int nt = 0; nt < kTile / 8; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const bool hidden = diagonal && k0 + FragCol(nt, e) > row0 + mt * 16 + FragRow(e);
            s[mt][nt][e] = hidden ? -INFINITY : s[mt][nt][e] * scale_log2;
          }
        }
      }
      OnlineSoftmax<HS, kTile, MT>(s, m, l, o);
      AccumulateRowsTimesTile<F, HS, kTile, MT>(o, s, sv(buf));
    }
    __syncthreads();  // this tile's K and V are consumed: the next load may reuse them
  }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float sum = l[mt][i];
      sum += __shfl_xor_sync(kFullMask, sum, 1);
      sum += __shfl_xor_sync(kFullMask, sum, 2);
      const int qi = row0 + mt * 16 + FragRow(2 * i);
      if (qi >= T) continue;
      const float inv = 1.0f / sum;
      F* const orow = out + (int64_t{b} * T + qi) * C + h * HS;
#pragma unroll
      for (int nt = 0; nt < HS / 8; ++nt) {
        *reinterpret_cast<uint32_t*>(orow + FragCol(nt, 0)) =
            Pack<F>(o[mt][nt][2 * i] * inv, o[mt][nt][2 * i + 1] * inv);
      }
      if (threadIdx.x % 4 == 0) {
        lse[(int64_t{b} * NH + h) * T + qi] = (m[mt][i] + log2f(sum)) * kLn2;
      }
    }
  }
}

// dK and dV of kRows keys of one kv head: its query heads in order, each
// query tile (kKvQTile rows) from the diagonal on (double-buffered); the
// warp's 16·MT keys' dK and dV in registers.
template <typename F, int HS>
__global__ void __launch_bounds__(kThreads)
    FlashBackwardKvKernel(F* dqkv, const F* dout, const F* qkv, const float* lse_all,
                          const float* D_all, int T, int C, int NH, int KVH, float scale) {
  using S = Smem<HS>;
  constexpr int MT = S::kKvMT, kRows = S::Rows(MT), QT = S::kKvQTile;
  extern __shared__ __align__(128) unsigned char smem[];
  F* const sk = reinterpret_cast<F*>(smem);
  F* const sv = reinterpret_cast<F*>(smem + kRows * S::kRowBytes);
  auto sq = [&](int i) {
    return reinterpret_cast<F*>(smem + (2 * kRows + i * QT) * S::kRowBytes);
  };
  auto sd = [&](int i) {
    return reinterpret_cast<F*>(smem + (2 * kRows + (2 + i) * QT) * S::kRowBytes);
  };
  float* const stats = reinterpret_cast<float*>(smem + (2 * kRows + 4 * QT) * S::kRowBytes);
  const int kt = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
  const int G = NH / KVH, KV = KVH * HS, W = C + 2 * KV;
  const int warp = threadIdx.x / kWarpSize;
  const int k0 = kt * kRows, row0 = k0 + warp * kWarpRows * MT;  // the warp's first key
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
  LoadTile<F, HS, kRows>(sk, seq + C + kvh * HS, k0, T, W);
  LoadTile<F, HS, kRows>(sv, seq + C + KV + kvh * HS, k0, T, W);
  load(0, 0);
  CpAsyncCommit();
  float dk[MT][HS / 8][4] = {}, dv[MT][HS / 8][4] = {};
  const F* const wk = sk + warp * kWarpRows * MT * S::kLd;
  const F* const wv = sv + warp * kWarpRows * MT * S::kLd;
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
    if (q0 + QT - 1 >= row0) {  // some query of the tile sees the warp's first key
      // Tiles across the warp's diagonal or past T hold hidden pairs.
      const bool edge = q0 < row0 + kWarpRows * MT || q0 + QT > T;
      // P^T: this warp's keys against the tile's queries.
      float p[MT][QT / 8][4];
      RowsTimesTileT<F, HS, QT, MT>(p, wk, sq(buf));
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int nt = 0; nt < QT / 8; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int c = FragCol(nt, e), qi = q0 + c;
            const bool hidden = edge && (row0 + mt * 16 + FragRow(e) > qi || qi >= T);
            p[mt][nt][e] = hidden ? 0.0f : exp2f(p[mt][nt][e] * scale_log2 - slse[c]);
          }
        }
      }
      // dP^T = V · dout^T, then dS^T = P^T ∘ (dP^T − D) · s in place.
      float ds[MT][QT / 8][4];
      RowsTimesTileT<F, HS, QT, MT>(ds, wv, sd(buf));
      AccumulateRowsTimesTile<F, HS, QT, MT>(dv, p, sd(buf));
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int nt = 0; nt < QT / 8; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            ds[mt][nt][e] = p[mt][nt][e] * (ds[mt][nt][e] - sD[FragCol(nt, e)]) * scale;
          }
        }
      }
      AccumulateRowsTimesTile<F, HS, QT, MT>(dk, ds, sq(buf));
    }
    __syncthreads();  // this pair's buffers are consumed: the next load may reuse them
  }
  F* const dseq = dqkv + int64_t{b} * T * W;
  AddRows<F, HS, MT>(dseq + C + kvh * HS, W, row0, T, dk);
  AddRows<F, HS, MT>(dseq + C + KV + kvh * HS, W, row0, T, dv);
}

// dQ of kRows queries of one head: every key tile up to the diagonal
// (double-buffered), in MT steps of kTile / MT keys (the registers); the
// warp's 16·MT rows' dQ in registers. Runs first: it also computes the rows' D = dout · out
// (a quad of lanes per row) and saves it in D_all for the dK/dV kernel.
template <typename F, int HS>
__global__ void __launch_bounds__(kThreads)
    FlashBackwardQKernel(F* dqkv, float* D_all, const F* dout, const F* qkv, const F* out,
                         const float* lse_all, int T, int C, int NH, int KVH, float scale) {
  using S = Smem<HS>;
  constexpr int MT = S::kQMT, kRows = S::Rows(MT), kStep = kTile / MT;
  extern __shared__ __align__(128) unsigned char smem[];
  F* const sq = reinterpret_cast<F*>(smem);
  F* const sd = reinterpret_cast<F*>(smem + kRows * S::kRowBytes);
  auto sk = [&](int i) {
    return reinterpret_cast<F*>(smem + (2 * kRows + i * kTile) * S::kRowBytes);
  };
  auto sv = [&](int i) {
    return reinterpret_cast<F*>(smem + (2 * kRows + (2 + i) * kTile) * S::kRowBytes);
  };
  const int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int KV = KVH * HS, W = C + 2 * KV, kvh = h / (NH / KVH);
  const int warp = threadIdx.x / kWarpSize;
  const int q0 = qt * kRows, row0 = q0 + warp * kWarpRows * MT;  // the warp's first query
  const int row_end = row0 + kWarpRows * MT;
  const int tiles = (min(q0 + kRows, T) - 1) / kTile + 1;
  const F* const seq = qkv + int64_t{b} * T * W;
  const F* const keys = seq + C + kvh * HS;
  const F* const values = seq + C + KV + kvh * HS;
  LoadTile<F, HS, kRows>(sq, seq + h * HS, q0, T, W);
  LoadTile<F, HS, kRows>(sd, dout + int64_t{b} * T * C + h * HS, q0, T, C);
  LoadTile<F, HS, kTile>(sk(0), keys, 0, T, W);
  LoadTile<F, HS, kTile>(sv(0), values, 0, T, W);
  CpAsyncCommit();
  // The lane's rows' lse (log2 units) and D, each lane of a row's quad
  // summing HS/4 of its channels.
  float lse[MT][2], D[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int qi = row0 + mt * 16 + FragRow(2 * i);
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
      D[mt][i] = d;
      if (qi < T && threadIdx.x % 4 == 0) D_all[at] = d;
      lse[mt][i] = qi < T ? lse_all[at] * kLog2e : 0.0f;
    }
  }
  const float scale_log2 = scale * kLog2e;
  float dq[MT][HS / 8][4] = {};
  const F* const wq = sq + warp * kWarpRows * MT * S::kLd;
  const F* const wd = sd + warp * kWarpRows * MT * S::kLd;
  for (int kt = 0; kt < tiles; ++kt) {
    const int buf = kt & 1;
    if (kt + 1 < tiles) {
      LoadTile<F, HS, kTile>(sk(buf ^ 1), keys, (kt + 1) * kTile, T, W);
      LoadTile<F, HS, kTile>(sv(buf ^ 1), values, (kt + 1) * kTile, T, W);
      CpAsyncCommit();
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();
#pragma unroll
    for (int part = 0; part < MT; ++part) {
      const int c0 = kt * kTile + part * kStep;  // the step's first key
      if (c0 >= row_end) break;                  // hidden from all the warp's rows
      const F* const kh = sk(buf) + part * kStep * S::kLd;
      const F* const vh = sv(buf) + part * kStep * S::kLd;
      const bool diagonal = c0 + kStep - 1 > row0;
      float p[MT][kStep / 8][4];
      RowsTimesTileT<F, HS, kStep, MT>(p, wq, kh);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int nt = 0; nt < kStep / 8; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            // Rows past T: zero Q and dout make P·(dP − D) zero.
            const bool hidden = diagonal && c0 + FragCol(nt, e) > row0 + mt * 16 + FragRow(e);
            p[mt][nt][e] = hidden ? 0.0f : exp2f(p[mt][nt][e] * scale_log2 - lse[mt][e / 2]);
          }
        }
      }
      float ds[MT][kStep / 8][4];
      RowsTimesTileT<F, HS, kStep, MT>(ds, wd, vh);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int nt = 0; nt < kStep / 8; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            ds[mt][nt][e] = p[mt][nt][e] * (ds[mt][nt][e] - D[mt][e / 2]) * scale;
          }
        }
      }
      AccumulateRowsTimesTile<F, HS, kStep, MT>(dq, ds, kh);
    }
    __syncthreads();
  }
  AddRows<F, HS, MT>(dqkv + int64_t{b} * T * W + h * HS, W, row0, T, dq);
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
  return DispatchFlash(ctx.dtype, hs, [&](auto tag, auto hs_c) {
    using F = typename decltype(tag)::type;
    constexpr int HS = decltype(hs_c)::value;
    constexpr int kRows = Smem<HS>::Rows(Smem<HS>::kForwardMT);
    const dim3 grid((T + kRows - 1) / kRows, NH, B);
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
  return DispatchFlash(ctx.dtype, hs, [&](auto tag, auto hs_c) -> absl::Status {
    using F = typename decltype(tag)::type;
    constexpr int HS = decltype(hs_c)::value;
    constexpr int kQRows = Smem<HS>::Rows(Smem<HS>::kQMT);
    constexpr int kKvRows = Smem<HS>::Rows(Smem<HS>::kKvMT);
    // dQ first: it leaves D for dK/dV.
    SHARDTRAIN_RETURN_IF_ERROR(Launch(
        "FlashAttentionBackward (dQ)", FlashBackwardQKernel<F, HS>,
        dim3((T + kQRows - 1) / kQRows, NH, B),
        Smem<HS>::kBackwardQ, ctx.stream, static_cast<F*>(dqkv), D, static_cast<const F*>(dout),
        static_cast<const F*>(qkv), static_cast<const F*>(out), lse, T, C, NH, KVH, scale));
    return Launch("FlashAttentionBackward (dK, dV)", FlashBackwardKvKernel<F, HS>,
                  dim3((T + kKvRows - 1) / kKvRows, KVH, B), Smem<HS>::kBackwardKv, ctx.stream,
                  static_cast<F*>(dqkv),
                  static_cast<const F*>(dout), static_cast<const F*>(qkv), lse,
                  static_cast<const float*>(D), T, C, NH, KVH, scale);
  });
}

}  // namespace shardtrain::engine::cuda
