// Elementwise layers (kernels.h; the CPU twins are in engine/cpu/layers.cc):
// GELU (tanh approximation) forward and backward, the residual add and the
// in-place add.
#include "worker/engine/cuda/kernel_util.cuh"
#include "worker/engine/cuda/kernels.h"

namespace shardtrain::engine::cuda {
namespace {

using internal::Load;
using internal::Store;

constexpr int kThreads = 256;
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)

// Checks n and the grid; *skip when there is nothing to do.
absl::Status CheckElementwise(const char* kernel, int64_t n, bool* skip) {
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckNonNegative(kernel, "n", n));
  *skip = n == 0;
  return internal::CheckGrid(kernel, internal::BlocksFor(n, kThreads));
}

// One thread per V elements: out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715
// x^3))).
template <typename F, int V>
__global__ void GeluForwardKernel(F* out, const F* inp, int64_t n) {
  const int64_t i = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) * V;
  if (i >= n) return;
  float x[V];
  internal::LoadVec<F, V>(x, inp + i);
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const float u = kGeluScale * (x[j] + 0.044715f * x[j] * x[j] * x[j]);
    x[j] = 0.5f * x[j] * (1.0f + tanhf(u));
  }
  internal::StoreVec<F, V>(out + i, x);
}

}  // namespace

// inp, out (n). Saves nothing (backward recomputes from inp).
absl::Status GeluForward(const KernelCtx& ctx, void* out, const void* inp, int64_t n) {
  constexpr const char* kName = "GeluForward";
  bool skip = false;
  SHARDTRAIN_RETURN_IF_ERROR(CheckElementwise(kName, n, &skip));
  if (skip) return absl::OkStatus();
  return internal::DispatchDtype(ctx.dtype, [&](auto tag) {
    using F = typename decltype(tag)::type;
    return internal::LaunchElementwise<F, kThreads>(
        kName, n, true, {out, inp}, [&](auto v, int blocks) {
          GeluForwardKernel<F, decltype(v)::value><<<blocks, kThreads, 0, ctx.stream>>>(
              static_cast<F*>(out), static_cast<const F*>(inp), n);
        });
  });
}

namespace {

// One thread per V elements: dinp += gelu'(x) · dout.
template <typename F, int V>
__global__ void GeluBackwardKernel(F* dinp, const F* inp, const F* dout, int64_t n) {
  const int64_t i = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) * V;
  if (i >= n) return;
  float x[V], d[V], di[V];
  internal::LoadVec<F, V>(x, inp + i);
  internal::LoadVec<F, V>(d, dout + i);
  internal::LoadVec<F, V>(di, dinp + i);
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const float u = kGeluScale * (x[j] + 0.044715f * x[j] * x[j] * x[j]);
    const float th = tanhf(u);
    const float sech2 = 1.0f - th * th;
    const float grad = 0.5f * (1.0f + th) +
                       0.5f * x[j] * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * x[j] * x[j]);
    di[j] += grad * d[j];
  }
  internal::StoreVec<F, V>(dinp + i, di);
}

}  // namespace

// dinp (n) += gelu'(inp) · dout; inp, dout (n).
absl::Status GeluBackward(const KernelCtx& ctx, void* dinp, const void* inp, const void* dout,
                          int64_t n) {
  constexpr const char* kName = "GeluBackward";
  bool skip = false;
  SHARDTRAIN_RETURN_IF_ERROR(CheckElementwise(kName, n, &skip));
  if (skip) return absl::OkStatus();
  return internal::DispatchDtype(ctx.dtype, [&](auto tag) {
    using F = typename decltype(tag)::type;
    return internal::LaunchElementwise<F, kThreads>(
        kName, n, true, {dinp, inp, dout}, [&](auto v, int blocks) {
          GeluBackwardKernel<F, decltype(v)::value><<<blocks, kThreads, 0, ctx.stream>>>(
              static_cast<F*>(dinp), static_cast<const F*>(inp), static_cast<const F*>(dout), n);
        });
  });
}

