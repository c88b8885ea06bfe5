// Private helpers of the kernels of kernels.h: the compute type's load and
// store, warp and block reductions, the dtype dispatch and the launchers'
// size checks and error translation. Included by the .cu files only.
#ifndef SHARDTRAIN_WORKER_ENGINE_CUDA_KERNEL_UTIL_CUH_
#define SHARDTRAIN_WORKER_ENGINE_CUDA_KERNEL_UTIL_CUH_

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <initializer_list>
#include <limits>
#include <string>
#include <type_traits>

#include "absl/status/status.h"
#include "common/dtype.h"
#include "common/status_macros.h"

namespace shardtrain::engine::cuda::internal {

// ---- the GEMMs' algorithms, chosen once per shape (matmul.cu's LtMatmul)

// Everything cuBLASLt's heuristic choice depends on: transposes, types,
// shapes and leading dimensions of A, B and D, the operands' alignments,
// the epilogue and its aux leading dimension, the workspace's size.
using LtAlgoKey = std::array<int64_t, 22>;
class LtAlgoCache {
 public:
  struct Entry {
    bool found = false;  // false: cuBLASLt has no algorithm (or refused it)
    cublasLtMatmulAlgo_t algo{};
  };
  const Entry* Find(const LtAlgoKey& key) const {
    auto it = entries_.find(key);
    return it == entries_.end() ? nullptr : &it->second;
  }
  void Insert(const LtAlgoKey& key, const Entry& entry) { entries_[key] = entry; }

 private:
  std::map<LtAlgoKey, Entry> entries_;
};

// ---- the compute type: fp32 arithmetic, converted on load, rounded on store

__device__ __forceinline__ float Load(float x) { return x; }
__device__ __forceinline__ float Load(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float Load(__half x) { return __half2float(x); }

// Round to nearest even.
template <typename T>
__device__ __forceinline__ T Store(float x);
template <>
__device__ __forceinline__ float Store<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 Store<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half Store<__half>(float x) {
  return __float2half_rn(x);
}

// ---- reductions (fixed order: the same inputs give the same bits)

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarpSize = 32;

// Butterfly over the 32 lanes; every lane ends with the same bits (each step
// adds the same two partials, in either order).
__device__ __forceinline__ float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  }
  return v;
}

// Block-wide sum and max for blockDim.x a multiple of 32 (at most 1024);
// every thread of the block must call them and gets the result.
__device__ __forceinline__ float BlockSum(float v) {
  __shared__ float warp_sums[kWarpSize];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  v = WarpSum(v);
  __syncthreads();  // warp_sums may still be read by a previous call
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  return WarpSum(lane < warps ? warp_sums[lane] : 0.0f);
}
__device__ __forceinline__ float BlockMax(float v) {
  __shared__ float warp_maxs[kWarpSize];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  v = WarpMax(v);
  __syncthreads();
  if (lane == 0) warp_maxs[warp] = v;
  __syncthreads();
  return WarpMax(lane < warps ? warp_maxs[lane] : -INFINITY);
}

// Column sums over rows, deterministic and parallel: a block of kColumnTile
// × kRowLanes threads (threadIdx.x: a column of the block's tile, so a warp
// reads 32 adjacent elements of one row; threadIdx.y: a row lane). Each
// thread sums rows y, y + kRowLanes, ... in order; ColumnLaneSum then adds
// the kRowLanes partials of each column in a fixed tree. Every thread of the
// block must call it and gets its column's sum.
constexpr int kColumnTile = 32;
constexpr int kRowLanes = 32;
__device__ __forceinline__ float ColumnLaneSum(float v) {
  __shared__ float lanes[kRowLanes][kColumnTile + 1];  // +1: no bank conflicts
  __syncthreads();                                     // a previous call's reads are done
  lanes[threadIdx.y][threadIdx.x] = v;
  __syncthreads();
  for (int s = kRowLanes / 2; s > 0; s >>= 1) {
    if (threadIdx.y < s) lanes[threadIdx.y][threadIdx.x] += lanes[threadIdx.y + s][threadIdx.x];
    __syncthreads();
  }
  return lanes[0][threadIdx.x];
}

