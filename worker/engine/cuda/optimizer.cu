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
