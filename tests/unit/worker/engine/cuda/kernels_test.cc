// The CUDA kernels (worker/engine/cuda/kernels.h) against their CPU twins
// (worker/engine/cpu/layers.h) and the host optimizer (worker/optim/adamw.h).
//
// fp32: every output and every gradient within 1e-5 of the reference,
// relative to the reference's largest magnitude (GEMMs run in fp32 on both
// sides; transcendentals and summation order differ by a few ulp).
// bf16 / fp16: the inputs are rounded to the compute type on the host and
// the fp32 CPU reference runs on the rounded values; outputs stored in 16 bits
// carry one rounding (2^-9 relative for bf16) on top, intermediate GEMM
// results (attention scores) more: 2e-2 relative.
// Determinism: the same inputs give the same bits, run after run.
//
// Every test that needs a GPU skips without one; the checks of
// KernelContext::Create's failure and of SquaredNormBlocks run anywhere.
//
// This file: the context, the optimizer kernels and the launchers' size
// checks; kernels_layers_test.cc: the layers; llama_kernels_test.cc: the
// Llama family's layers (RMSNorm, rotary, SwiGLU, grouped-query attention,
// the encoder without learned positions).
#include "worker/engine/cuda/kernels.h"

#include <cublas_api.h>

#include "tests/unit/worker/engine/cuda/kernels_test_util.h"
#include "worker/engine/cuda/cublas_loader.h"

