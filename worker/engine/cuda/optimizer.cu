// The optimizer side over flat fp32 buffers (kernels.h): per-block partial
// squared norms on a fixed grid, scaling, and the AdamW update.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "worker/engine/cuda/kernel_util.cuh"
#include "worker/engine/cuda/kernels.h"

namespace shardtrain::engine::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxNormBlocks = 1024;
static_assert((kNormThreads & (kNormThreads - 1)) == 0, "the tree reduction needs a power of two");

absl::Status CheckFlat(const char* kernel, int64_t n) {
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckNonNegative(kernel, "n", n));
  return internal::CheckGrid(kernel, internal::BlocksFor(n, kThreads));
}

// A fixed grid of blocks x kNormThreads threads; thread g = block ·
// kNormThreads + tid sums x[i]^2 in double over i = g, g + stride, ... (stride
// = the whole grid), then the block adds its threads' sums in a shared-memory
// tree: partial[block]. Which elements each block adds, and in which order,
// depends only on n.
__global__ void SquaredNormPartialKernel(double* partial, const float* x, int64_t n) {
  __shared__ double sums[kNormThreads];
  const int64_t stride = int64_t{gridDim.x} * kNormThreads;
  double acc = 0.0;
  for (int64_t i = int64_t{blockIdx.x} * kNormThreads + threadIdx.x; i < n; i += stride) {
    const double v = x[i];
    acc += v * v;
  }
  sums[threadIdx.x] = acc;
  __syncthreads();
  for (int half = kNormThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) sums[threadIdx.x] += sums[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = sums[0];
}

}  // namespace

int SquaredNormBlocks(int64_t n) {
  if (n <= 0) return 0;
  return static_cast<int>(std::min<int64_t>(internal::BlocksFor(n, kNormThreads), kMaxNormBlocks));
}

// partial (SquaredNormBlocks(n) doubles) = the fixed grid's per-block sums of x (n)^2.
absl::Status SquaredNormPartial(cudaStream_t stream, double* partial, const float* x, int64_t n) {
  constexpr const char* kName = "SquaredNormPartial";
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckNonNegative(kName, "n", n));
  const int blocks = SquaredNormBlocks(n);
  if (blocks == 0) return absl::OkStatus();
  SquaredNormPartialKernel<<<blocks, kNormThreads, 0, stream>>>(partial, x, n);
  return internal::CheckLaunch(kName);
}

namespace {

// One thread per element: x *= s.
__global__ void ScaleKernel(float* x, int64_t n, float s) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= s;
}

}  // namespace

// x (n) *= s.
absl::Status ScaleFloat32(cudaStream_t stream, float* x, int64_t n, float s) {
  constexpr const char* kName = "ScaleFloat32";
  SHARDTRAIN_RETURN_IF_ERROR(CheckFlat(kName, n));
  if (n == 0) return absl::OkStatus();
  ScaleKernel<<<static_cast<int>(internal::BlocksFor(n, kThreads)), kThreads, 0, stream>>>(x, n, s);
  return internal::CheckLaunch(kName);
}

namespace {

// AdamW of element i as documented in kernels.h, fp32; weight_decay is the
// element's range's.
__device__ __forceinline__ void AdamWElement(float* params, const float* grads, float* m, float* v,
                                             int64_t i, const AdamWArgs& a, float weight_decay) {
  const float g = grads[i] * a.grad_scale;
  float p = params[i];
  if (weight_decay != 0.0f) p -= a.lr * weight_decay * p;
  const float mi = a.beta1 * m[i] + (1.0f - a.beta1) * g;
  const float vi = a.beta2 * v[i] + (1.0f - a.beta2) * g * g;
  m[i] = mi;
  v[i] = vi;
  p -= a.lr * (mi / a.bias1) / (sqrtf(vi / a.bias2) + a.eps);
  params[i] = p;
}

// One thread per element.
__global__ void AdamWKernel(float* params, const float* grads, float* m, float* v, int64_t n,
                            AdamWArgs a) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < n) AdamWElement(params, grads, m, v, i, a, a.weight_decay);
}

// Up to kAdamWRangesPerLaunch ranges by value (the kernel's parameters):
// start[k] is the number of elements in ranges before k (start[count] the
// total), so thread j finds its range by a binary search over start.
struct AdamWTable {
  int count = 0;
  int64_t start[kAdamWRangesPerLaunch + 1];
  int64_t begin[kAdamWRangesPerLaunch];
  float weight_decay[kAdamWRangesPerLaunch];
};

