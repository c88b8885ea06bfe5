// RMSNorm over the last dim (Llama), forward and backward (kernels.h; the
// CPU twin is engine/cpu/layers.cc). The layout of layernorm.cu: one warp
// per row for the row's statistics and dinp, a column-tile kernel for the
// weight's gradient (deterministic: no atomics).
#include "absl/strings/str_cat.h"
#include "worker/engine/cuda/kernel_util.cuh"
#include "worker/engine/cuda/kernels.h"

namespace shardtrain::engine::cuda {
namespace {

using internal::kWarpSize;
using internal::Load;
using internal::Store;
using internal::WarpSum;

constexpr int kThreads = 256;                        // 8 warps: 8 rows per block
constexpr int kRowsPerBlock = kThreads / kWarpSize;  // one warp per row

absl::Status CheckRmsNormSizes(const char* kernel, int N, int C) {
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckNonNegative(kernel, "N", N));
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckNonNegative(kernel, "C", C));
  return internal::CheckGrid(kernel, internal::BlocksFor(N, kRowsPerBlock));
}

// One warp per row of C. out = x · rstd · weight; saves the row's rstd =
// 1/sqrt(mean(x²) + eps).
template <typename F>
__global__ void RmsNormForwardKernel(F* out, float* rstd, const F* inp, const F* weight, float eps,
                                     int N, int C) {
  const int64_t row = int64_t{blockIdx.x} * kRowsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= N) return;  // the whole warp leaves together
  const F* x = inp + row * C;
  float ss = 0.0f;
  for (int c = lane; c < C; c += kWarpSize) {
    const float v = Load(x[c]);
    ss += v * v;
  }
  const float s = 1.0f / sqrtf(WarpSum(ss) / C + eps);
  F* o = out + row * C;
  for (int c = lane; c < C; c += kWarpSize) o[c] = Store<F>(Load(x[c]) * s * Load(weight[c]));
  if (lane == 0) rstd[row] = s;
}

}  // namespace

// inp, out (N,C); weight (C); saves rstd (N, fp32).
absl::Status RmsNormForward(const KernelCtx& ctx, void* out, float* rstd, const void* inp,
                            const void* weight, float eps, int N, int C) {
  constexpr const char* kName = "RmsNormForward";
  SHARDTRAIN_RETURN_IF_ERROR(CheckRmsNormSizes(kName, N, C));
  if (N == 0 || C == 0) return absl::OkStatus();
  if (!(eps > 0.0f)) return absl::InvalidArgumentError("RmsNormForward: eps must be > 0");
  const int blocks = static_cast<int>(internal::BlocksFor(N, kRowsPerBlock));
  return internal::DispatchDtype(ctx.dtype, [&](auto tag) {
    using F = typename decltype(tag)::type;
    RmsNormForwardKernel<F><<<blocks, kThreads, 0, ctx.stream>>>(
        static_cast<F*>(out), rstd, static_cast<const F*>(inp), static_cast<const F*>(weight), eps,
        N, C);
    return internal::CheckLaunch(kName);
  });
}

namespace {

// One warp per row of C: dinp += weight · dout · rstd - x · rstd³ · mean(x ·
// weight · dout) (the row's sum in a fixed order: deterministic).
template <typename F>
__global__ void RmsNormBackwardInputKernel(F* dinp, const F* dout, const F* inp, const F* weight,
                                           const float* rstd, int N, int C) {
  const int64_t row = int64_t{blockIdx.x} * kRowsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= N) return;
  const F* x = inp + row * C;
  const F* d = dout + row * C;
  const float s = rstd[row];
  float dot = 0.0f;
  for (int c = lane; c < C; c += kWarpSize) dot += Load(weight[c]) * Load(d[c]) * Load(x[c]);
  const float k = WarpSum(dot) / C * s * s * s;
  F* di = dinp + row * C;
  for (int c = lane; c < C; c += kWarpSize) {
    di[c] = Store<F>(Load(di[c]) + Load(weight[c]) * Load(d[c]) * s - Load(x[c]) * k);
  }
}

