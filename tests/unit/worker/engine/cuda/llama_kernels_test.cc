// The Llama family's layer kernels of kernels.h against their CPU twins
// (worker/engine/cpu/layers.h): RMSNorm, rotary positions, SwiGLU,
// grouped-query attention and the encoder without learned positions,
// forward and backward, in fp32 and bf16 (fp16 too for the row-wise and
// elementwise layers). Tolerances as kernels_test.cc's header states them,
// relative to the reference's largest magnitude: fp32 1e-5 (kFp32Tol),
// bf16 / fp16 2e-2 (kLowPrecisionTol; the CPU runs in fp32 on the inputs
// rounded to the compute type); fp32 statistics (rstd) 1e-5 in every
// compute type. Every comparison prints its max difference. Skip without a
// GPU.
#include <cstdio>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/model/slice.h"
#include "tests/unit/worker/engine/cuda/kernels_test_util.h"
#include "worker/engine/cuda/kernels.h"
#include "worker/engine/tensor_parallel.h"

namespace shardtrain::engine::cuda {
namespace {

// ExpectClose, printing the max difference relative to the reference's
// largest magnitude whatever the outcome.
void Compare(const std::vector<float>& got, const std::vector<float>& want, double tol,
             const std::string& what) {
  CompareAndPrint("llama-kernels", got, want, tol, what);
}

double Tol(DataType dtype) { return dtype == kF32 ? kFp32Tol : kLowPrecisionTol; }

// --------------------------------------------------------------- rmsnorm

// C = 100 and 128 (as the LayerNorm test); backward accumulates onto
// non-zero dinp and dweight; N = 1100: dweight's column sums in three row
// chunks.
TEST_F(CudaKernelsTest, RmsNormMatchesCpu) {
  const int N = 1100;
  const float eps = 1e-5f;
  // C = 100 (16-bit) is not whole packs: the one-channel input kernel; the
  // others' input gradient runs in 16-byte packs (Llama 3.2 1B's 2048
  // among them), and unfused in the one-channel kernel again.
  for (const auto& [dtype, C, fused] : {std::tuple<DataType, int, bool>{kF32, 100, true},
                                        {DataType::kBFloat16, 100, true},
                                        {DataType::kFloat16, 100, true},
                                        {kF32, 128, true},
                                        {DataType::kBFloat16, 128, true},
                                        {DataType::kBFloat16, 2048, true},
                                        {DataType::kBFloat16, 128, false}}) {
    const std::string label =
        absl::StrCat(DataTypeName(dtype), " C=", C, fused ? "" : " unfused", " rmsnorm ");
    SCOPED_TRACE(label);
    const double tol = Tol(dtype);
    const size_t NC = size_t{N} * C;
    const std::vector<float> inp = Rounded(dtype, Uniform(rng_, NC, -2.0f, 3.0f));
    const std::vector<float> weight = Rounded(dtype, Uniform(rng_, C, 0.5f, 1.5f));
    const std::vector<float> dout = Rounded(dtype, Uniform(rng_, NC));
    const std::vector<float> dinp0 = Rounded(dtype, Uniform(rng_, NC));
    const std::vector<float> dweight0 = Uniform(rng_, C);
    std::vector<float> out_ref(NC), rstd_ref(N);
    cpu::RmsNormForward<float>(out_ref.data(), rstd_ref.data(), inp.data(), weight.data(), eps, N,
                               C, nullptr);
    std::vector<float> dinp_ref = dinp0, dweight_ref = dweight0;
    cpu::RmsNormBackward<float>(dinp_ref.data(), dweight_ref.data(), dout.data(), inp.data(),
                                weight.data(), rstd_ref.data(), N, C, nullptr);

    KernelCtx k = Ctx(dtype);
    k.fused = fused;
    DevicePtr d_inp = Upload(dtype, inp), d_w = Upload(dtype, weight);
    DevicePtr d_out = Alloc(NC * DataTypeSize(dtype)), d_rstd = Alloc(N * sizeof(float));
    ASSERT_OK(RmsNormForward(k, d_out.get(), static_cast<float*>(d_rstd.get()), d_inp.get(),
                             d_w.get(), eps, N, C));
    Compare(Download(dtype, d_out.get(), NC), out_ref, tol, label + "out");
    Compare(DownloadF32(d_rstd.get(), N), rstd_ref, kFp32Tol, label + "rstd");

    DevicePtr d_dout = Upload(dtype, dout), d_dinp = Upload(dtype, dinp0);
    DevicePtr d_dw = UploadF32(dweight0);
    ASSERT_OK(RmsNormBackward(k, d_dinp.get(), static_cast<float*>(d_dw.get()), d_dout.get(),
                              d_inp.get(), d_w.get(), static_cast<const float*>(d_rstd.get()), N,
                              C));
    Compare(Download(dtype, d_dinp.get(), NC), dinp_ref, tol, label + "dinp");
    Compare(DownloadF32(d_dw.get(), C), dweight_ref, tol, label + "dweight");
  }
}

// The weight's gradient is a fixed-order column sum: the same bits twice.
TEST_F(CudaKernelsTest, RmsNormBackwardIsDeterministic) {
  const int N = 300, C = 100;
  const size_t NC = size_t{N} * C;
  const KernelCtx& k = Ctx(kF32);
  DevicePtr d_inp = UploadF32(Uniform(rng_, NC)), d_w = UploadF32(Uniform(rng_, C));
  DevicePtr d_dout = UploadF32(Uniform(rng_, NC)), d_out = Alloc(NC * sizeof(float));
  DevicePtr d_rstd = Alloc(N * sizeof(float));
  ASSERT_OK(RmsNormForward(k, d_out.get(), static_cast<float*>(d_rstd.get()), d_inp.get(),
                           d_w.get(), 1e-5f, N, C));
  std::vector<float> runs[2][2];
  for (auto& run : runs) {
    DevicePtr dinp = UploadF32(std::vector<float>(NC, 0.25f));
    DevicePtr dweight = UploadF32(std::vector<float>(C, 0.5f));
    ASSERT_OK(RmsNormBackward(k, dinp.get(), static_cast<float*>(dweight.get()), d_dout.get(),
                              d_inp.get(), d_w.get(), static_cast<const float*>(d_rstd.get()), N,
                              C));
    run[0] = DownloadF32(dinp.get(), NC);
    run[1] = DownloadF32(dweight.get(), C);
  }
  ExpectSameBits(runs[0][0], runs[1][0], "dinp");
  ExpectSameBits(runs[0][1], runs[1][1], "dweight");
}

// Qwen3's q/k norms: rows of (NH + 2·KVH)·hs = (4 + 2·2)·128 (hs 128 as
// Qwen3's), q's 4 heads by one weight and k's 2 by another into one saved
// buffer of 6 heads, as CudaModel::QkNormForward calls them; backward
// overwrites q's and k's gradient columns and adds into both weights'
// gradients. Never ran on a GPU when written (2026-11-28).
TEST_F(CudaKernelsTest, HeadRmsNormMatchesCpu) {
  const int N = 300, NH = 4, KVH = 2, hs = 128, ld = (NH + 2 * KVH) * hs, heads = NH + KVH;
  const float eps = 1e-6f;
  for (DataType dtype : {kF32, DataType::kBFloat16}) {
    const std::string label = absl::StrCat(DataTypeName(dtype), " head rmsnorm ");
    SCOPED_TRACE(label);
    const double tol = Tol(dtype);
    const size_t n = size_t{N} * ld, np = size_t{N} * heads * hs;
    const std::vector<float> x = Rounded(dtype, Uniform(rng_, n, -2.0f, 3.0f));
    const std::vector<float> wq = Rounded(dtype, Uniform(rng_, hs, 0.5f, 1.5f));
    const std::vector<float> wk = Rounded(dtype, Uniform(rng_, hs, 0.5f, 1.5f));
    const std::vector<float> dy = Rounded(dtype, Uniform(rng_, n));
    const std::vector<float> dwq0 = Uniform(rng_, hs), dwk0 = Uniform(rng_, hs);
    std::vector<float> y_ref = x, pre_ref(np), rstd_ref(size_t{N} * heads);
    cpu::HeadRmsNormForward<float>(y_ref.data(), ld, pre_ref.data(), rstd_ref.data(), heads,
                                   wq.data(), eps, N, NH, hs, nullptr);
    cpu::HeadRmsNormForward<float>(y_ref.data() + NH * hs, ld, pre_ref.data() + NH * hs,
                                   rstd_ref.data() + NH, heads, wk.data(), eps, N, KVH, hs,
                                   nullptr);
    std::vector<float> dx_ref = dy, dwq_ref = dwq0, dwk_ref = dwk0;
    cpu::HeadRmsNormBackward<float>(dx_ref.data(), ld, dwq_ref.data(), pre_ref.data(),
                                    rstd_ref.data(), heads, wq.data(), N, NH, hs, nullptr);
    cpu::HeadRmsNormBackward<float>(dx_ref.data() + NH * hs, ld, dwk_ref.data(),
                                    pre_ref.data() + NH * hs, rstd_ref.data() + NH, heads,
                                    wk.data(), N, KVH, hs, nullptr);

    const KernelCtx& k = Ctx(dtype);
    const size_t es = DataTypeSize(dtype);
    DevicePtr d_x = Upload(dtype, x), d_wq = Upload(dtype, wq), d_wk = Upload(dtype, wk);
    DevicePtr d_pre = Alloc(np * es), d_rstd = Alloc(size_t{N} * heads * sizeof(float));
    char* xp = static_cast<char*>(d_x.get());
    char* pp = static_cast<char*>(d_pre.get());
    float* rp = static_cast<float*>(d_rstd.get());
    ASSERT_OK(HeadRmsNormForward(k, xp, ld, pp, rp, heads, d_wq.get(), eps, N, NH, hs));
    ASSERT_OK(HeadRmsNormForward(k, xp + NH * hs * es, ld, pp + NH * hs * es, rp + NH, heads,
                                 d_wk.get(), eps, N, KVH, hs));
    Compare(Download(dtype, d_x.get(), n), y_ref, tol, label + "y (v's columns untouched)");
    Compare(Download(dtype, d_pre.get(), np), pre_ref, tol, label + "pre");
    Compare(DownloadF32(d_rstd.get(), size_t{N} * heads), rstd_ref, kFp32Tol, label + "rstd");

    DevicePtr d_dx = Upload(dtype, dy), d_dwq = UploadF32(dwq0), d_dwk = UploadF32(dwk0);
    char* dp = static_cast<char*>(d_dx.get());
    ASSERT_OK(HeadRmsNormBackward(k, dp, ld, static_cast<float*>(d_dwq.get()), pp, rp, heads,
                                  d_wq.get(), N, NH, hs));
    ASSERT_OK(HeadRmsNormBackward(k, dp + NH * hs * es, ld, static_cast<float*>(d_dwk.get()),
                                  pp + NH * hs * es, rp + NH, heads, d_wk.get(), N, KVH, hs));
    Compare(Download(dtype, d_dx.get(), n), dx_ref, tol, label + "dx");
    Compare(DownloadF32(d_dwq.get(), hs), dwq_ref, tol, label + "dweight q");
    Compare(DownloadF32(d_dwk.get(), hs), dwk_ref, tol, label + "dweight k");
  }
}

// ---------------------------------------------------------------- rotary

// The qkv rows of NH = 4 query and KVH = 2 kv heads of hs = 16 (rows of
// (4 + 2·2)·16): q's and k's 6 heads rotated by the model's table at each
// row's position (T = 37 < context = 40), v's columns untouched; the
// inverse rotation gives the input back.
TEST_F(CudaKernelsTest, RotaryMatchesCpuAndInverseRestoresTheInput) {
  model::LlamaShape shape;
  shape.layers = 1;
  shape.heads = 4;
  shape.kv_heads = 2;
  shape.dim = 64;
  shape.ffn_dim = 160;
  shape.context = 40;
  shape.vocab = 256;
  shape.rope_theta = 10000;
  absl::StatusOr<model::ModelConfig> config = model::MakeLlamaConfig(shape);
  ASSERT_TRUE(config.ok()) << config.status();
  const std::vector<float> table = model::RotaryTable(*config);
  const int B = 2, T = 37, NH = 4, KVH = 2, hs = config->head_dim();
  ASSERT_EQ(table.size(), size_t(shape.context) * hs);  // (context, hs/2, 2)
  const int heads = NH + KVH, ld = (NH + 2 * KVH) * hs;
  const size_t n = size_t{B} * T * ld;
  for (DataType dtype : {kF32, DataType::kBFloat16}) {
    const std::string label = absl::StrCat(DataTypeName(dtype), " rotary ");
    SCOPED_TRACE(label);
    const double tol = Tol(dtype);
    const std::vector<float> x = Rounded(dtype, Uniform(rng_, n, -2.0f, 2.0f));
    std::vector<float> ref = x;
    cpu::RotaryForward<float>(ref.data(), table.data(), B, T, heads, hs, ld, /*inverse=*/false,
                              nullptr);
    const KernelCtx& k = Ctx(dtype);
    DevicePtr d_table = UploadF32(table), d_x = Upload(dtype, x);
    ASSERT_OK(RotaryForward(k, d_x.get(), static_cast<const float*>(d_table.get()), B, T, heads, hs,
                            ld, /*inverse=*/false));
    const std::vector<float> rotated = Download(dtype, d_x.get(), n);
    Compare(rotated, ref, tol, label + "forward");
    std::vector<float> v_got, v_want;  // columns [heads·hs, ld) of every row
    for (size_t r = 0; r < size_t{B} * T; ++r) {
      for (int c = heads * hs; c < ld; ++c) {
        v_got.push_back(rotated[r * ld + c]);
        v_want.push_back(x[r * ld + c]);
      }
    }
    ExpectSameBits(v_got, v_want, "v's columns");
    ASSERT_OK(RotaryForward(k, d_x.get(), static_cast<const float*>(d_table.get()), B, T, heads, hs,
                            ld, /*inverse=*/true));
    Compare(Download(dtype, d_x.get(), n), x, tol, label + "inverse(forward(x)) vs x");
  }
}

// ---------------------------------------------------------------- swiglu

// H = 96 runs the 16-byte packs in every dtype (and, unfused, the
// one-element kernel); H = 100 packs only fp32's 4.
TEST_F(CudaKernelsTest, SwiGluMatchesCpu) {
  const int N = 67;
  for (const auto& [dtype, H, fused] : {std::tuple<DataType, int, bool>{kF32, 100, true},
                                        {DataType::kBFloat16, 100, true},
                                        {DataType::kFloat16, 100, true},
                                        {DataType::kBFloat16, 96, true},
                                        {DataType::kFloat16, 96, true},
                                        {DataType::kBFloat16, 96, false}}) {
    const std::string label =
        absl::StrCat(DataTypeName(dtype), " H=", H, fused ? "" : " unfused", " swiglu ");
    SCOPED_TRACE(label);
    const double tol = Tol(dtype);
    const size_t n_in = size_t{N} * 2 * H, n_out = size_t{N} * H;
    const std::vector<float> inp = Rounded(dtype, Uniform(rng_, n_in, -6.0f, 6.0f));
    const std::vector<float> dout = Rounded(dtype, Uniform(rng_, n_out));
    const std::vector<float> dinp0 = Rounded(dtype, Uniform(rng_, n_in));
    std::vector<float> out_ref(n_out), dinp_ref = dinp0;
    cpu::SwiGluForward<float>(out_ref.data(), inp.data(), N, H, nullptr);
    cpu::SwiGluBackward<float>(dinp_ref.data(), inp.data(), dout.data(), N, H, nullptr);

    KernelCtx k = Ctx(dtype);
    k.fused = fused;
    DevicePtr d_inp = Upload(dtype, inp), d_out = Alloc(n_out * DataTypeSize(dtype));
    ASSERT_OK(SwiGluForward(k, d_out.get(), d_inp.get(), N, H));
    Compare(Download(dtype, d_out.get(), n_out), out_ref, tol, label + "out");
    DevicePtr d_dout = Upload(dtype, dout), d_dinp = Upload(dtype, dinp0);
    ASSERT_OK(SwiGluBackward(k, d_dinp.get(), d_inp.get(), d_dout.get(), N, H));
    Compare(Download(dtype, d_dinp.get(), n_in), dinp_ref, tol, label + "dinp");
  }
}

// ------------------------------------------------ grouped-query attention

// NH = 4 query heads over KVH = 4 (multi-head), 2 and 1 (multi-query) kv
// heads, qkv rows of C + 2·KVH·hs; T = 37 (scalar softmax) and 40 (packed).
// Backward accumulates onto non-zero dqkv: each kv head's dK, dV sum their
// group's query heads.
TEST_F(CudaKernelsTest, GroupedQueryAttentionMatchesCpu) {
  const int B = 2, C = 64, NH = 4, hs = C / NH;
  for (int KVH : {4, 2, 1}) {
    for (const auto& [dtype, T] : {std::pair<DataType, int>{kF32, 37},
                                   {DataType::kBFloat16, 37},
                                   {kF32, 40},
                                   {DataType::kBFloat16, 40}}) {
      const std::string label =
          absl::StrCat(DataTypeName(dtype), " NH=", NH, " KVH=", KVH, " T=", T, " attention ");
      SCOPED_TRACE(label);
      const int W = C + 2 * KVH * hs;
      const size_t qkv_n = size_t{B} * T * W, out_n = size_t{B} * T * C;
      const size_t att_n = size_t{B} * NH * T * T;
      const double tol = Tol(dtype);
      const std::vector<float> qkv = Rounded(dtype, Uniform(rng_, qkv_n));
      const std::vector<float> dout = Rounded(dtype, Uniform(rng_, out_n));
      const std::vector<float> dqkv0 = Rounded(dtype, Uniform(rng_, qkv_n));
      std::vector<float> out_ref(out_n), att_ref(att_n), scratch_ref(att_n);
      cpu::AttentionForward<float>(out_ref.data(), att_ref.data(), qkv.data(), B, T, C, NH, KVH,
                                   nullptr);
      std::vector<float> dqkv_ref = dqkv0;
      cpu::AttentionBackward<float>(dqkv_ref.data(), dout.data(), qkv.data(), att_ref.data(),
                                    scratch_ref.data(), B, T, C, NH, KVH, nullptr);

      const KernelCtx& k = Ctx(dtype);
      const size_t eb = DataTypeSize(dtype);
      DevicePtr d_qkv = Upload(dtype, qkv), d_out = Alloc(out_n * eb);
      DevicePtr d_att = Alloc(att_n * eb), d_scratch = Alloc(att_n * eb);
      ASSERT_OK(AttentionForward(k, d_out.get(), d_att.get(), d_scratch.get(), d_qkv.get(), B, T, C,
                                 NH, KVH));
      Compare(Download(dtype, d_att.get(), att_n), att_ref, tol, label + "att");
      Compare(Download(dtype, d_out.get(), out_n), out_ref, tol, label + "out");

      DevicePtr d_dout = Upload(dtype, dout), d_dqkv = Upload(dtype, dqkv0);
      ASSERT_OK(AttentionBackward(k, d_dqkv.get(), d_scratch.get(), d_dout.get(), d_qkv.get(),
                                  d_att.get(), B, T, C, NH, KVH));
      const std::vector<float> dqkv = Download(dtype, d_dqkv.get(), qkv_n);
      Compare(dqkv, dqkv_ref, tol, label + "dqkv");
      // dQ, dK and dV separately: a wrong group mapping shows in dK / dV.
      for (const auto& [part, first, last] : {std::tuple<const char*, int, int>{"dQ", 0, C},
                                              {"dK", C, C + KVH * hs},
                                              {"dV", C + KVH * hs, W}}) {
        std::vector<float> got, want;
        for (size_t r = 0; r < size_t{B} * T; ++r) {
          for (int c = first; c < last; ++c) {
            got.push_back(dqkv[r * W + c]);
            want.push_back(dqkv_ref[r * W + c]);
          }
        }
        Compare(got, want, tol, label + part);
      }
    }
  }
}

// The group's heads add into the shared dK, dV one GEMM after the other:
// the same bits twice (KVH = 1: every query head into one kv head).
TEST_F(CudaKernelsTest, GroupedQueryAttentionBackwardIsDeterministic) {
  const int B = 2, T = 37, C = 64, NH = 4, KVH = 1;
  const int W = C + 2 * KVH * (C / NH);
  const size_t qkv_n = size_t{B} * T * W, att_n = size_t{B} * NH * T * T;
  const KernelCtx& k = Ctx(kF32);
  DevicePtr d_qkv = UploadF32(Uniform(rng_, qkv_n));
  DevicePtr d_dout = UploadF32(Uniform(rng_, size_t{B} * T * C));
  DevicePtr d_out = Alloc(size_t{B} * T * C * sizeof(float));
  DevicePtr d_att = Alloc(att_n * sizeof(float)), d_scratch = Alloc(att_n * sizeof(float));
  ASSERT_OK(AttentionForward(k, d_out.get(), d_att.get(), d_scratch.get(), d_qkv.get(), B, T, C, NH,
                             KVH));
  std::vector<float> runs[2];
  for (auto& run : runs) {
    DevicePtr d_dqkv = UploadF32(std::vector<float>(qkv_n, 0.25f));
    ASSERT_OK(AttentionBackward(k, d_dqkv.get(), d_scratch.get(), d_dout.get(), d_qkv.get(),
                                d_att.get(), B, T, C, NH, KVH));
    run = DownloadF32(d_dqkv.get(), qkv_n);
  }
  ExpectSameBits(runs[0], runs[1], "dqkv");
}

// --------------------------------------------- encoder without positions

// wpe and dwpe null (rotary models): out is wte's rows, dwte the scatter
// of dout; the vocabulary-parallel shards (tp = 2, wpe null on every rank)
// sum to the whole and their gradients are the whole's rows.
TEST_F(CudaKernelsTest, EncoderWithoutPositionsMatchesCpu) {
  const int B = 2, T = 37, C = 48, V = 61, Vp = 64, tp = 2;
  for (DataType dtype : {kF32, DataType::kBFloat16}) {
    const std::string label = absl::StrCat(DataTypeName(dtype), " encoder without wpe ");
    SCOPED_TRACE(label);
    const std::vector<float> wte = Rounded(dtype, Uniform(rng_, size_t{Vp} * C));
    std::vector<int> tokens = Ids(rng_, B * T, V);
    tokens[3] = tokens[0];  // repeated ids
    const std::vector<float> dout = Rounded(dtype, Uniform(rng_, size_t{B} * T * C));
    const std::vector<float> dwte0 = Uniform(rng_, size_t{Vp} * C);
    const size_t n = size_t{B} * T * C;
    std::vector<float> out_ref(n), dwte_ref = dwte0;
    cpu::EncoderForward<float>(out_ref.data(), tokens.data(), wte.data(), nullptr, B, T, C,
                               nullptr);
    cpu::EncoderBackward<float>(dwte_ref.data(), nullptr, dout.data(), tokens.data(), B, T, C);

    const KernelCtx& k = Ctx(dtype);
    DevicePtr d_wte = Upload(dtype, wte), d_tok = UploadInts(tokens);
    DevicePtr d_out = Alloc(n * DataTypeSize(dtype));
    ASSERT_OK(EncoderForward(k, d_out.get(), static_cast<const int*>(d_tok.get()), d_wte.get(),
                             nullptr, B, T, C));
    // A row of wte copied: exact in every compute type.
    ExpectSameBits(Download(dtype, d_out.get(), n), out_ref, label + "out");
    DevicePtr d_dout = Upload(dtype, dout), d_dwte = UploadF32(dwte0);
    ASSERT_OK(EncoderBackward(k, static_cast<float*>(d_dwte.get()), nullptr, d_dout.get(),
                              static_cast<const int*>(d_tok.get()), B, T, C));
    Compare(DownloadF32(d_dwte.get(), dwte0.size()), dwte_ref, kFp32Tol, label + "dwte");

    std::vector<float> sum(n, 0.0f);
    for (int r = 0; r < tp; ++r) {
      SCOPED_TRACE(r);
      const VocabShard v = VocabShardOf(V, Vp, tp, r);
      const std::vector<float> shard(wte.begin() + int64_t{v.v0} * C,
                                     wte.begin() + int64_t{v.v0 + v.Vpt} * C);
      DevicePtr d_shard = Upload(dtype, shard), d_part = Alloc(n * DataTypeSize(dtype));
      ASSERT_OK(EncoderForwardShard(k, d_part.get(), static_cast<const int*>(d_tok.get()),
                                    d_shard.get(), nullptr, v.v0, v.real, B, T, C));
      const std::vector<float> part = Download(dtype, d_part.get(), n);
      for (size_t i = 0; i < n; ++i) sum[i] += part[i];
      const std::vector<float> dshard0(dwte0.begin() + int64_t{v.v0} * C,
                                       dwte0.begin() + int64_t{v.v0 + v.Vpt} * C);
      DevicePtr d_dshard = UploadF32(dshard0);
      ASSERT_OK(EncoderBackwardShard(k, static_cast<float*>(d_dshard.get()), nullptr, d_dout.get(),
                                     static_cast<const int*>(d_tok.get()), v.v0, v.real, B, T, C));
      const std::vector<float> want(dwte_ref.begin() + int64_t{v.v0} * C,
                                    dwte_ref.begin() + int64_t{v.v0 + v.Vpt} * C);
      Compare(DownloadF32(d_dshard.get(), want.size()), want, kFp32Tol,
              absl::StrCat(label, "dwte shard ", r));
    }
    ExpectSameBits(sum, out_ref, label + "sum of the shards");
  }
}

// --------------------------------------------- attention by blocks (cp)

// Context parallelism's ring on one rank of cp 2 (its chunks 0 and 3 of 4):
// forward over its own block, then the other rank's (merged by logsumexp),
// backward over both, against the CPU's functions of the same names on the
// same (rounded) inputs; grouped-query heads.
TEST_F(CudaKernelsTest, AttentionBlocksMatchCpu) {
  const int B = 2, T = 16, cp = 2, Tl = T / cp, NH = 4, KVH = 2, hs = 8;
  const int C = NH * hs, KV = KVH * hs, W = C + 2 * KV;
  for (DataType dtype : {kF32, DataType::kBFloat16}) {
    const std::string label = absl::StrCat(DataTypeName(dtype), " cp2 blocks ");
    SCOPED_TRACE(label);
    const double tol = Tol(dtype);
    const std::vector<int> pos0 = model::ContextChunkPositions(T, cp, 0);
    const std::vector<int> pos1 = model::ContextChunkPositions(T, cp, 1);
    const std::vector<float> qkv = Rounded(dtype, Uniform(rng_, size_t(B) * Tl * W));
    const std::vector<float> kv1 = Rounded(dtype, Uniform(rng_, size_t(B) * Tl * 2 * KV));
    const std::vector<float> dout = Rounded(dtype, Uniform(rng_, size_t(B) * Tl * C));
    const size_t rows = size_t(B) * NH * Tl, sq = rows * Tl;
    // The CPU: own block, then rank 1's.
    std::vector<float> kv0(size_t(B) * Tl * 2 * KV), out(size_t(B) * Tl * C), lse(rows);
    std::vector<float> bo(out.size()), bl(rows), s1(sq), s2(sq), D(rows);
    cpu::CopyKv<float>(kv0.data(), qkv.data(), B, Tl, C, KV, nullptr);
    cpu::AttentionBlockForward<float>(out.data(), lse.data(), bo.data(), bl.data(), qkv.data(),
                                      kv0.data(), pos0.data(), pos0.data(), B, Tl, Tl, C, NH, KVH,
                                      true, s1.data(), nullptr);
    cpu::AttentionBlockForward<float>(out.data(), lse.data(), bo.data(), bl.data(), qkv.data(),
                                      kv1.data(), pos0.data(), pos1.data(), B, Tl, Tl, C, NH, KVH,
                                      false, s1.data(), nullptr);
    const std::vector<float> out_r = Rounded(dtype, out);
    cpu::AttentionRowDot<float>(D.data(), dout.data(), out_r.data(), B, Tl, C, NH, nullptr);
    std::vector<float> dqkv(qkv.size(), 0.0f), dkv0(kv0.size(), 0.0f), dkv1(kv1.size(), 0.0f);
    cpu::AttentionBlockBackward<float>(dqkv.data(), dkv0.data(), dout.data(), qkv.data(),
                                       kv0.data(), lse.data(), D.data(), pos0.data(), pos0.data(),
                                       B, Tl, Tl, C, NH, KVH, s1.data(), s2.data(), nullptr);
    cpu::AttentionBlockBackward<float>(dqkv.data(), dkv1.data(), dout.data(), qkv.data(),
                                       kv1.data(), lse.data(), D.data(), pos0.data(), pos1.data(),
                                       B, Tl, Tl, C, NH, KVH, s1.data(), s2.data(), nullptr);
    cpu::AddKvGrad<float>(dqkv.data(), dkv0.data(), B, Tl, C, KV, nullptr);

    const KernelCtx& k = Ctx(dtype);
    const size_t e = DataTypeSize(dtype);
    DevicePtr d_qkv = Upload(dtype, qkv), d_kv1 = Upload(dtype, kv1), d_dout = Upload(dtype, dout);
    DevicePtr d_p0 = UploadInts(pos0), d_p1 = UploadInts(pos1);
    DevicePtr d_kv0 = Alloc(kv0.size() * e), d_out = Alloc(out.size() * e),
              d_bo = Alloc(out.size() * e), d_s1 = Alloc(sq * e), d_s2 = Alloc(sq * e);
    DevicePtr d_lse = Alloc(rows * 4), d_bl = Alloc(rows * 4), d_D = Alloc(rows * 4);
    const int* p0 = static_cast<const int*>(d_p0.get());
    const int* p1 = static_cast<const int*>(d_p1.get());
    ASSERT_OK(CopyKv(k, d_kv0.get(), d_qkv.get(), B, Tl, C, KV));
    Compare(Download(dtype, d_kv0.get(), kv0.size()), kv0, tol, label + "kv");
    ASSERT_OK(AttentionBlockForward(k, d_out.get(), static_cast<float*>(d_lse.get()), d_bo.get(),
                                    static_cast<float*>(d_bl.get()), d_s1.get(), d_qkv.get(),
                                    d_kv0.get(), p0, p0, B, Tl, Tl, C, NH, KVH, true));
    ASSERT_OK(AttentionBlockForward(k, d_out.get(), static_cast<float*>(d_lse.get()), d_bo.get(),
                                    static_cast<float*>(d_bl.get()), d_s1.get(), d_qkv.get(),
                                    d_kv1.get(), p0, p1, B, Tl, Tl, C, NH, KVH, false));
    Compare(Download(dtype, d_out.get(), out.size()), out, tol, label + "out");
    Compare(DownloadF32(d_lse.get(), rows), lse, kFp32Tol * 10, label + "lse");
    ASSERT_OK(AttentionRowDot(k, static_cast<float*>(d_D.get()), d_dout.get(), d_out.get(), B, Tl,
                              C, NH));
    DevicePtr d_dqkv = Upload(dtype, std::vector<float>(qkv.size(), 0.0f));
    DevicePtr d_dkv0 = Upload(dtype, std::vector<float>(kv0.size(), 0.0f));
    DevicePtr d_dkv1 = Upload(dtype, std::vector<float>(kv1.size(), 0.0f));
    ASSERT_OK(AttentionBlockBackward(
        k, d_dqkv.get(), d_dkv0.get(), d_s1.get(), d_s2.get(), d_dout.get(), d_qkv.get(),
        d_kv0.get(), static_cast<const float*>(d_lse.get()), static_cast<const float*>(d_D.get()),
        p0, p0, B, Tl, Tl, C, NH, KVH));
    ASSERT_OK(AttentionBlockBackward(
        k, d_dqkv.get(), d_dkv1.get(), d_s1.get(), d_s2.get(), d_dout.get(), d_qkv.get(),
        d_kv1.get(), static_cast<const float*>(d_lse.get()), static_cast<const float*>(d_D.get()),
        p0, p1, B, Tl, Tl, C, NH, KVH));
    ASSERT_OK(AddKvGrad(k, d_dqkv.get(), d_dkv0.get(), B, Tl, C, KV));
    Compare(Download(dtype, d_dqkv.get(), dqkv.size()), dqkv, tol, label + "dqkv");
    Compare(Download(dtype, d_dkv1.get(), dkv1.size()), dkv1, tol, label + "dkv (rank 1's block)");
  }
}

}  // namespace
}  // namespace shardtrain::engine::cuda