// One thread per element of the table's ranges, in range order.
__global__ void AdamWRangesKernel(float* params, float* grads, float* m, float* v, AdamWTable t,
                                  AdamWArgs a, bool zero_grads) {
  const int64_t j = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (j >= t.start[t.count]) return;
  int lo = 0, hi = t.count - 1;  // the last k with start[k] <= j
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (t.start[mid] <= j) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int64_t i = t.begin[lo] + (j - t.start[lo]);
  AdamWElement(params, grads, m, v, i, a, t.weight_decay[lo]);
  if (zero_grads) grads[i] = 0.0f;
}

}  // namespace

// params, grads, m, v (n, fp32); params, m, v updated in place.
absl::Status AdamWUpdate(cudaStream_t stream, float* params, const float* grads, float* m, float* v,
                         int64_t n, const AdamWArgs& args) {
  constexpr const char* kName = "AdamWUpdate";
  SHARDTRAIN_RETURN_IF_ERROR(CheckFlat(kName, n));
  if (!(args.bias1 > 0.0f) || !(args.bias2 > 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(kName, ": bias1 and bias2 must be > 0, got ",
                                                   args.bias1, " and ", args.bias2));
  }
  if (n == 0) return absl::OkStatus();
  AdamWKernel<<<static_cast<int>(internal::BlocksFor(n, kThreads)), kThreads, 0, stream>>>(
      params, grads, m, v, n, args);
  return internal::CheckLaunch(kName);
}

absl::Status AdamWUpdateRanges(cudaStream_t stream, float* params, float* grads, float* m, float* v,
                               const AdamWRangeArgs* ranges, int count, const AdamWArgs& args,
                               bool zero_grads) {
  constexpr const char* kName = "AdamWUpdateRanges";
  if (!(args.bias1 > 0.0f) || !(args.bias2 > 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(kName, ": bias1 and bias2 must be > 0, got ",
                                                   args.bias1, " and ", args.bias2));
  }
  for (int first = 0; first < count; first += kAdamWRangesPerLaunch) {
    AdamWTable t;
    t.count = std::min(kAdamWRangesPerLaunch, count - first);
    t.start[0] = 0;
    for (int k = 0; k < t.count; ++k) {
      const AdamWRangeArgs& r = ranges[first + k];
      if (r.begin < 0 || r.end < r.begin) {
        return absl::InvalidArgumentError(
            absl::StrCat(kName, ": range ", first + k, " is [", r.begin, ", ", r.end, ")"));
      }
      t.begin[k] = r.begin;
      t.weight_decay[k] = r.weight_decay;
      t.start[k + 1] = t.start[k] + (r.end - r.begin);
    }
    const int64_t n = t.start[t.count];
    if (n == 0) continue;
    SHARDTRAIN_RETURN_IF_ERROR(CheckFlat(kName, n));
    AdamWRangesKernel<<<static_cast<int>(internal::BlocksFor(n, kThreads)), kThreads, 0, stream>>>(
        params, grads, m, v, t, args, zero_grads);
    SHARDTRAIN_RETURN_IF_ERROR(internal::CheckLaunch(kName));
  }
  return absl::OkStatus();
}

}  // namespace shardtrain::engine::cuda