// RmsNormBackwardInputKernel on rows of whole 16-byte packs (kPack<F>
// channels a load, as LayerNormBackwardInputPackedKernel): the one-channel
// 2-byte loads above ran at ~270 GB/s on an H200 (16.3 ms of Llama 3.2 1B's
// 164 ms of kernels a step at B = 8, 33 launches). The row's sum is taken
// pack by pack in a fixed order (deterministic).
template <typename F>
__global__ void RmsNormBackwardInputPackedKernel(F* dinp, const F* dout, const F* inp,
                                                 const F* weight, const float* rstd, int N, int C) {
  constexpr int kPack = internal::kPack<F>;
  const int64_t row = int64_t{blockIdx.x} * kRowsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= N) return;
  const int packs = C / kPack;
  const int4* x = reinterpret_cast<const int4*>(inp + row * C);
  const int4* d = reinterpret_cast<const int4*>(dout + row * C);
  const int4* w = reinterpret_cast<const int4*>(weight);
  int4* di = reinterpret_cast<int4*>(dinp + row * C);
  const float s = rstd[row];
  float dot = 0.0f;
  for (int p = lane; p < packs; p += kWarpSize) {
    const int4 xv = x[p], dv = d[p], wv = w[p];
    const F* xs = reinterpret_cast<const F*>(&xv);
    const F* ds = reinterpret_cast<const F*>(&dv);
    const F* ws = reinterpret_cast<const F*>(&wv);
#pragma unroll
    for (int j = 0; j < kPack; ++j) dot += Load(ws[j]) * Load(ds[j]) * Load(xs[j]);
  }
  const float k = WarpSum(dot) / C * s * s * s;
  for (int p = lane; p < packs; p += kWarpSize) {
    const int4 xv = x[p], dv = d[p], wv = w[p];
    int4 ov = di[p];
    const F* xs = reinterpret_cast<const F*>(&xv);
    const F* ds = reinterpret_cast<const F*>(&dv);
    const F* ws = reinterpret_cast<const F*>(&wv);
    F* os = reinterpret_cast<F*>(&ov);
#pragma unroll
    for (int j = 0; j < kPack; ++j) {
      os[j] = Store<F>(Load(os[j]) + Load(ws[j]) * Load(ds[j]) * s - Load(xs[j]) * k);
    }
    di[p] = ov;
  }
}

// A block per (tile of kColumnTile channels, chunk of rows) (ColumnChunks;
// deterministic): dweight[c] += Σ_r x[r,c] · rstd[r] · dout[r,c].
template <typename F>
__global__ void RmsNormBackwardWeightKernel(float* dweight, float* partials, const F* dout,
                                            const F* inp, const float* rstd, int N, int C,
                                            int chunk_rows) {
  const int c = blockIdx.x * internal::kColumnTile + threadIdx.x;
  int r0, r1;
  internal::ChunkRows(N, chunk_rows, &r0, &r1);
  float acc[1] = {0.0f};
  if (c < C) {
    for (int r = r0 + threadIdx.y; r < r1; r += internal::kRowLanes) {
      const int64_t i = int64_t{r} * C + c;
      acc[0] += Load(inp[i]) * rstd[r] * Load(dout[i]);
    }
  }
  internal::FinishColumnChunk<1>(acc, c, C, dweight, nullptr, partials);
}

}  // namespace

