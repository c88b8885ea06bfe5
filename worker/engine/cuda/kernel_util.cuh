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

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "common/dtype.h"
#include "common/status_macros.h"

namespace shardtrain::engine::cuda::internal {

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
// INTERNAL "<what>: <cuBLAS status name> (<text>)" unless s is success.
absl::Status CublasStatus(cublasStatus_t s, const std::string& what);
// INTERNAL for a CUDA runtime error of `call`.
absl::Status CudaStatus(cudaError_t e, const std::string& call);

}  // namespace shardtrain::engine::cuda::internal

#endif  // SHARDTRAIN_WORKER_ENGINE_CUDA_KERNEL_UTIL_CUH_