namespace {

// One thread per V elements: out[i] = a[i] + b[(i + shift) mod period]
// (period n, shift 0: an elementwise sum; a row's width: a bias on every
// row; T rows of position embeddings from row first: shift first·C). With
// V > 1, period and shift are multiples of V: a thread's elements read one
// run of b.
template <typename F, int V>
__global__ void AddKernel(F* out, const F* a, const F* b, int64_t n, int64_t period,
                          int64_t shift) {
  const int64_t i = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) * V;
  if (i >= n) return;
  float x[V], y[V];
  internal::LoadVec<F, V>(x, a + i);
  internal::LoadVec<F, V>(y, b + (period == n && shift == 0 ? i : (i + shift) % period));
#pragma unroll
  for (int j = 0; j < V; ++j) x[j] += y[j];
  internal::StoreVec<F, V>(out + i, x);
}

// out = a + b (b read cyclically: every `period` elements, 0: n, starting
// `shift` in) over n elements of ctx.dtype (out may alias a).
absl::Status LaunchAdd(const KernelCtx& ctx, const char* kernel, void* out, const void* a,
                       const void* b, int64_t n, int64_t period = 0, int64_t shift = 0) {
  bool skip = false;
  SHARDTRAIN_RETURN_IF_ERROR(CheckElementwise(kernel, n, &skip));
  if (skip) return absl::OkStatus();
  if (period <= 0) period = n;
  return internal::DispatchDtype(ctx.dtype, [&](auto tag) {
    using F = typename decltype(tag)::type;
    // Packs need period and shift to keep a pack's elements in one run of b.
    const bool runs =
        (period * int64_t{sizeof(F)}) % 16 == 0 && (shift * int64_t{sizeof(F)}) % 16 == 0;
    return internal::LaunchElementwise<F, kThreads>(
        kernel, n, runs, {out, a, b}, [&](auto v, int blocks) {
          AddKernel<F, decltype(v)::value>
              <<<blocks, kThreads, 0, ctx.stream>>>(static_cast<F*>(out), static_cast<const F*>(a),
                                                    static_cast<const F*>(b), n, period, shift);
        });
  });
}

}  // namespace

// out = inp1 + inp2, all (n).
absl::Status ResidualForward(const KernelCtx& ctx, void* out, const void* inp1, const void* inp2,
                             int64_t n) {
  return LaunchAdd(ctx, "ResidualForward", out, inp1, inp2, n);
}

// dst (n) += src (n).
absl::Status AddInPlace(const KernelCtx& ctx, void* dst, const void* src, int64_t n) {
  return LaunchAdd(ctx, "AddInPlace", dst, dst, src, n);
}

// out (N, OC) += bias (OC) on every row.
absl::Status AddBias(const KernelCtx& ctx, void* out, const void* bias, int N, int OC) {
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckNonNegative("AddBias", "N", N));
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckNonNegative("AddBias", "OC", OC));
  if (OC == 0) return absl::OkStatus();
  return LaunchAdd(ctx, "AddBias", out, out, bias, int64_t{N} * OC, OC);
}

// out (rows, C) += wpe[(first + r) mod T] on row r.
absl::Status AddPositionRows(const KernelCtx& ctx, void* out, const void* wpe, int64_t first,
                             int rows, int T, int C) {
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckNonNegative("AddPositionRows", "rows", rows));
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckNonNegative("AddPositionRows", "C", C));
  if (T < 1 || first < 0) {
    return absl::InvalidArgumentError("AddPositionRows: need T >= 1 and first >= 0");
  }
  if (C == 0) return absl::OkStatus();
  return LaunchAdd(ctx, "AddPositionRows", out, out, wpe, int64_t{rows} * C, int64_t{T} * C,
                   (first % T) * C);
}

}  // namespace shardtrain::engine::cuda
