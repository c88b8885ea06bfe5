// LayerNorm over the last dim (eps 1e-5), forward and backward (kernels.h;
// the CPU twin is engine/cpu/layers.cc).
#include <type_traits>

#include "worker/engine/cuda/kernel_util.cuh"
#include "worker/engine/cuda/kernels.h"

namespace shardtrain::engine::cuda {
namespace {

using internal::kWarpSize;
using internal::Load;
using internal::Store;
using internal::WarpSum;

constexpr int kThreads = 256;                        // 8 warps: 8 rows per block
constexpr int kRowsPerBlock = kThreads / kWarpSize;  // for the one-warp-per-row kernels
constexpr float kEps = 1e-5f;

absl::Status CheckLayerNormSizes(const char* kernel, int N, int C) {
  SHARDTRAIN_RETURN_IF_ERROR(internal::CheckNonNegative(kernel, "N", N));
  return internal::CheckNonNegative(kernel, "C", C);
}

// One warp per row of C. out = (x - mean) · rstd · weight + bias; saves the
// row's mean and rstd = 1/sqrt(var + eps) (population variance).
template <typename F>
__global__ void LayerNormForwardKernel(F* out, float* mean, float* rstd, const F* inp,
                                       const F* weight, const F* bias, int N, int C) {
  const int64_t row = int64_t{blockIdx.x} * kRowsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= N) return;  // the whole warp leaves together
  const F* x = inp + row * C;
  float sum = 0.0f;
  for (int c = lane; c < C; c += kWarpSize) sum += Load(x[c]);
  const float m = WarpSum(sum) / C;
  float var = 0.0f;
  for (int c = lane; c < C; c += kWarpSize) {
    const float d = Load(x[c]) - m;
    var += d * d;
  }
  const float s = 1.0f / sqrtf(WarpSum(var) / C + kEps);
  F* o = out + row * C;
  for (int c = lane; c < C; c += kWarpSize) {
    o[c] = Store<F>((Load(x[c]) - m) * s * Load(weight[c]) + Load(bias[c]));
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

// The same with 16-byte accesses for rows of whole packs, at most
// kMaxPacks a lane (C <= 32 · kMaxPacks · kPack): the lane's packs of the
// row are loaded once and kept in registers for the mean, the variance and
// the output (the scalar kernel reads the row three times, two bytes a
// lane). The row's sums are taken lane by lane, then WarpSum: fixed order.
template <typename F, int kMaxPacks>
__global__ void LayerNormForwardPackedKernel(F* out, float* mean, float* rstd, const F* inp,
                                             const F* weight, const F* bias, int N, int C) {
  constexpr int kPack = internal::kPack<F>;
  const int64_t row = int64_t{blockIdx.x} * kRowsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= N) return;  // the whole warp leaves together
  const int packs = C / kPack;
  const int4* x = reinterpret_cast<const int4*>(inp + row * C);
  float v[kMaxPacks][kPack];
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxPacks; ++i) {
    const int k = lane + i * kWarpSize;
    if (k >= packs) continue;
    const int4 raw = x[k];
    const F* xs = reinterpret_cast<const F*>(&raw);
#pragma unroll
    for (int j = 0; j < kPack; ++j) {
      v[i][j] = Load(xs[j]);
      sum += v[i][j];
    }
  }
  const float m = WarpSum(sum) / C;
  float var = 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxPacks; ++i) {
    if (lane + i * kWarpSize >= packs) continue;
#pragma unroll
    for (int j = 0; j < kPack; ++j) {
      const float d = v[i][j] - m;
      var += d * d;
    }
  }
  const float s = 1.0f / sqrtf(WarpSum(var) / C + kEps);
  const int4* w = reinterpret_cast<const int4*>(weight);
  const int4* b = reinterpret_cast<const int4*>(bias);
  int4* o = reinterpret_cast<int4*>(out + row * C);
#pragma unroll
  for (int i = 0; i < kMaxPacks; ++i) {
    const int k = lane + i * kWarpSize;
    if (k >= packs) continue;
    const int4 wv = w[k], bv = b[k];
    const F* ws = reinterpret_cast<const F*>(&wv);
    const F* bs = reinterpret_cast<const F*>(&bv);
    int4 ov;
    F* os = reinterpret_cast<F*>(&ov);
#pragma unroll
    for (int j = 0; j < kPack; ++j) os[j] = Store<F>((v[i][j] - m) * s * Load(ws[j]) + Load(bs[j]));
    o[k] = ov;
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

// launch(std::integral_constant<int, P>) with P the least of 1, 2, 4, 8
// that holds lane_packs (<= 8).
template <typename Launch>
void WithMaxPacks(int lane_packs, Launch&& launch) {
  if (lane_packs <= 1) {
    launch(std::integral_constant<int, 1>{});
  } else if (lane_packs <= 2) {
    launch(std::integral_constant<int, 2>{});
  } else if (lane_packs <= 4) {
    launch(std::integral_constant<int, 4>{});
  } else {
    launch(std::integral_constant<int, 8>{});
  }
}

// Packs per lane of a row of C elements of F, one warp per row.
template <typename F>
int LanePacks(int C) {
  return (C / internal::kPack<F> + kWarpSize - 1) / kWarpSize;
}

}  // namespace

// inp, out (N,C); weight, bias (C); saves mean, rstd (N, fp32). Rows of
// whole 16-byte packs (up to 8 a lane) take the packed kernel.
absl::Status LayerNormForward(const KernelCtx& ctx, void* out, float* mean, float* rstd,
                              const void* inp, const void* weight, const void* bias, int N, int C) {
  constexpr const char* kName = "LayerNormForward";
  SHARDTRAIN_RETURN_IF_ERROR(CheckLayerNormSizes(kName, N, C));
  if (N == 0 || C == 0) return absl::OkStatus();
  const int blocks = static_cast<int>(internal::BlocksFor(N, kRowsPerBlock));
  return internal::DispatchDtype(ctx.dtype, [&](auto tag) {
    using F = typename decltype(tag)::type;
    if (internal::Packable(C, sizeof(F), {out, inp, weight, bias}) && LanePacks<F>(C) <= 8) {
      WithMaxPacks(LanePacks<F>(C), [&](auto max_packs) {
        LayerNormForwardPackedKernel<F, decltype(max_packs)::value>
            <<<blocks, kThreads, 0, ctx.stream>>>(
                static_cast<F*>(out), mean, rstd, static_cast<const F*>(inp),
                static_cast<const F*>(weight), static_cast<const F*>(bias), N, C);
      });
      return internal::CheckLaunch(kName);
    }
    LayerNormForwardKernel<F><<<blocks, kThreads, 0, ctx.stream>>>(
        static_cast<F*>(out), mean, rstd, static_cast<const F*>(inp), static_cast<const F*>(weight),
        static_cast<const F*>(bias), N, C);
    return internal::CheckLaunch(kName);
  });
}

namespace {

// One warp per row of C: dinp += (dnorm - mean(dnorm) - norm · mean(dnorm ·
// norm)) · rstd with dnorm = weight · dout, norm = (x - mean) · rstd.
template <typename F>
__global__ void LayerNormBackwardInputKernel(F* dinp, const F* dout, const F* inp, const F* weight,
                                             const float* mean, const float* rstd, int N, int C) {
  const int64_t row = int64_t{blockIdx.x} * kRowsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= N) return;
  const F* x = inp + row * C;
  const F* d = dout + row * C;
  const float m = mean[row], s = rstd[row];
  float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
  for (int c = lane; c < C; c += kWarpSize) {
    const float dn = Load(weight[c]) * Load(d[c]);
    dnorm_sum += dn;
    dnorm_norm_sum += dn * (Load(x[c]) - m) * s;
  }
  const float dnorm_mean = WarpSum(dnorm_sum) / C;
  const float dnorm_norm_mean = WarpSum(dnorm_norm_sum) / C;
  F* di = dinp + row * C;
  for (int c = lane; c < C; c += kWarpSize) {
    const float norm = (Load(x[c]) - m) * s;
    const float dn = Load(weight[c]) * Load(d[c]);
    di[c] = Store<F>(Load(di[c]) + (dn - dnorm_mean - norm * dnorm_norm_mean) * s);
  }
}

// The same with 16-byte accesses (8 bf16/fp16 or 4 fp32 per load), for rows
// of a whole number of packs on 16-byte-aligned arrays: the scalar kernel
// issued 2-byte loads one channel per lane and ran at a tenth of the
// bandwidth (ncu on an H100: 130 us per GPT-2 LayerNorm at B=4). The row's
// sums are taken pack by pack in a fixed order (deterministic).
// One pack of a row's input gradient: ov + (dnorm - dnorm_mean - norm ·
// dnorm_norm_mean) · rstd per element, from the pack's x, dout and weight.
template <typename F>
__device__ __forceinline__ int4 AddInputGradPack(int4 ov, const int4& xv, const int4& dv,
                                                 const int4& wv, float m, float s, float dnorm_mean,
                                                 float dnorm_norm_mean) {
  const F* xs = reinterpret_cast<const F*>(&xv);
  const F* ds = reinterpret_cast<const F*>(&dv);
  const F* ws = reinterpret_cast<const F*>(&wv);
  F* os = reinterpret_cast<F*>(&ov);
#pragma unroll
  for (int j = 0; j < internal::kPack<F>; ++j) {
    const float norm = (Load(xs[j]) - m) * s;
    const float dn = Load(ws[j]) * Load(ds[j]);
    os[j] = Store<F>(Load(os[j]) + (dn - dnorm_mean - norm * dnorm_norm_mean) * s);
  }
  return ov;
}
template <typename F>
__global__ void LayerNormBackwardInputPackedKernel(F* dinp, const F* dout, const F* inp,
                                                   const F* weight, const float* mean,
                                                   const float* rstd, int N, int C) {
  constexpr int kPack = internal::kPack<F>;
  const int64_t row = int64_t{blockIdx.x} * kRowsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= N) return;
  const int packs = C / kPack;
  const int4* x = reinterpret_cast<const int4*>(inp + row * C);
  const int4* d = reinterpret_cast<const int4*>(dout + row * C);
  const int4* w = reinterpret_cast<const int4*>(weight);
  int4* di = reinterpret_cast<int4*>(dinp + row * C);
  const float m = mean[row], s = rstd[row];
  float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
  for (int k = lane; k < packs; k += kWarpSize) {
    const int4 xv = x[k], dv = d[k], wv = w[k];
    const F* xs = reinterpret_cast<const F*>(&xv);
    const F* ds = reinterpret_cast<const F*>(&dv);
    const F* ws = reinterpret_cast<const F*>(&wv);
#pragma unroll
    for (int j = 0; j < kPack; ++j) {
      const float dn = Load(ws[j]) * Load(ds[j]);
      dnorm_sum += dn;
      dnorm_norm_sum += dn * (Load(xs[j]) - m) * s;
    }
  }
  const float dnorm_mean = WarpSum(dnorm_sum) / C;
  const float dnorm_norm_mean = WarpSum(dnorm_norm_sum) / C;
  for (int k = lane; k < packs; k += kWarpSize) {
    const int4 xv = x[k], dv = d[k], wv = w[k];
    di[k] = AddInputGradPack<F>(di[k], xv, dv, wv, m, s, dnorm_mean, dnorm_norm_mean);
  }
}

