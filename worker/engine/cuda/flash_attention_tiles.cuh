// Flash attention's tile primitives (flash_attention.cu, whose header comment
// says how its kernels use them): the tile and block shapes, shared-memory
// layout, asynchronous copies of tiles (cp.async, sm_80+), and warp-level
// tensor-core products and fragment bookkeeping (mma.m16n8k16, ldmatrix).
// Device code for that one file.
#ifndef SHARDTRAIN_WORKER_ENGINE_CUDA_FLASH_ATTENTION_TILES_CUH_
#define SHARDTRAIN_WORKER_ENGINE_CUDA_FLASH_ATTENTION_TILES_CUH_

#include <cstdint>
#include <type_traits>

#include "worker/engine/cuda/kernel_util.cuh"

namespace shardtrain::engine::cuda::flash {

using internal::kFullMask;
using internal::kWarpSize;

constexpr int kTile = 64;                      // rows (queries or keys) per block
constexpr int kThreads = 128;                  // 4 warps of 16 rows
constexpr int kWarpRows = 16;                  // an m16 fragment's rows
constexpr int kVec = 8;                        // 16-bit elements per int4
constexpr float kLog2e = 1.4426950408889634f;  // log2(e)
constexpr float kLn2 = 0.6931471805599453f;    // ln(2)

// Shared-memory strides (elements) and region sizes (bytes).
template <int HS>
struct Smem {
  static constexpr int kLd = HS + 8;  // 16-bit rows of HS: 16 bytes of skew
  static constexpr int kTileBytes = kTile * kLd * 2;
  // dK/dV visit queries kQTile at a time: with head size 128 half a tile,
  // so that the score, dP, dK and dV accumulators fit the registers.
  static constexpr int kQTile = HS == 64 ? 64 : 32;
  static constexpr int kQBytes = kQTile * kLd * 2;
  // Forward: q, then k and v twice (double-buffered).
  static constexpr int kForward = 5 * kTileBytes;
  // dK/dV: k, v, then q and dout twice, then lse and D twice.
  static constexpr int kBackwardKv = 2 * kTileBytes + 4 * kQBytes + 2 * 2 * kQTile * 4;
  // dQ: q, dout, then k and v twice.
  static constexpr int kBackwardQ = 6 * kTileBytes;
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

// s (16 × N, accumulators) = a · b^T: a the warp's 16 rows of HS, b N rows
// of HS, both row-major in shared memory (stride Smem::kLd): the warp's rows
// against a tile's rows (Q·K^T, K·Q^T, dout·V^T, V·dout^T).
template <typename F, int HS, int N>
__device__ __forceinline__ void RowsTimesTileT(float (&s)[N / 8][4], const F* a, const F* b) {
  constexpr int kLd = Smem<HS>::kLd;
  const int lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int nt = 0; nt < N / 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < HS / 16; ++kk) {
    uint32_t af[4];  // rows 0-7 | 8-15 at k 0-7, then at k 8-15
    LdMatrix(af, a + (lane % 16) * kLd + kk * 16 + (lane / 16) * 8);
#pragma unroll
    for (int nb = 0; nb < N / 16; ++nb) {
      uint32_t bf[4];  // b rows 0-7 at k 0-7 | k 8-15, then rows 8-15
      LdMatrix(bf, b + (nb * 16 + lane % 8 + (lane / 16) * 8) * kLd + kk * 16 + (lane / 8 % 2) * 8);
      Mma<F>(s[2 * nb], af, bf[0], bf[1]);
      Mma<F>(s[2 * nb + 1], af, bf[2], bf[3]);
    }
  }
}

// acc (16 × HS, accumulators) += p (16 × N, accumulators, rounded to F) ·
// tile (N × HS, row-major in shared memory): P·V, P^T·dout, dS^T·Q, dS·K.
template <typename F, int HS, int N>
__device__ __forceinline__ void AccumulateRowsTimesTile(float (&acc)[HS / 8][4],
                                                        const float (&p)[N / 8][4], const F* tile) {
  constexpr int kLd = Smem<HS>::kLd;
  const int lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk) {
    const uint32_t af[4] = {
        Pack<F>(p[2 * kk][0], p[2 * kk][1]), Pack<F>(p[2 * kk][2], p[2 * kk][3]),
        Pack<F>(p[2 * kk + 1][0], p[2 * kk + 1][1]), Pack<F>(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
    for (int nb = 0; nb < HS / 16; ++nb) {
      uint32_t bf[4];  // tile rows k 0-7 | 8-15 at columns 0-7, then 8-15
      LdMatrixTrans(
          bf, tile + (kk * 16 + lane % 8 + (lane / 8 % 2) * 8) * kLd + nb * 16 + (lane / 16) * 8);
      Mma<F>(acc[2 * nb], af, bf[0], bf[1]);
      Mma<F>(acc[2 * nb + 1], af, bf[2], bf[3]);
    }
  }
}

// The accumulator element e of column tile nt: its row (0..15 of the warp's)
// and column.
__device__ __forceinline__ int FragRow(int e) { return threadIdx.x % kWarpSize / 4 + (e / 2) * 8; }
__device__ __forceinline__ int FragCol(int nt, int e) {
  return nt * 8 + (threadIdx.x % 4) * 2 + e % 2;
}

// dst (global, the warp's 16 rows of stride ld from row0, HS columns) +=
// acc, each element by the one lane that holds it; rows at or past T
// skipped.
template <typename F, int HS>
__device__ __forceinline__ void AddRows(F* dst, int64_t ld, int row0, int T,
                                        const float (&acc)[HS / 8][4]) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + FragRow(2 * half);
    if (row >= T) continue;
#pragma unroll
    for (int nt = 0; nt < HS / 8; ++nt) {
      uint32_t* const d = reinterpret_cast<uint32_t*>(dst + row * ld + FragCol(nt, 0));
      const float2 old = Unpack<F>(*d);
      *d = Pack<F>(old.x + acc[nt][2 * half], old.y + acc[nt][2 * half + 1]);
    }
  }
}

}  // namespace shardtrain::engine::cuda::flash

#endif  // SHARDTRAIN_WORKER_ENGINE_CUDA_FLASH_ATTENTION_TILES_CUH_