// Column sums split over row chunks (bias and norm-weight gradients): a
// grid of (column tiles × row chunks) blocks of kColumnTile × kRowLanes
// threads; each block sums its chunk's rows of its columns (ColumnLaneSum)
// into a partial row of the workspace, and AddColumnPartials adds a column's
// partials in chunk order into the output. One block per column tile would
// leave most of the GPU idle (C = 768: 24 blocks). The chunking depends on
// N, C and the workspace's size only: the same bits run after run. With one
// chunk, blocks add into the outputs directly.
constexpr int kChunkRows = 512;
struct ColumnChunks {
  int chunks = 1;
  int rows = 0;  // rows per chunk
};
// K sums per column (dweight and dbias: 2) of C columns over N rows, the
// partials in workspace_bytes.
inline ColumnChunks PlanColumnChunks(int N, int C, int K, size_t workspace_bytes) {
  ColumnChunks p;
  p.rows = N;
  if (N <= kChunkRows || C <= 0) return p;
  int64_t chunks = (int64_t{N} + kChunkRows - 1) / kChunkRows;
  chunks = std::min<int64_t>(chunks, static_cast<int64_t>(workspace_bytes / (size_t{4} * K * C)));
  chunks = std::min<int64_t>(chunks, 65535);  // gridDim.y
  if (chunks <= 1) return p;
  p.rows = static_cast<int>((N + chunks - 1) / chunks);
  p.chunks = (N + p.rows - 1) / p.rows;
  return p;
}
inline dim3 ColumnChunkGrid(const ColumnChunks& p, int C) {
  return dim3(static_cast<unsigned>((C + kColumnTile - 1) / kColumnTile),
              static_cast<unsigned>(p.chunks));
}
// The block's rows [*r0, *r1) of N, rows per chunk given.
__device__ __forceinline__ void ChunkRows(int N, int rows, int* r0, int* r1) {
  *r0 = blockIdx.y * rows;
  *r1 = min(N, *r0 + rows);
}
// Every thread of the block calls it with its lane's K sums of column c.
template <int K>
__device__ __forceinline__ void FinishColumnChunk(float (&acc)[K], int c, int C, float* out0,
                                                  float* out1, float* partials) {
#pragma unroll
  for (int k = 0; k < K; ++k) acc[k] = ColumnLaneSum(acc[k]);
  if (threadIdx.y != 0 || c >= C) return;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    if (gridDim.y == 1) {
      (k == 0 ? out0 : out1)[c] += acc[k];
    } else {
      partials[(int64_t{k} * gridDim.y + blockIdx.y) * C + c] = acc[k];
    }
  }
}
template <int K>
__global__ void AddColumnPartialsKernel(float* out0, float* out1, const float* partials,
                                        int chunks, int C) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= int64_t{K} * C) return;
  const int k = static_cast<int>(i / C), c = static_cast<int>(i % C);
  float s = 0.0f;
  for (int ch = 0; ch < chunks; ++ch) s += partials[(int64_t{k} * chunks + ch) * C + c];
  (k == 0 ? out0 : out1)[c] += s;
}

// ---- 16-byte accesses: kPack<F> elements at a time (int4 loads/stores)

template <typename F>
constexpr int kPack = 16 / sizeof(F);

// Whether every pointer is 16-byte aligned and rows of n elements of
// `elem` bytes are whole 16-byte packs: a kernel may then read and write
// its rows as int4.
inline bool Packable(int64_t n, size_t elem, std::initializer_list<const void*> pointers) {
  if ((static_cast<size_t>(n) * elem) % 16 != 0) return false;
  for (const void* p : pointers) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

// V consecutive elements at p as fp32, and back (rounded): int4 accesses
// when V elements are whole 16-byte packs (p then 16-byte aligned), else one
// at a time. Elementwise kernels take V = kPack<F> when Packable, else 1.
template <typename F, int V>
__device__ __forceinline__ void LoadVec(float (&v)[V], const F* p) {
  constexpr int kPer = 16 / static_cast<int>(sizeof(F));
  if constexpr (V % kPer == 0) {
#pragma unroll
    for (int q = 0; q < V / kPer; ++q) {
      const int4 raw = reinterpret_cast<const int4*>(p)[q];
      const F* x = reinterpret_cast<const F*>(&raw);
#pragma unroll
      for (int j = 0; j < kPer; ++j) v[q * kPer + j] = Load(x[j]);
    }
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = Load(p[j]);
  }
}
template <typename F, int V>
__device__ __forceinline__ void StoreVec(F* p, const float (&v)[V]) {
  constexpr int kPer = 16 / static_cast<int>(sizeof(F));
  if constexpr (V % kPer == 0) {
#pragma unroll
    for (int q = 0; q < V / kPer; ++q) {
      int4 raw;
      F* x = reinterpret_cast<F*>(&raw);
#pragma unroll
      for (int j = 0; j < kPer; ++j) x[j] = Store<F>(v[q * kPer + j]);
      reinterpret_cast<int4*>(p)[q] = raw;
    }
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) p[j] = Store<F>(v[j]);
  }
}