// dinp (N,C) += ; dweight (C, fp32) += ; dout, inp (N,C); weight (C); rstd
// (N) from the forward.
absl::Status RmsNormBackward(const KernelCtx& ctx, void* dinp, float* dweight, const void* dout,
                             const void* inp, const void* weight, const float* rstd, int N, int C) {
  constexpr const char* kName = "RmsNormBackward";
  SHARDTRAIN_RETURN_IF_ERROR(CheckRmsNormSizes(kName, N, C));
  if (N == 0 || C == 0) return absl::OkStatus();
  return internal::DispatchDtype(ctx.dtype, [&](auto tag) {
    using F = typename decltype(tag)::type;
    const F* d = static_cast<const F*>(dout);
    const F* x = static_cast<const F*>(inp);
    const internal::ColumnChunks chunks = internal::PlanColumnChunks(N, C, 1, ctx.workspace_bytes);
    float* const partials = static_cast<float*>(ctx.workspace);
    RmsNormBackwardWeightKernel<F>
        <<<internal::ColumnChunkGrid(chunks, C), dim3(internal::kColumnTile, internal::kRowLanes),
           0, ctx.stream>>>(dweight, partials, d, x, rstd, N, C, chunks.rows);
    SHARDTRAIN_RETURN_IF_ERROR(internal::CheckLaunch("RmsNormBackward (dweight)"));
    SHARDTRAIN_RETURN_IF_ERROR(internal::AddColumnPartials<1>(
        ctx.stream, chunks, dweight, nullptr, partials, C, "RmsNormBackward (partials)"));
    const int row_blocks = static_cast<int>(internal::BlocksFor(N, kRowsPerBlock));
    // Unfused (SHARDTRAIN_CUDA_FUSED=0): the one-channel kernel, the
    // baseline gpu_train_bench --unfused measures in the same run.
    if (ctx.fused && internal::Packable(C, sizeof(F), {dinp, dout, inp, weight})) {
      RmsNormBackwardInputPackedKernel<F><<<row_blocks, kThreads, 0, ctx.stream>>>(
          static_cast<F*>(dinp), d, x, static_cast<const F*>(weight), rstd, N, C);
    } else {
      RmsNormBackwardInputKernel<F><<<row_blocks, kThreads, 0, ctx.stream>>>(
          static_cast<F*>(dinp), d, x, static_cast<const F*>(weight), rstd, N, C);
    }
    return internal::CheckLaunch("RmsNormBackward (dinp)");
  });
}

}  // namespace shardtrain::engine::cuda

// ---- RMSNorm over each head (Qwen3's q_norm, k_norm) ----
namespace shardtrain::engine::cuda {
namespace {

// One warp per (row, head) of hs channels: x (strided rows of ld) is
// normalised in place; the values before go to pre ((row·ld_stat + h)·hs),
// rstd to row·ld_stat + h.
template <typename F>
__global__ void HeadRmsNormForwardKernel(F* x, int ld, F* pre, float* rstd, int ld_stat,
                                         const F* weight, float eps, int N, int heads, int hs) {
  const int64_t item = int64_t{blockIdx.x} * kRowsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (item >= int64_t{N} * heads) return;  // the whole warp leaves together
  const int64_t row = item / heads, h = item % heads;
  F* v = x + row * ld + h * hs;
  F* p = pre + (row * ld_stat + h) * hs;
  float ss = 0.0f;
  for (int c = lane; c < hs; c += kWarpSize) {
    const float a = Load(v[c]);
    ss += a * a;
  }
  const float s = 1.0f / sqrtf(WarpSum(ss) / hs + eps);
  for (int c = lane; c < hs; c += kWarpSize) {
    const F a = v[c];
    p[c] = a;
    v[c] = Store<F>(Load(a) * s * Load(weight[c]));
  }
  if (lane == 0) rstd[row * ld_stat + h] = s;
}

// A block per channel c of hs: dweight[c] += Σ over (row, head) of dy ·
// pre · rstd, each thread's share in a fixed order, then a fixed-order tree
// over the block (deterministic). Runs before the input kernel overwrites
// dy.
template <typename F>
__global__ void HeadRmsNormBackwardWeightKernel(float* dweight, const F* dx, int ld, const F* pre,
                                                const float* rstd, int ld_stat, int N, int heads,
                                                int hs) {
  __shared__ float sums[kThreads];
  const int c = blockIdx.x;
  float acc = 0.0f;
  for (int64_t item = threadIdx.x; item < int64_t{N} * heads; item += kThreads) {
    const int64_t row = item / heads, h = item % heads;
    acc += Load(dx[row * ld + h * hs + c]) * Load(pre[(row * ld_stat + h) * hs + c]) *
           rstd[row * ld_stat + h];
  }
  sums[threadIdx.x] = acc;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) sums[threadIdx.x] += sums[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) dweight[c] += sums[0];
}

// One warp per (row, head): dx = s·w·dy − s³/hs · x · Σ dy·w·x, in place.
template <typename F>
__global__ void HeadRmsNormBackwardInputKernel(F* dx, int ld, const F* pre, const float* rstd,
                                               int ld_stat, const F* weight, int N, int heads,
                                               int hs) {
  const int64_t item = int64_t{blockIdx.x} * kRowsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (item >= int64_t{N} * heads) return;
  const int64_t row = item / heads, h = item % heads;
  F* d = dx + row * ld + h * hs;
  const F* p = pre + (row * ld_stat + h) * hs;
  const float s = rstd[row * ld_stat + h];
  float dot = 0.0f;
  for (int c = lane; c < hs; c += kWarpSize) dot += Load(d[c]) * Load(weight[c]) * Load(p[c]);
  const float k = WarpSum(dot) / hs * s * s * s;
  for (int c = lane; c < hs; c += kWarpSize) {
    d[c] = Store<F>(s * Load(weight[c]) * Load(d[c]) - k * Load(p[c]));
  }
}

absl::Status CheckHeadNormSizes(const char* kernel, int N, int heads, int hs, int ld, int ld_stat) {
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckNonNegative(kernel, "N", N));
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckNonNegative(kernel, "heads", heads));
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckNonNegative(kernel, "hs", hs));
  if (ld < heads * hs || ld_stat < heads) {
    return absl::InvalidArgumentError(absl::StrCat(kernel, ": ld ", ld, " < heads·hs ", heads * hs,
                                                   " or ld_stat ", ld_stat, " < heads ", heads));
  }
  return internal::CheckGrid(kernel, internal::BlocksFor(int64_t{N} * heads, kRowsPerBlock));
}

}  // namespace