// A block per (tile of kColumnTile channels, chunk of rows) (ColumnChunks;
// deterministic): dweight[c] += Σ_r norm[r,c] · dout[r,c], dbias[c] +=
// Σ_r dout[r,c].
template <typename F>
__global__ void LayerNormBackwardParamsKernel(float* dweight, float* dbias, float* partials,
                                              const F* dout, const F* inp, const float* mean,
                                              const float* rstd, int N, int C, int chunk_rows) {
  const int c = blockIdx.x * internal::kColumnTile + threadIdx.x;
  int r0, r1;
  internal::ChunkRows(N, chunk_rows, &r0, &r1);
  float acc[2] = {0.0f, 0.0f};  // dweight, dbias
  if (c < C) {
    for (int r = r0 + threadIdx.y; r < r1; r += internal::kRowLanes) {
      const int64_t i = int64_t{r} * C + c;
      const float d = Load(dout[i]);
      acc[0] += (Load(inp[i]) - mean[r]) * rstd[r] * d;
      acc[1] += d;
    }
  }
  internal::FinishColumnChunk<2>(acc, c, C, dweight, dbias, partials);
}

// The input gradient and the parameter gradients in one pass over dout and
// inp (llm.c's fused LayerNorm backward): a block of kThreads per chunk of
// chunk_rows rows, a warp per row at a time (rows r0 + warp, r0 + warp +
// kRowsPerBlock, ...). A lane loads its packs of the row's x and dout once
// (at most kMaxPacks: C <= 32 · kMaxPacks · kPack), takes the row's sums
// and writes dinp exactly as LayerNormBackwardInputPackedKernel does (the
// same bits), and keeps its columns' sums of norm · dout and dout over the
// warp's rows in registers. The block adds its warps' sums in warp order in
// shared memory (2·C floats) and writes them as chunk blockIdx.x's partials
// (ColumnChunks' layout; with one chunk, into dweight and dbias), which
// AddColumnPartials adds in chunk order: deterministic.
template <typename F, int kMaxPacks>
__global__ void LayerNormBackwardFusedKernel(F* dinp, float* dweight, float* dbias, float* partials,
                                             const F* dout, const F* inp, const F* weight,
                                             const float* mean, const float* rstd, int N, int C,
                                             int chunk_rows) {
  constexpr int kPack = internal::kPack<F>;
  extern __shared__ float sums[];  // [2][C]: Σ norm·dout, Σ dout
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int packs = C / kPack;
  const int4* w = reinterpret_cast<const int4*>(weight);
  float acc_w[kMaxPacks][kPack], acc_b[kMaxPacks][kPack];
#pragma unroll
  for (int i = 0; i < kMaxPacks; ++i) {
#pragma unroll
    for (int j = 0; j < kPack; ++j) acc_w[i][j] = acc_b[i][j] = 0.0f;
  }
  const int r0 = blockIdx.x * chunk_rows, r1 = min(N, r0 + chunk_rows);
  for (int r = r0 + warp; r < r1; r += kRowsPerBlock) {
    const int64_t row = r;
    const int4* x = reinterpret_cast<const int4*>(inp + row * C);
    const int4* d = reinterpret_cast<const int4*>(dout + row * C);
    int4* di = reinterpret_cast<int4*>(dinp + row * C);
    const float m = mean[row], s = rstd[row];
    int4 xv[kMaxPacks], dv[kMaxPacks];
    float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxPacks; ++i) {
      const int k = lane + i * kWarpSize;
      if (k >= packs) continue;
      xv[i] = x[k];
      dv[i] = d[k];
      const int4 wv = w[k];
      const F* xs = reinterpret_cast<const F*>(&xv[i]);
      const F* ds = reinterpret_cast<const F*>(&dv[i]);
      const F* ws = reinterpret_cast<const F*>(&wv);
#pragma unroll
      for (int j = 0; j < kPack; ++j) {
        const float dd = Load(ds[j]);
        const float norm = (Load(xs[j]) - m) * s;
        const float dn = Load(ws[j]) * dd;
        dnorm_sum += dn;
        dnorm_norm_sum += dn * (Load(xs[j]) - m) * s;
        acc_w[i][j] += norm * dd;
        acc_b[i][j] += dd;
      }
    }
    const float dnorm_mean = WarpSum(dnorm_sum) / C;
    const float dnorm_norm_mean = WarpSum(dnorm_norm_sum) / C;
#pragma unroll
    for (int i = 0; i < kMaxPacks; ++i) {
      const int k = lane + i * kWarpSize;
      if (k >= packs) continue;
      di[k] = AddInputGradPack<F>(di[k], xv[i], dv[i], w[k], m, s, dnorm_mean, dnorm_norm_mean);
    }
  }
  // The warps' column sums, added in warp order.
  for (int turn = 0; turn < kRowsPerBlock; ++turn) {
    if (warp == turn) {
#pragma unroll
      for (int i = 0; i < kMaxPacks; ++i) {
        const int k = lane + i * kWarpSize;
        if (k >= packs) continue;
#pragma unroll
        for (int j = 0; j < kPack; ++j) {
          const int c = k * kPack + j;
          sums[c] = turn == 0 ? acc_w[i][j] : sums[c] + acc_w[i][j];
          sums[C + c] = turn == 0 ? acc_b[i][j] : sums[C + c] + acc_b[i][j];
        }
      }
    }
    __syncthreads();
  }
  for (int i = threadIdx.x; i < 2 * C; i += blockDim.x) {
    const int k = i / C, c = i % C;
    if (gridDim.x == 1) {
      (k == 0 ? dweight : dbias)[c] += sums[i];
    } else {
      partials[(int64_t{k} * gridDim.x + blockIdx.x) * C + c] = sums[i];
    }
  }
}