namespace shardtrain::engine::cuda {
namespace {

// ---------------------------------------------------------------- context

TEST(KernelContextTest, CreateFailsCleanlyWithoutDevice) {
  KernelContext context;
  const absl::Status s = KernelContext::Create(nullptr, kF32, &context);
  if (HaveDevice()) {
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_NE(context.ctx().lt, nullptr);
    EXPECT_NE(context.ctx().blas, nullptr);
    EXPECT_NE(context.ctx().workspace, nullptr);
    EXPECT_EQ(context.ctx().workspace_bytes, size_t{32} << 20);
  } else {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_EQ(context.ctx().lt, nullptr);
    EXPECT_EQ(context.ctx().workspace, nullptr);
  }
}

// cuBLAS is opened, not linked (cublas_loader.cc): with the toolkit's
// libraries installed it opens without a GPU, and the entry points forward
// to it (a status name comes back from the library itself).
TEST(CublasLoaderTest, OpensTheToolkitsLibrariesWithoutAGpu) {
  const absl::Status s = LoadCublas();
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_STREQ(cublasGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED");
  EXPECT_TRUE(LoadCublas().ok());  // once per process, the same answer
}

// The norm's grid depends on n alone: ceil(n / 256) blocks, at most 1024.
TEST(SquaredNormBlocksTest, FixedGridOfN) {
  EXPECT_EQ(SquaredNormBlocks(0), 0);
  EXPECT_EQ(SquaredNormBlocks(1), 1);
  EXPECT_EQ(SquaredNormBlocks(256), 1);
  EXPECT_EQ(SquaredNormBlocks(257), 2);
  EXPECT_EQ(SquaredNormBlocks(int64_t{1024} * 256), 1024);
  EXPECT_EQ(SquaredNormBlocks(int64_t{1024} * 256 + 1), 1024);
  EXPECT_EQ(SquaredNormBlocks(int64_t{1} << 40), 1024);
}

// ------------------------------------------------------------- optimizer

// The partial sums add up to the norm (in double), and twice give the same
// bits; sizes below, at and above one block and the 1024-block grid.
TEST_F(CudaKernelsTest, SquaredNormPartialSumsAndIsDeterministic) {
  for (int64_t n : {int64_t{1}, int64_t{255}, int64_t{256}, int64_t{257}, int64_t{1000},
                    int64_t{262144}, int64_t{262145}, int64_t{1000003}}) {
    SCOPED_TRACE(n);
    const std::vector<float> x = Uniform(rng_, n);
    double want = 0;
    for (float v : x) want += double{v} * v;
    const int blocks = SquaredNormBlocks(n);
    DevicePtr d_x = UploadF32(x), d_partial = Alloc(blocks * sizeof(double));
    std::vector<double> runs[2];
    for (auto& run : runs) {
      ASSERT_EQ(cudaMemset(d_partial.get(), 0xff, blocks * sizeof(double)), cudaSuccess);
      ASSERT_OK(SquaredNormPartial(stream_, static_cast<double*>(d_partial.get()),
                                   static_cast<const float*>(d_x.get()), n));
      ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
      run.resize(blocks);
      ASSERT_EQ(
          cudaMemcpy(run.data(), d_partial.get(), blocks * sizeof(double), cudaMemcpyDeviceToHost),
          cudaSuccess);
    }
    double got = 0;
    for (double p : runs[0]) got += p;
    EXPECT_NEAR(got, want, 1e-10 * want);  // double sums in another order
    EXPECT_EQ(std::memcmp(runs[0].data(), runs[1].data(), blocks * sizeof(double)), 0)
        << "two runs over the same x differ";
  }
}

TEST_F(CudaKernelsTest, ScaleFloat32MatchesHost) {
  const int64_t n = 1025;
  const std::vector<float> x = Uniform(rng_, n);
  std::vector<float> want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = x[i] * 0.3f;
  DevicePtr d_x = UploadF32(x);
  ASSERT_OK(ScaleFloat32(stream_, static_cast<float*>(d_x.get()), n, 0.3f));
  ExpectSameBits(DownloadF32(d_x.get(), n), want, "scaled x");
}

// Three steps of AdamWUpdate on one decayed and one undecayed tensor against
// optim::AdamW on the host. The device gets twice the gradients and
// grad_scale 0.5 (exact in binary), and the bias corrections in double as
// the header asks; the host folds them differently (step_size,
// 1/sqrt(bc2)), hence a tolerance rather than equal bits.
TEST_F(CudaKernelsTest, AdamWUpdateMatchesHostAdamW) {
  auto config = model::MakeGptConfig(/*layers=*/1, /*heads=*/2, /*dim=*/16, /*context=*/8,
                                     /*vocab=*/61);
  ASSERT_TRUE(config.ok()) << config.status();
  const model::ParamLayout layout(*config);
  const model::TensorInfo* decayed = nullptr;
  const model::TensorInfo* undecayed = nullptr;
  for (const model::TensorInfo& t : layout.tensors()) {
    if (t.decay && decayed == nullptr) decayed = &t;
    if (!t.decay && undecayed == nullptr) undecayed = &t;
  }
  ASSERT_NE(decayed, nullptr);
  ASSERT_NE(undecayed, nullptr);
  for (const model::TensorInfo* t : {decayed, undecayed}) {
    SCOPED_TRACE(t->name);
    optim::AdamWOptions options;
    options.weight_decay = 0.1f;
    auto host = optim::AdamW::Create(layout, t->offset, t->numel, options);
    ASSERT_TRUE(host.ok()) << host.status();
    const size_t n = t->numel;
    std::vector<float> params = Uniform(rng_, n);
    DevicePtr d_p = UploadF32(params);
    DevicePtr d_m = UploadF32(std::vector<float>(n, 0.0f));
    DevicePtr d_v = UploadF32(std::vector<float>(n, 0.0f));
    for (int step = 1; step <= 3; ++step) {
      const std::vector<float> grads = Uniform(rng_, n);
      const float lr = 1e-2f * step;
      host->Step(absl::MakeSpan(params), grads, lr, nullptr);
      std::vector<float> doubled(n);
      for (size_t i = 0; i < n; ++i) doubled[i] = 2.0f * grads[i];
      DevicePtr d_g = UploadF32(doubled);
      AdamWArgs a;
      a.lr = lr;
      a.beta1 = options.beta1;
      a.beta2 = options.beta2;
      a.eps = options.eps;
      a.weight_decay = t->decay ? options.weight_decay : 0.0f;
      a.bias1 = static_cast<float>(1.0 - std::pow(double{options.beta1}, step));
      a.bias2 = static_cast<float>(1.0 - std::pow(double{options.beta2}, step));
      a.grad_scale = 0.5f;
      ASSERT_OK(AdamWUpdate(stream_, static_cast<float*>(d_p.get()),
                            static_cast<const float*>(d_g.get()), static_cast<float*>(d_m.get()),
                            static_cast<float*>(d_v.get()), static_cast<int64_t>(n), a));
      SCOPED_TRACE(step);
      ExpectClose(DownloadF32(d_p.get(), n), params, kFp32Tol, "params");
      ExpectClose(DownloadF32(d_m.get(), n), host->CopyM(0, n), kFp32Tol, "m");
      ExpectClose(DownloadF32(d_v.get(), n), host->CopyV(0, n), kFp32Tol, "v");
    }
  }
}

// The multi-tensor update against AdamWUpdate range by range, bit for bit:
// 300 ranges (3 launches of at most 128) of varying lengths, decayed and
// not alternating, one empty, gaps between them left untouched, a clip
// factor, the gradients zeroed in the same pass.
TEST_F(CudaKernelsTest, AdamWUpdateRangesEqualsOneLaunchPerRange) {
  std::vector<AdamWRangeArgs> ranges;
  int64_t at = 3;
  for (int k = 0; k < 300; ++k) {
    const int64_t len = k == 17 ? 0 : 1 + (k * 37) % 300;
    ranges.push_back({at, at + len, k % 2 == 0 ? 0.1f : 0.0f});
    at += len + (k % 5 == 0 ? 2 : 0);  // a gap after every fifth
  }
  const int64_t n = at + 5;
  const std::vector<float> p0 = Uniform(rng_, n), g0 = Uniform(rng_, n);
  const std::vector<float> m0 = Uniform(rng_, n), v0 = Uniform(rng_, n, 0.0f, 1.0f);
  AdamWArgs a;
  a.lr = 1e-2f;
  a.bias1 = 0.19f;
  a.bias2 = 0.0975f;
  a.grad_scale = 0.37f;
  std::vector<float> got[2][4];
  for (int multi = 0; multi < 2; ++multi) {
    DevicePtr p = UploadF32(p0), g = UploadF32(g0), m = UploadF32(m0), v = UploadF32(v0);
    auto* fp = static_cast<float*>(p.get());
    auto* fg = static_cast<float*>(g.get());
    auto* fm = static_cast<float*>(m.get());
    auto* fv = static_cast<float*>(v.get());
    if (multi) {
      ASSERT_OK(AdamWUpdateRanges(stream_, fp, fg, fm, fv, ranges.data(),
                                  static_cast<int>(ranges.size()), a, /*zero_grads=*/true));
    } else {
      for (const AdamWRangeArgs& r : ranges) {
        AdamWArgs ra = a;
        ra.weight_decay = r.weight_decay;
        ASSERT_OK(AdamWUpdate(stream_, fp + r.begin, fg + r.begin, fm + r.begin, fv + r.begin,
                              r.end - r.begin, ra));
        ASSERT_EQ(cudaMemset(fg + r.begin, 0, sizeof(float) * (r.end - r.begin)), cudaSuccess);
      }
    }
    got[multi][0] = DownloadF32(p.get(), n);
    got[multi][1] = DownloadF32(g.get(), n);
    got[multi][2] = DownloadF32(m.get(), n);
    got[multi][3] = DownloadF32(v.get(), n);
  }
  const char* names[] = {"params", "grads", "m", "v"};
  for (int i = 0; i < 4; ++i) ExpectSameBits(got[1][i], got[0][i], names[i]);
  EXPECT_EQ(got[1][0][0], p0[0]);          // before the first range: untouched
  EXPECT_EQ(got[1][1][n - 1], g0[n - 1]);  // after the last
}

// ----------------------------------------------------------- size checks

TEST_F(CudaKernelsTest, LaunchersRejectBadSizes) {
  const KernelCtx& k = Ctx(kF32);
  EXPECT_EQ(GeluForward(k, nullptr, nullptr, -1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MatmulForward(k, nullptr, nullptr, nullptr, nullptr, 4, 4, 8, 7).code(),
            absl::StatusCode::kInvalidArgument);  // ld_out < OC
  EXPECT_EQ(AttentionForward(k, nullptr, nullptr, nullptr, nullptr, 1, 4, 10, 4, 4).code(),
            absl::StatusCode::kInvalidArgument);  // NH does not divide C
  EXPECT_EQ(AttentionForward(k, nullptr, nullptr, nullptr, nullptr, 1, 4, 64, 4, 3).code(),
            absl::StatusCode::kInvalidArgument);  // KVH does not divide NH
  EXPECT_EQ(
      AttentionBackward(k, nullptr, nullptr, nullptr, nullptr, nullptr, 1, 4, 64, 4, 0).code(),
      absl::StatusCode::kInvalidArgument);  // KVH < 1
  EXPECT_EQ(RotaryForward(k, nullptr, nullptr, 1, 4, 2, 15, 64, false).code(),
            absl::StatusCode::kInvalidArgument);  // odd head size
  EXPECT_EQ(RotaryForward(k, nullptr, nullptr, 1, 4, 6, 16, 64, false).code(),
            absl::StatusCode::kInvalidArgument);  // heads·hs beyond the row
  EXPECT_EQ(SwiGluForward(k, nullptr, nullptr, -1, 8).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RmsNormForward(k, nullptr, nullptr, nullptr, nullptr, 1e-5f, 4, -1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CrossEntropyForward(k, nullptr, nullptr, nullptr, nullptr, 2, 65, 64).code(),
            absl::StatusCode::kInvalidArgument);  // V > Vp
  AdamWArgs bad;
  bad.bias1 = 0;
  EXPECT_EQ(AdamWUpdate(stream_, nullptr, nullptr, nullptr, nullptr, 4, bad).code(),
            absl::StatusCode::kInvalidArgument);
  // Nothing to do is not an error.
  EXPECT_TRUE(GeluForward(k, nullptr, nullptr, 0).ok());
  EXPECT_TRUE(LayerNormForward(k, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 8).ok());
  EXPECT_TRUE(RmsNormBackward(k, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 8).ok());
  EXPECT_TRUE(SwiGluBackward(k, nullptr, nullptr, nullptr, 0, 8).ok());
  EXPECT_TRUE(RotaryForward(k, nullptr, nullptr, 0, 4, 2, 16, 64, true).ok());
}

}  // namespace
}  // namespace shardtrain::engine::cuda