absl::Status HeadRmsNormForward(const KernelCtx& ctx, void* x, int ld, void* pre, float* rstd,
                                int ld_stat, const void* weight, float eps, int N, int heads,
                                int hs) {
  constexpr const char* kName = "HeadRmsNormForward";
  SHARDTRAIN_RETURN_IF_ERROR(CheckHeadNormSizes(kName, N, heads, hs, ld, ld_stat));
  if (N == 0 || heads == 0 || hs == 0) return absl::OkStatus();
  if (!(eps > 0.0f)) return absl::InvalidArgumentError("HeadRmsNormForward: eps must be > 0");
  const int blocks = static_cast<int>(internal::BlocksFor(int64_t{N} * heads, kRowsPerBlock));
  return internal::DispatchDtype(ctx.dtype, [&](auto tag) {
    using F = typename decltype(tag)::type;
    HeadRmsNormForwardKernel<F><<<blocks, kThreads, 0, ctx.stream>>>(
        static_cast<F*>(x), ld, static_cast<F*>(pre), rstd, ld_stat, static_cast<const F*>(weight),
        eps, N, heads, hs);
    return internal::CheckLaunch(kName);
  });
}

absl::Status HeadRmsNormBackward(const KernelCtx& ctx, void* dx, int ld, float* dweight,
                                 const void* pre, const float* rstd, int ld_stat,
                                 const void* weight, int N, int heads, int hs) {
  constexpr const char* kName = "HeadRmsNormBackward";
  SHARDTRAIN_RETURN_IF_ERROR(CheckHeadNormSizes(kName, N, heads, hs, ld, ld_stat));
  if (N == 0 || heads == 0 || hs == 0) return absl::OkStatus();
  return internal::DispatchDtype(ctx.dtype, [&](auto tag) {
    using F = typename decltype(tag)::type;
    F* d = static_cast<F*>(dx);
    const F* p = static_cast<const F*>(pre);
    HeadRmsNormBackwardWeightKernel<F>
        <<<hs, kThreads, 0, ctx.stream>>>(dweight, d, ld, p, rstd, ld_stat, N, heads, hs);
    SHARDTRAIN_RETURN_IF_ERROR(internal::CheckLaunch("HeadRmsNormBackward (dweight)"));
    const int blocks = static_cast<int>(internal::BlocksFor(int64_t{N} * heads, kRowsPerBlock));
    HeadRmsNormBackwardInputKernel<F><<<blocks, kThreads, 0, ctx.stream>>>(
        d, ld, p, rstd, ld_stat, static_cast<const F*>(weight), N, heads, hs);
    return internal::CheckLaunch("HeadRmsNormBackward (dx)");
  });
}

}  // namespace shardtrain::engine::cuda
