// The CUDA engine's fused kernels (kernels.h) against the separate ones
// they replace or the CPU's layers: the wte gradient by token (and the
// host's grouping of rows, which runs without a device), LayerNorm's
// one-pass backward, the MLP's GEMMs with the GELU and the bias gradient
// in cuBLASLt's epilogues, and the fused classifier. The GPU tests skip
// without a device.
#include <cuda_runtime_api.h>

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tests/unit/worker/engine/cuda/kernels_test_util.h"
#include "worker/engine/cuda/kernels.h"
#include "worker/engine/tensor_parallel.h"

namespace shardtrain::engine::cuda {
namespace {

// The rows grouped by token (host code: runs without a device). Tokens
// 5 (rows 0, 3, 6), 9 (1, 4), 2 (2) and 70 (5, outside [0, 64)): buckets
// largest first, each in row order, 70's row in none; the shard [4, 8)
// keeps token 5 only.
TEST(TokenBucketsTest, GroupRowsByTokenInRowOrderLargestFirst) {
  const std::vector<int> tokens = {5, 9, 2, 5, 9, 70, 5};
  std::vector<int> data, scratch;
  ASSERT_EQ(BuildTokenBuckets(tokens.data(), 7, 0, 64, &data, &scratch), 3);
  //                              first     size      rows
  EXPECT_EQ(data, (std::vector<int>{0, 3, 5, 3, 2, 1, 0, 3, 6, 1, 4, 2}));
  ASSERT_EQ(BuildTokenBuckets(tokens.data(), 7, 4, 4, &data, &scratch), 1);
  EXPECT_EQ(data, (std::vector<int>{0, 3, 0, 3, 6}));
  ASSERT_EQ(BuildTokenBuckets(tokens.data(), 7, 100, 4, &data, &scratch), 0);
  EXPECT_TRUE(data.empty());
}

// The engine's wte gradient (rows grouped by token) against the scan over
// every token, bit for bit, in each compute type, whole and over 3 vocabulary
// shards; skewed ids (a few tokens hold most rows, as in text) and
// C = 800 (a partial second block of channels).
TEST_F(CudaKernelsTest, EncoderBackwardByTokenEqualsTheScanBitForBit) {
  const int B = 4, T = 300, C = 800, V = 61, Vp = 66, tp = 3;
  std::vector<int> tokens = Ids(rng_, B * T, V);
  for (size_t i = 0; i < tokens.size(); i += 3) tokens[i] = 7;  // a third of the rows
  for (size_t i = 1; i < tokens.size(); i += 5) tokens[i] = 60;
  std::vector<int> data, scratch;
  for (DataType dtype : {kF32, DataType::kBFloat16}) {
    const KernelCtx& k = Ctx(dtype);
    const std::vector<float> dout = Uniform(rng_, size_t{B} * T * C);
    DevicePtr d_tok = UploadInts(tokens), d_dout = Upload(dtype, dout);
    for (int r = -1; r < tp; ++r) {  // -1: the whole vocabulary
      SCOPED_TRACE(::testing::Message() << DataTypeName(dtype) << " shard " << r);
      const VocabShard v = r < 0 ? VocabShard{0, Vp, V} : VocabShardOf(V, Vp, tp, r);
      const std::vector<float> dwte0 = Uniform(rng_, static_cast<size_t>(v.Vpt) * C);
      TokenBuckets buckets;
      buckets.count = BuildTokenBuckets(tokens.data(), B * T, v.v0, v.real, &data, &scratch);
      DevicePtr d_data = UploadInts(data);
      buckets.data = static_cast<const int*>(d_data.get());
      std::vector<float> got[2];
      for (int bucketed = 0; bucketed < 2; ++bucketed) {
        DevicePtr d_dwte = UploadF32(dwte0);
        ASSERT_OK(EncoderBackwardShard(k, static_cast<float*>(d_dwte.get()), nullptr, d_dout.get(),
                                       static_cast<const int*>(d_tok.get()), v.v0, v.real, B, T, C,
                                       nullptr, bucketed ? &buckets : nullptr));
        got[bucketed] = DownloadF32(d_dwte.get(), dwte0.size());
      }
      ExpectSameBits(got[1], got[0], "dwte by token vs the scan");
    }
  }
}

// The fused backward (one pass: dinp and the parameters' column sums,
// chunks of 64 rows) against the separate kernels (ctx.fused off) at GPT-2's
// width in bf16 and an fp32 width at the fused kernel's limit (1024): dinp
// the same bits (the same arithmetic per row), dweight and dbias the same
// sums in another order (within 1e-5), N = 1000 (a partial last chunk).
TEST_F(CudaKernelsTest, LayerNormBackwardFusedEqualsTheSeparateKernels) {
  const int N = 1000;
  for (const auto& [dtype, C] :
       {std::pair<DataType, int>{DataType::kBFloat16, 768}, {kF32, 1024}}) {
    SCOPED_TRACE(absl::StrCat(DataTypeName(dtype), " C=", C));
    const size_t NC = size_t{N} * C;
    const KernelCtx& k = Ctx(dtype);
    KernelCtx separate = k;
    separate.fused = false;
    const std::vector<float> inp = Rounded(dtype, Uniform(rng_, NC, -2.0f, 3.0f));
    const std::vector<float> weight = Rounded(dtype, Uniform(rng_, C, 0.5f, 1.5f));
    const std::vector<float> bias = Rounded(dtype, Uniform(rng_, C));
    const std::vector<float> dout = Rounded(dtype, Uniform(rng_, NC));
    const std::vector<float> dinp0 = Rounded(dtype, Uniform(rng_, NC));
    DevicePtr d_inp = Upload(dtype, inp), d_w = Upload(dtype, weight), d_b = Upload(dtype, bias);
    DevicePtr d_dout = Upload(dtype, dout), d_out = Alloc(NC * DataTypeSize(dtype));
    DevicePtr mean = Alloc(N * sizeof(float)), rstd = Alloc(N * sizeof(float));
    ASSERT_OK(LayerNormForward(k, d_out.get(), static_cast<float*>(mean.get()),
                               static_cast<float*>(rstd.get()), d_inp.get(), d_w.get(), d_b.get(),
                               N, C));
    std::vector<float> got[2][3];
    for (int f = 0; f < 2; ++f) {
      DevicePtr dinp = Upload(dtype, dinp0);
      DevicePtr dweight = UploadF32(std::vector<float>(C, 0.5f));
      DevicePtr dbias = UploadF32(std::vector<float>(C, -0.5f));
      ASSERT_OK(LayerNormBackward(f ? k : separate, dinp.get(), static_cast<float*>(dweight.get()),
                                  static_cast<float*>(dbias.get()), d_dout.get(), d_inp.get(),
                                  d_w.get(), static_cast<const float*>(mean.get()),
                                  static_cast<const float*>(rstd.get()), N, C));
      got[f][0] = Download(dtype, dinp.get(), NC);
      got[f][1] = DownloadF32(dweight.get(), C);
      got[f][2] = DownloadF32(dbias.get(), C);
    }
    ExpectSameBits(got[1][0], got[0][0], "dinp fused vs separate");
    CompareAndPrint("fused", got[1][1], got[0][1], 1e-5, "layernorm dweight fused vs separate");
    CompareAndPrint("fused", got[1][2], got[0][2], 1e-5, "layernorm dbias fused vs separate");
  }
}

// The MLP's GEMMs with the GELU in cuBLASLt's epilogues (GELU_AUX_BIAS,
// DGELU) and the bias gradient as BGRADB, against the CPU's separate
// layers in fp32 on the same rounded inputs: fc (C 128 -> F 256) with its
// GELU, then the projection (F 256 -> C 128) backward through the GELU.
// On an sm_80+ GPU (A100, H100, H200) cuBLASLt must have them: the step's
// fusions are measured there (gpu_train_bench --unfused). The unfused
// context (fused = false) is UNIMPLEMENTED and its MatmulBackward (column
// sums) agrees with the fused one.
TEST_F(CudaKernelsTest, MatmulGeluEpiloguesMatchCpu) {
  const int N = 1000, C = 128, F = 256;
  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  for (DataType dtype : kLowPrecision) {
    SCOPED_TRACE(std::string(DataTypeName(dtype)));
    const KernelCtx& k = Ctx(dtype);
    KernelCtx unfused = k;
    unfused.fused = false;
    const std::vector<float> inp = Rounded(dtype, Uniform(rng_, size_t{N} * C));
    const std::vector<float> w_fc = Rounded(dtype, Uniform(rng_, size_t{F} * C, -0.2f, 0.2f));
    const std::vector<float> b_fc = Rounded(dtype, Uniform(rng_, F));
    std::vector<float> pre_ref(size_t{N} * F), act_ref(size_t{N} * F);
    cpu::MatmulForward<float>(pre_ref.data(), inp.data(), w_fc.data(), b_fc.data(), N, C, F, F,
                              nullptr);
    cpu::GeluForward<float>(act_ref.data(), pre_ref.data(), int64_t{N} * F, nullptr);
    DevicePtr d_inp = Upload(dtype, inp), d_wfc = Upload(dtype, w_fc), d_bfc = Upload(dtype, b_fc);
    DevicePtr d_act = Alloc(act_ref.size() * DataTypeSize(dtype));
    DevicePtr d_pre = Alloc(pre_ref.size() * DataTypeSize(dtype));
    EXPECT_TRUE(absl::IsUnimplemented(MatmulGeluForward(
        unfused, d_act.get(), d_pre.get(), d_inp.get(), d_wfc.get(), d_bfc.get(), N, C, F)));
    const absl::Status fwd = MatmulGeluForward(k, d_act.get(), d_pre.get(), d_inp.get(),
                                               d_wfc.get(), d_bfc.get(), N, C, F);
    std::printf("[fused] %s GELU_AUX_BIAS on sm_%d%d: %s\n",
                std::string(DataTypeName(dtype)).c_str(), prop.major, prop.minor,
                fwd.ToString().c_str());
    if (prop.major >= 8) ASSERT_OK(fwd);
    if (fwd.ok()) {
      CompareAndPrint("fused", Download(dtype, d_pre.get(), pre_ref.size()), pre_ref,
                      kLowPrecisionTol, "fc pre-activation (aux)");
      CompareAndPrint("fused", Download(dtype, d_act.get(), act_ref.size()), act_ref,
                      kLowPrecisionTol, "fc GELU (D)");
    }

    // The projection's backward through the GELU, from the rounded pre and act.
    const std::vector<float> pre = Rounded(dtype, pre_ref), act = Rounded(dtype, act_ref);
    const std::vector<float> w_proj = Rounded(dtype, Uniform(rng_, size_t{C} * F, -0.2f, 0.2f));
    const std::vector<float> dout = Rounded(dtype, Uniform(rng_, size_t{N} * C));
    const std::vector<float> dweight0 = Uniform(rng_, size_t{C} * F), dbias0 = Uniform(rng_, C);
    std::vector<float> dact(size_t{N} * F, 0.0f), dpre_ref(size_t{N} * F, 0.0f);
    std::vector<float> dweight_ref = dweight0, dbias_ref = dbias0;
    cpu::MatmulBackward<float>(dact.data(), dweight_ref.data(), dbias_ref.data(), dout.data(), C,
                               act.data(), w_proj.data(), N, F, C, nullptr);
    cpu::GeluBackward<float>(dpre_ref.data(), pre.data(), dact.data(), int64_t{N} * F, nullptr);
    DevicePtr d_pre_in = Upload(dtype, pre), d_act_in = Upload(dtype, act);
    DevicePtr d_wp = Upload(dtype, w_proj), d_dout = Upload(dtype, dout);
    DevicePtr d_dpre = Upload(dtype, std::vector<float>(dpre_ref.size(), 7.0f));  // overwritten
    DevicePtr d_dw = UploadF32(dweight0), d_db = UploadF32(dbias0);
    EXPECT_TRUE(absl::IsUnimplemented(MatmulDGeluBackward(
        unfused, d_dpre.get(), static_cast<float*>(d_dw.get()), static_cast<float*>(d_db.get()),
        d_dout.get(), C, d_act_in.get(), d_pre_in.get(), d_wp.get(), N, F, C)));
    ExpectSameBits(DownloadF32(d_dw.get(), dweight0.size()), dweight0, "dweight (unimplemented)");
    const absl::Status bwd = MatmulDGeluBackward(
        k, d_dpre.get(), static_cast<float*>(d_dw.get()), static_cast<float*>(d_db.get()),
        d_dout.get(), C, d_act_in.get(), d_pre_in.get(), d_wp.get(), N, F, C);
    std::printf("[fused] %s DGELU + BGRADB on sm_%d%d: %s\n",
                std::string(DataTypeName(dtype)).c_str(), prop.major, prop.minor,
                bwd.ToString().c_str());
    if (prop.major >= 8) ASSERT_OK(bwd);
    if (bwd.ok()) {
      CompareAndPrint("fused", Download(dtype, d_dpre.get(), dpre_ref.size()), dpre_ref,
                      kLowPrecisionTol, "proj dpre (DGELU)");
      CompareAndPrint("fused", DownloadF32(d_dw.get(), dweight0.size()), dweight_ref,
                      kLowPrecisionTol, "proj dweight");
      CompareAndPrint("fused", DownloadF32(d_db.get(), C), dbias_ref, kLowPrecisionTol,
                      "proj dbias (BGRADB)");
    }
    // The bias gradient both ways: BGRADB (fused) and the column sums.
    std::vector<float> dbias_by[2];
    for (int f = 0; f < 2; ++f) {
      DevicePtr dw = UploadF32(dweight0), db = UploadF32(dbias0);
      ASSERT_OK(MatmulBackward(f ? k : unfused, nullptr, static_cast<float*>(dw.get()),
                               static_cast<float*>(db.get()), d_dout.get(), C, d_act_in.get(),
                               d_wp.get(), N, F, C));
      dbias_by[f] = DownloadF32(db.get(), C);
    }
    CompareAndPrint("fused", dbias_by[1], dbias_by[0], 1e-5, "dbias BGRADB vs column sums");
  }
}

// The fused classifier (one launch: losses, lse, then the logits become
// their gradient) against the two launches, at GPT-2's vocabulary (V =
// 50257 padded to 50304: packed rows, and V = 61, Vp = 67: scalar ones):
// losses and lse within 1e-5 (the row's sums in another order: 1024
// threads a row, not 256), dlogits within the compute type's tolerance,
// padding columns 0.
TEST_F(CudaKernelsTest, CrossEntropyForwardBackwardEqualsTheTwoLaunches) {
  for (const auto& [dtype, N, V, Vp] :
       {std::tuple<DataType, int, int, int>{DataType::kBFloat16, 40, 50257, 50304},
        {DataType::kFloat16, 33, 61, 67},
        {kF32, 40, 50257, 50304}}) {
    SCOPED_TRACE(absl::StrCat(DataTypeName(dtype), " V=", V, " Vp=", Vp));
    const float dloss = 0.37f / N;
    std::vector<float> logits =
        Rounded(dtype, Uniform(rng_, static_cast<size_t>(N) * Vp, -6.0f, 6.0f));
    std::vector<int> targets = Ids(rng_, N, V);
    targets[1] = V - 1;
    const KernelCtx& k = Ctx(dtype);
    DevicePtr d_targets = UploadInts(targets);
    std::vector<float> got[2][3];
    for (int fused = 0; fused < 2; ++fused) {
      DevicePtr d_logits = Upload(dtype, logits);
      DevicePtr d_losses = Alloc(N * sizeof(float)), d_lse = Alloc(N * sizeof(float));
      auto* losses = static_cast<float*>(d_losses.get());
      auto* lse = static_cast<float*>(d_lse.get());
      const auto* t = static_cast<const int*>(d_targets.get());
      if (fused) {
        ASSERT_OK(CrossEntropyForwardBackward(k, losses, lse, d_logits.get(), t, dloss, N, V, Vp));
      } else {
        ASSERT_OK(CrossEntropyForward(k, losses, lse, d_logits.get(), t, N, V, Vp));
        ASSERT_OK(CrossEntropyBackward(k, d_logits.get(), lse, t, dloss, N, V, Vp));
      }
      got[fused][0] = DownloadF32(d_losses.get(), N);
      got[fused][1] = DownloadF32(d_lse.get(), N);
      got[fused][2] = Download(dtype, d_logits.get(), logits.size());
    }
    CompareAndPrint("fused", got[1][0], got[0][0], 1e-5, "cross-entropy losses, fused vs two");
    CompareAndPrint("fused", got[1][1], got[0][1], 1e-5, "cross-entropy lse, fused vs two");
    CompareAndPrint("fused", got[1][2], got[0][2], dtype == kF32 ? kFp32Tol : kLowPrecisionTol,
                    "dlogits, fused vs two");
    for (int r = 0; r < N; ++r) {
      for (int j = V; j < Vp; ++j) ASSERT_EQ(got[1][2][size_t(r) * Vp + j], 0.0f) << r << " " << j;
    }
  }
}

}  // namespace
}  // namespace shardtrain::engine::cuda