// ---- 8-bit AdamW ----
namespace shardtrain::engine::cuda {
namespace {

constexpr int k8bitThreads = 256;
constexpr int k8bitPerThread = kAdamW8bitBlock / k8bitThreads;
static_assert(kAdamW8bitBlock % k8bitThreads == 0, "a block's elements split evenly");

// optim/quant8.cc QuantizeValue: the entry of the sorted map nearest to y,
// a tie keeping the lower one (std::upper_bound, then the comparison).
__device__ __forceinline__ uint8_t NearestCode(const float* map, float y) {
  int lo = 0, hi = 256;  // the first entry above y, as std::upper_bound
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (y < map[mid]) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  if (lo == 0) return 0;
  if (lo == 256) return 255;
  return static_cast<uint8_t>(map[lo] - y < y - map[lo - 1] ? lo : lo - 1);
}

// Whether element i lies in a decayed range (sorted (begin, end, decayed)
// triples; elements between ranges take no decay).
__device__ __forceinline__ bool Decayed(const uint32_t* ranges, int count, uint32_t i) {
  int lo = 0, hi = count;  // the first range whose begin is above i
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (i < ranges[3 * mid]) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  if (lo == 0) return false;
  const uint32_t* r = ranges + 3 * (lo - 1);
  return i < r[1] && r[2] != 0;
}

__device__ __forceinline__ float BlockMax(float x, float* scratch) {
  for (int o = internal::kWarpSize / 2; o > 0; o /= 2) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  }
  const int warp = threadIdx.x / internal::kWarpSize, lane = threadIdx.x % internal::kWarpSize;
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  float m = 0.0f;
  for (int w = 0; w < k8bitThreads / internal::kWarpSize; ++w) m = fmaxf(m, scratch[w]);
  return m;  // exact: max does not round, in any order
}

// optim/adamw8bit.cc UpdateBlock, element by element with the same float
// operations in the same order.
__global__ void AdamW8bitKernel(float* p, float* g, uint8_t* mc, float* m_absmax, uint8_t* vc,
                                float* v_absmax, int64_t n, const uint32_t* ranges, int num_ranges,
                                AdamW8bitArgs a, bool zero_grads) {
  __shared__ float m_map[256], v_map[256];
  __shared__ float scratch_m[k8bitThreads / internal::kWarpSize];
  __shared__ float scratch_v[k8bitThreads / internal::kWarpSize];
  for (int k = threadIdx.x; k < 256; k += k8bitThreads) {
    m_map[k] = a.m_map[k];
    v_map[k] = a.v_map[k];
  }
  __syncthreads();
  const int64_t block = blockIdx.x, begin = block * kAdamW8bitBlock;
  const int len = static_cast<int>(n - begin < kAdamW8bitBlock ? n - begin : kAdamW8bitBlock);
  const float ma = m_absmax[block], va = v_absmax[block];
  const float one_minus_b1 = 1.0f - a.beta1, one_minus_b2 = 1.0f - a.beta2;
  float m_new[k8bitPerThread], v_new[k8bitPerThread];
  float top_m = 0.0f, top_v = 0.0f;
#pragma unroll
  for (int k = 0; k < k8bitPerThread; ++k) {
    const int j = k * k8bitThreads + threadIdx.x;
    m_new[k] = v_new[k] = 0.0f;
    if (j >= len) continue;
    const int64_t i = begin + j;
    const float m0 = ma == 0.0f ? 0.0f : m_map[mc[i]] * ma;
    const float v0 = va == 0.0f ? 0.0f : v_map[vc[i]] * va;
    const float gi = g[i] * a.grad_scale;
    if (zero_grads) g[i] = 0.0f;
    const float mj = fmaf(a.beta1, m0, one_minus_b1 * gi);
    const float vj = fmaf(a.beta2, v0, one_minus_b2 * gi * gi);
    const float denom = fmaf(sqrtf(vj), a.inv_sqrt_bc2, a.eps);
    const float d = Decayed(ranges, num_ranges, static_cast<uint32_t>(j)) ? a.decay : 1.0f;
    p[i] = fmaf(p[i], d, -(a.step_size * mj / denom));
    m_new[k] = mj;
    v_new[k] = vj;
    top_m = fmaxf(top_m, fabsf(mj));
    top_v = fmaxf(top_v, fabsf(vj));
  }
  const float am = BlockMax(top_m, scratch_m);
  const float av = BlockMax(top_v, scratch_v);
#pragma unroll
  for (int k = 0; k < k8bitPerThread; ++k) {
    const int j = k * k8bitThreads + threadIdx.x;
    if (j >= len) continue;
    const int64_t i = begin + j;
    mc[i] = NearestCode(m_map, am == 0.0f ? 0.0f : m_new[k] / am);
    vc[i] = NearestCode(v_map, av == 0.0f ? 0.0f : v_new[k] / av);
  }
  if (threadIdx.x == 0) {
    m_absmax[block] = am;
    v_absmax[block] = av;
  }
}

}  // namespace

absl::Status AdamW8bitUpdate(cudaStream_t stream, float* params, float* grads, uint8_t* m,
                             float* m_absmax, uint8_t* v, float* v_absmax, int64_t n,
                             const uint32_t* ranges, int num_ranges, const AdamW8bitArgs& args,
                             bool zero_grads) {
  constexpr const char* kName = "AdamW8bitUpdate";
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckNonNegative(kName, "n", n));
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckNonNegative(kName, "num_ranges", num_ranges));
  if (n > int64_t{0xffffffff}) {
    return absl::InvalidArgumentError(
        absl::StrCat(kName, ": ", n, " elements, the ranges index at most 2^32 - 1"));
  }
  if (n == 0) return absl::OkStatus();
  const int64_t blocks = internal::BlocksFor(n, kAdamW8bitBlock);
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckGrid(kName, blocks));
  AdamW8bitKernel<<<static_cast<int>(blocks), k8bitThreads, 0, stream>>>(
      params, grads, m, m_absmax, v, v_absmax, n, ranges, num_ranges, args, zero_grads);
  return internal::CheckLaunch(kName);
}

}  // namespace shardtrain::engine::cuda