// ---- host side: dispatch, sizes, errors

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls fn(TypeTag<T>{}) with T the element type of `dtype`.
template <typename Fn>
absl::Status DispatchDtype(DataType dtype, Fn&& fn) {
  switch (dtype) {
    case DataType::kFloat32:
      return fn(TypeTag<float>{});
    case DataType::kBFloat16:
      return fn(TypeTag<__nv_bfloat16>{});
    case DataType::kFloat16:
      return fn(TypeTag<__half>{});
  }
  return absl::InvalidArgumentError("unknown compute dtype");
}

// cuBLAS's name of the element type of `dtype`.
inline cudaDataType_t CudaDataType(DataType dtype) {
  switch (dtype) {
    case DataType::kBFloat16:
      return CUDA_R_16BF;
    case DataType::kFloat16:
      return CUDA_R_16F;
    case DataType::kFloat32:
    default:
      return CUDA_R_32F;
  }
}

constexpr int kMaxGridX = std::numeric_limits<int>::max();  // gridDim.x limit (2^31 - 1)

// Blocks of `threads` covering n elements, one thread each.
inline int64_t BlocksFor(int64_t n, int threads) { return (n + threads - 1) / threads; }

// INVALID_ARGUMENT "<kernel>: <what> must be >= 0, got <v>" unless v >= 0.
absl::Status CheckNonNegative(const char* kernel, const char* what, int64_t v);
// INVALID_ARGUMENT unless `blocks` fits in gridDim.x.
absl::Status CheckGrid(const char* kernel, int64_t blocks);
// INVALID_ARGUMENT "<kernel>: <what> is null" for a null pointer.
absl::Status CheckPointer(const char* kernel, const char* what, const void* p);

// After a launch: INTERNAL "<kernel>: <CUDA error name> (<text>)" when
// cudaGetLastError reports one.
absl::Status CheckLaunch(const char* kernel);

// After a ColumnChunks kernel: its partials (K rows of p.chunks × C in
// `partials`) added into out0 (and out1) in chunk order; nothing with one
// chunk.
template <int K>
absl::Status AddColumnPartials(cudaStream_t stream, const ColumnChunks& p, float* out0,
                               float* out1, const float* partials, int C, const char* kernel) {
  if (p.chunks == 1) return absl::OkStatus();
  constexpr int kThreads = 256;
  AddColumnPartialsKernel<K><<<static_cast<unsigned>(BlocksFor(int64_t{K} * C, kThreads)),
                               kThreads, 0, stream>>>(out0, out1, partials, p.chunks, C);
  return CheckLaunch(kernel);
}
// INTERNAL "<what>: <cuBLAS status name> (<text>)" unless s is success.
absl::Status CublasStatus(cublasStatus_t s, const std::string& what);
// INTERNAL for a CUDA runtime error of `call`.
absl::Status CudaStatus(cudaError_t e, const std::string& call);

// launch(V, blocks) runs a kernel of V elements per thread over n: V =
// kPack<F> when `packs` allow it and every pointer and n are packable, else
// 1 (n a multiple of V either way).
template <typename F, int kThreads, typename Launch>
absl::Status LaunchElementwise(const char* name, int64_t n, bool packs,
                               std::initializer_list<const void*> ptrs, Launch&& launch) {
  if (packs && Packable(n, sizeof(F), ptrs)) {
    constexpr int V = kPack<F>;
    launch(std::integral_constant<int, V>{},
           static_cast<int>(BlocksFor(n / V, kThreads)));
  } else {
    launch(std::integral_constant<int, 1>{}, static_cast<int>(BlocksFor(n, kThreads)));
  }
  return CheckLaunch(name);
}

}  // namespace shardtrain::engine::cuda::internal

#endif  // SHARDTRAIN_WORKER_ENGINE_CUDA_KERNEL_UTIL_CUH_