// Rows per block of the fused backward: 8 rows a warp (enough blocks to
// fill a GPU at B·T = 16384: 256).
constexpr int kFusedChunkRows = 64;

}  // namespace

// dinp (N,C) += ; dweight, dbias (C, fp32) += ; dout, inp (N,C); weight (C);
// mean, rstd (N) from the forward. Packed rows of at most 32·8 packs (C <=
// 2048 in bf16/fp16, 1024 in fp32): one fused pass
// (LayerNormBackwardFusedKernel); otherwise the parameters' column sums,
// then the input gradient.
absl::Status LayerNormBackward(const KernelCtx& ctx, void* dinp, float* dweight, float* dbias,
                               const void* dout, const void* inp, const void* weight,
                               const float* mean, const float* rstd, int N, int C) {
  constexpr const char* kName = "LayerNormBackward";
  SHARDTRAIN_RETURN_IF_ERROR(CheckLayerNormSizes(kName, N, C));
  if (N == 0 || C == 0) return absl::OkStatus();
  return internal::DispatchDtype(ctx.dtype, [&](auto tag) {
    using F = typename decltype(tag)::type;
    const F* d = static_cast<const F*>(dout);
    const F* x = static_cast<const F*>(inp);
    const bool packable = internal::Packable(C, sizeof(F), {dinp, dout, inp, weight});
    const int lane_packs = LanePacks<F>(C);
    internal::ColumnChunks fused;
    fused.rows = kFusedChunkRows;
    fused.chunks = static_cast<int>(internal::BlocksFor(N, kFusedChunkRows));
    if (ctx.fused && packable && lane_packs <= 8 &&
        size_t(fused.chunks) * 2 * size_t(C) * sizeof(float) <= ctx.workspace_bytes) {
      float* const partials = static_cast<float*>(ctx.workspace);
      const size_t smem = 2 * size_t(C) * sizeof(float);
      WithMaxPacks(lane_packs, [&](auto max_packs) {
        LayerNormBackwardFusedKernel<F, decltype(max_packs)::value>
            <<<fused.chunks, kThreads, smem, ctx.stream>>>(
                static_cast<F*>(dinp), dweight, dbias, partials, d, x,
                static_cast<const F*>(weight), mean, rstd, N, C, fused.rows);
      });
      SHARDTRAIN_RETURN_IF_ERROR(internal::CheckLaunch("LayerNormBackward (fused)"));
      if (fused.chunks == 1) return absl::OkStatus();
      return internal::AddColumnPartials<2>(ctx.stream, fused, dweight, dbias, partials, C,
                                            "LayerNormBackward (fused partials)");
    }
    const internal::ColumnChunks chunks = internal::PlanColumnChunks(N, C, 2, ctx.workspace_bytes);
    float* const partials = static_cast<float*>(ctx.workspace);
    LayerNormBackwardParamsKernel<F>
        <<<internal::ColumnChunkGrid(chunks, C), dim3(internal::kColumnTile, internal::kRowLanes),
           0, ctx.stream>>>(dweight, dbias, partials, d, x, mean, rstd, N, C, chunks.rows);
    SHARDTRAIN_RETURN_IF_ERROR(internal::CheckLaunch("LayerNormBackward (dweight, dbias)"));
    SHARDTRAIN_RETURN_IF_ERROR(internal::AddColumnPartials<2>(
        ctx.stream, chunks, dweight, dbias, partials, C, "LayerNormBackward (partials)"));
    const int row_blocks = static_cast<int>(internal::BlocksFor(N, kRowsPerBlock));
    if (packable) {
      LayerNormBackwardInputPackedKernel<F><<<row_blocks, kThreads, 0, ctx.stream>>>(
          static_cast<F*>(dinp), d, x, static_cast<const F*>(weight), mean, rstd, N, C);
    } else {
      LayerNormBackwardInputKernel<F><<<row_blocks, kThreads, 0, ctx.stream>>>(
          static_cast<F*>(dinp), d, x, static_cast<const F*>(weight), mean, rstd, N, C);
    }
    return internal::CheckLaunch("LayerNormBackward (dinp)");
  });
}

}  // namespace shardtrain::engine::cuda
