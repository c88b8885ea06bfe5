// The layer kernels of kernels.h against their CPU twins
// (worker/engine/cpu/layers.h): conversions, encoder, layernorm, matmul,
// attention, GELU, residual and cross-entropy, forward and backward, in fp32
// and bf16/fp16 (tolerances in kernels_test.cc's header comment), and the
// determinism of the backward reductions. Skip without a GPU.
#include "absl/strings/str_cat.h"
#include "tests/unit/worker/engine/cuda/kernels_test_util.h"
#include "worker/engine/cpu/vocab_parallel.h"
#include "worker/engine/cuda/kernels.h"

namespace shardtrain::engine::cuda {
namespace {

// ------------------------------------------------------------ conversions

// Round to nearest even on the device gives the host's bits (dtype.h), and
// back to fp32 exactly; NaN stays NaN.
TEST_F(CudaKernelsTest, ConvertMatchesHostRounding) {
  std::vector<float> x = Uniform(rng_, 1000, -70000.0f, 70000.0f);
  const std::vector<float> edge = {0.0f,     -0.0f, 1.0f,     1.00390625f, 1.01171875f,
                                   1e-40f,   6e-8f, 65504.0f, 65520.0f,    70000.0f,
                                   -3.0e38f, 1e-5f, INFINITY, -INFINITY,   0.333333343f};
  x.insert(x.end(), edge.begin(), edge.end());
  x.push_back(NAN);
  const size_t n = x.size();
  for (DataType dtype : {DataType::kBFloat16, DataType::kFloat16, kF32}) {
    SCOPED_TRACE(std::string(DataTypeName(dtype)));
    const KernelCtx& k = Ctx(dtype);
    DevicePtr src = UploadF32(x);
    DevicePtr dst = Alloc(n * DataTypeSize(dtype));
    DevicePtr back = Alloc(n * sizeof(float));
    ASSERT_OK(ConvertFromFloat32(k, dst.get(), static_cast<const float*>(src.get()), n));
    ASSERT_OK(ConvertToFloat32(k, static_cast<float*>(back.get()), dst.get(), n));
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    std::vector<uint8_t> got(n * DataTypeSize(dtype)), want(got.size());
    ASSERT_EQ(cudaMemcpy(got.data(), dst.get(), got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    FromFloat32(dtype, x.data(), want.data(), n);
    const size_t eb = DataTypeSize(dtype);
    for (size_t i = 0; i + 1 < n; ++i) {  // all but the NaN: bit for bit
      EXPECT_EQ(std::memcmp(got.data() + i * eb, want.data() + i * eb, eb), 0)
          << "element " << i << " = " << x[i];
    }
    const std::vector<float> b = DownloadF32(back.get(), n);
    const std::vector<float> want_back = Rounded(dtype, x);
    for (size_t i = 0; i + 1 < n; ++i) EXPECT_EQ(b[i], want_back[i]) << "element " << i;
    EXPECT_TRUE(std::isnan(b[n - 1]));
  }
}

// ---------------------------------------------------------------- encoder

TEST_F(CudaKernelsTest, EncoderMatchesCpu) {
  const int B = 2, T = 37, C = 48, V = 61, Vp = 64, context = 40;
  const std::vector<float> wte = Uniform(rng_, size_t{Vp} * C), wpe = Uniform(rng_, context * C);
  std::vector<int> tokens = Ids(rng_, B * T, V);
  tokens[3] = tokens[0];  // repeated ids, also across sequences
  tokens[T + 1] = tokens[0];
  const std::vector<float> dout = Uniform(rng_, size_t{B} * T * C);
  const std::vector<float> dwte0 = Uniform(rng_, size_t{Vp} * C);
  const std::vector<float> dwpe0 = Uniform(rng_, size_t{context} * C);

  std::vector<float> out_ref(size_t{B} * T * C);
  cpu::EncoderForward<float>(out_ref.data(), tokens.data(), wte.data(), wpe.data(), B, T, C,
                             nullptr);
  std::vector<float> dwte_ref = dwte0, dwpe_ref = dwpe0;
  cpu::EncoderBackward<float>(dwte_ref.data(), dwpe_ref.data(), dout.data(), tokens.data(), B, T,
                              C);

  const KernelCtx& k = Ctx(kF32);
  DevicePtr d_wte = UploadF32(wte), d_wpe = UploadF32(wpe), d_tok = UploadInts(tokens);
  DevicePtr d_out = Alloc(out_ref.size() * sizeof(float));
  ASSERT_OK(EncoderForward(k, d_out.get(), static_cast<const int*>(d_tok.get()), d_wte.get(),
                           d_wpe.get(), B, T, C));
  ExpectClose(DownloadF32(d_out.get(), out_ref.size()), out_ref, kFp32Tol, "encoder out");

  DevicePtr d_dout = UploadF32(dout), d_dwte = UploadF32(dwte0), d_dwpe = UploadF32(dwpe0);
  ASSERT_OK(EncoderBackward(k, static_cast<float*>(d_dwte.get()), static_cast<float*>(d_dwpe.get()),
                            d_dout.get(), static_cast<const int*>(d_tok.get()), B, T, C));
  ExpectClose(DownloadF32(d_dwte.get(), dwte_ref.size()), dwte_ref, kFp32Tol, "dwte");
  ExpectClose(DownloadF32(d_dwpe.get(), dwpe_ref.size()), dwpe_ref, kFp32Tol, "dwpe");
}

// Many repeated token ids: the per-channel walk gives the same bits twice.
TEST_F(CudaKernelsTest, EncoderBackwardIsDeterministic) {
  const int B = 8, T = 64, C = 96, Vp = 64, V = 5;
  const std::vector<int> tokens = Ids(rng_, B * T, V);
  const std::vector<float> dout = Uniform(rng_, size_t{B} * T * C);
  const std::vector<float> dwte0 = Uniform(rng_, size_t{Vp} * C);
  const std::vector<float> dwpe0 = Uniform(rng_, size_t{T} * C);
  const KernelCtx& k = Ctx(kF32);
  DevicePtr d_tok = UploadInts(tokens), d_dout = UploadF32(dout);
  std::vector<float> runs[2][2];
  for (auto& run : runs) {
    DevicePtr d_dwte = UploadF32(dwte0), d_dwpe = UploadF32(dwpe0);
    ASSERT_OK(EncoderBackward(k, static_cast<float*>(d_dwte.get()),
                              static_cast<float*>(d_dwpe.get()), d_dout.get(),
                              static_cast<const int*>(d_tok.get()), B, T, C));
    run[0] = DownloadF32(d_dwte.get(), dwte0.size());
    run[1] = DownloadF32(d_dwpe.get(), dwpe0.size());
  }
  ExpectSameBits(runs[0][0], runs[1][0], "dwte");
  ExpectSameBits(runs[0][1], runs[1][1], "dwpe");
}

// The vocabulary-parallel embedding over 3 tp ranks (V = 61, Vp = 66: the
// last rank holds 19 real rows of 22): each rank's shard lookup (wpe added
// by rank 0 only) summed over the ranks is the whole encoder's output
// exactly, and each rank's backward equals the CPU's VocabParallel one.
TEST_F(CudaKernelsTest, EncoderShardsMatchTheVocabParallelCpu) {
  const int B = 2, T = 37, C = 48, V = 61, Vp = 66, context = 40, tp = 3;
  const std::vector<float> wte = Uniform(rng_, size_t{Vp} * C), wpe = Uniform(rng_, context * C);
  const std::vector<int> tokens = Ids(rng_, B * T, V);
  const std::vector<float> dout = Uniform(rng_, size_t{B} * T * C);
  std::vector<float> whole(size_t{B} * T * C);
  cpu::EncoderForward<float>(whole.data(), tokens.data(), wte.data(), wpe.data(), B, T, C, nullptr);
  const KernelCtx& k = Ctx(kF32);
  DevicePtr d_tok = UploadInts(tokens), d_wpe = UploadF32(wpe), d_dout = UploadF32(dout);
  std::vector<float> sum(whole.size(), 0.0f);
  for (int r = 0; r < tp; ++r) {
    SCOPED_TRACE(r);
    const VocabShard v = VocabShardOf(V, Vp, tp, r);
    const std::vector<float> shard(wte.begin() + int64_t{v.v0} * C,
                                   wte.begin() + int64_t{v.v0 + v.Vpt} * C);
    DevicePtr d_shard = UploadF32(shard), d_out = Alloc(whole.size() * sizeof(float));
    ASSERT_OK(EncoderForwardShard(k, d_out.get(), static_cast<const int*>(d_tok.get()),
                                  d_shard.get(), r == 0 ? d_wpe.get() : nullptr, v.v0, v.real, B, T,
                                  C));
    const std::vector<float> out = DownloadF32(d_out.get(), whole.size());
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += out[i];

    std::vector<float> dshard_ref(static_cast<size_t>(v.Vpt) * C, 0.5f);
    std::vector<float> dwpe_ref(static_cast<size_t>(context) * C, 0.25f);
    cpu::VocabParallelEncoderBackward(dshard_ref.data(), dwpe_ref.data(), dout.data(),
                                      tokens.data(), B, T, C, v);
    DevicePtr d_dshard = UploadF32(std::vector<float>(dshard_ref.size(), 0.5f));
    DevicePtr d_dwpe = UploadF32(std::vector<float>(dwpe_ref.size(), 0.25f));
    ASSERT_OK(EncoderBackwardShard(k, static_cast<float*>(d_dshard.get()),
                                   static_cast<float*>(d_dwpe.get()), d_dout.get(),
                                   static_cast<const int*>(d_tok.get()), v.v0, v.real, B, T, C));
    ExpectSameBits(DownloadF32(d_dshard.get(), dshard_ref.size()), dshard_ref, "dwte shard");
    ExpectClose(DownloadF32(d_dwpe.get(), dwpe_ref.size()), dwpe_ref, kFp32Tol, "dwpe");
  }
  ExpectSameBits(sum, whole, "sum of the shards' embeddings");
}

// -------------------------------------------------------------- layernorm

// C = 100: 16-bit rows are not whole 16-byte packs (the scalar kernels);
// C = 128: they are (the packed dinp kernel). fp32 rows are packs at both.
// N = 1100: the parameter gradients' column sums run in three row chunks.
struct LayerNormCase {
  static constexpr int N = 1100;
  int C;
  std::vector<float> inp, weight, bias, dout, dinp0, dweight0, dbias0;
  LayerNormCase(std::mt19937& rng, DataType dtype, int c) : C(c) {
    inp = Rounded(dtype, Uniform(rng, size_t{N} * C, -2.0f, 3.0f));
    weight = Rounded(dtype, Uniform(rng, C, 0.5f, 1.5f));
    bias = Rounded(dtype, Uniform(rng, C));
    dout = Rounded(dtype, Uniform(rng, size_t{N} * C));
    dinp0 = Rounded(dtype, Uniform(rng, size_t{N} * C));
    dweight0 = Uniform(rng, C);
    dbias0 = Uniform(rng, C);
  }
};

// Forward (out, mean, rstd) and backward (dinp, dweight, dbias accumulated
// onto non-zero values) against the CPU on the same (rounded) inputs.
TEST_F(CudaKernelsTest, LayerNormMatchesCpu) {
  for (const auto& [dtype, C] : {std::pair<DataType, int>{kF32, 100},
                                 {DataType::kBFloat16, 100},
                                 {DataType::kFloat16, 100},
                                 {kF32, 128},
                                 {DataType::kBFloat16, 128},
                                 {DataType::kFloat16, 128}}) {
    SCOPED_TRACE(absl::StrCat(DataTypeName(dtype), " C=", C));
    const double tol = dtype == kF32 ? kFp32Tol : kLowPrecisionTol;
    LayerNormCase c(rng_, dtype, C);
    const int N = LayerNormCase::N;
    const size_t NC = size_t{N} * C;
    std::vector<float> out_ref(NC), mean_ref(N), rstd_ref(N);
    cpu::LayerNormForward<float>(out_ref.data(), mean_ref.data(), rstd_ref.data(), c.inp.data(),
                                 c.weight.data(), c.bias.data(), N, C, nullptr);
    std::vector<float> dinp_ref = c.dinp0, dweight_ref = c.dweight0, dbias_ref = c.dbias0;
    cpu::LayerNormBackward<float>(dinp_ref.data(), dweight_ref.data(), dbias_ref.data(),
                                  c.dout.data(), c.inp.data(), c.weight.data(), mean_ref.data(),
                                  rstd_ref.data(), N, C, nullptr);

    const KernelCtx& k = Ctx(dtype);
    DevicePtr inp = Upload(dtype, c.inp), weight = Upload(dtype, c.weight);
    DevicePtr bias = Upload(dtype, c.bias), out = Alloc(NC * DataTypeSize(dtype));
    DevicePtr mean = Alloc(N * sizeof(float)), rstd = Alloc(N * sizeof(float));
    ASSERT_OK(LayerNormForward(k, out.get(), static_cast<float*>(mean.get()),
                               static_cast<float*>(rstd.get()), inp.get(), weight.get(), bias.get(),
                               N, C));
    ExpectClose(Download(dtype, out.get(), NC), out_ref, tol, "layernorm out");
    // mean and rstd are fp32 from the same rounded inputs.
    ExpectClose(DownloadF32(mean.get(), N), mean_ref, kFp32Tol, "mean");
    ExpectClose(DownloadF32(rstd.get(), N), rstd_ref, kFp32Tol, "rstd");

    DevicePtr dout = Upload(dtype, c.dout), dinp = Upload(dtype, c.dinp0);
    DevicePtr dweight = UploadF32(c.dweight0), dbias = UploadF32(c.dbias0);
    ASSERT_OK(LayerNormBackward(k, dinp.get(), static_cast<float*>(dweight.get()),
                                static_cast<float*>(dbias.get()), dout.get(), inp.get(),
                                weight.get(), static_cast<const float*>(mean.get()),
                                static_cast<const float*>(rstd.get()), N, C));
    ExpectClose(Download(dtype, dinp.get(), NC), dinp_ref, tol, "layernorm dinp");
    ExpectClose(DownloadF32(dweight.get(), C), dweight_ref, tol, "layernorm dweight");
    ExpectClose(DownloadF32(dbias.get(), C), dbias_ref, tol, "layernorm dbias");
  }
}

TEST_F(CudaKernelsTest, LayerNormBackwardIsDeterministic) {
  const int N = 300, C = 100;
  const size_t NC = size_t{N} * C;
  const std::vector<float> inp = Uniform(rng_, NC), weight = Uniform(rng_, C);
  const std::vector<float> bias = Uniform(rng_, C), dout = Uniform(rng_, NC);
  const KernelCtx& k = Ctx(kF32);
  DevicePtr d_inp = UploadF32(inp), d_w = UploadF32(weight), d_b = UploadF32(bias);
  DevicePtr d_dout = UploadF32(dout), d_out = Alloc(NC * sizeof(float));
  DevicePtr mean = Alloc(N * sizeof(float)), rstd = Alloc(N * sizeof(float));
  ASSERT_OK(LayerNormForward(k, d_out.get(), static_cast<float*>(mean.get()),
                             static_cast<float*>(rstd.get()), d_inp.get(), d_w.get(), d_b.get(), N,
                             C));
  std::vector<float> runs[2][3];
  for (auto& run : runs) {
    DevicePtr dinp = UploadF32(std::vector<float>(NC, 0.25f));
    DevicePtr dweight = UploadF32(std::vector<float>(C, 0.5f));
    DevicePtr dbias = UploadF32(std::vector<float>(C, -0.5f));
    ASSERT_OK(LayerNormBackward(k, dinp.get(), static_cast<float*>(dweight.get()),
                                static_cast<float*>(dbias.get()), d_dout.get(), d_inp.get(),
                                d_w.get(), static_cast<const float*>(mean.get()),
                                static_cast<const float*>(rstd.get()), N, C));
    run[0] = DownloadF32(dinp.get(), NC);
    run[1] = DownloadF32(dweight.get(), C);
    run[2] = DownloadF32(dbias.get(), C);
  }
  ExpectSameBits(runs[0][0], runs[1][0], "dinp");
  ExpectSameBits(runs[0][1], runs[1][1], "dweight");
  ExpectSameBits(runs[0][2], runs[1][2], "dbias");
}

// ----------------------------------------------------------------- matmul

// out (N,OC) with a row stride > OC (the padding columns must stay as they
// were), with and without bias; backward with dout's row stride > OC, every
// gradient accumulated onto non-zero values, and with dinp / dbias null.
// N = 1100: dbias's column sums run in three row chunks.
TEST_F(CudaKernelsTest, MatmulMatchesCpu) {
  const int N = 1100, C = 100, OC = 61, ld = 64;
  for (DataType dtype : {kF32, DataType::kBFloat16, DataType::kFloat16}) {
    SCOPED_TRACE(std::string(DataTypeName(dtype)));
    const double tol = dtype == kF32 ? kFp32Tol : kLowPrecisionTol;
    const KernelCtx& k = Ctx(dtype);
    const std::vector<float> inp = Rounded(dtype, Uniform(rng_, size_t{N} * C));
    const std::vector<float> weight = Rounded(dtype, Uniform(rng_, size_t{OC} * C));
    const std::vector<float> bias = Rounded(dtype, Uniform(rng_, OC));
    const std::vector<float> out0 = Rounded(dtype, Uniform(rng_, size_t{N} * ld, 5.0f, 6.0f));
    DevicePtr d_inp = Upload(dtype, inp), d_w = Upload(dtype, weight), d_b = Upload(dtype, bias);
    for (bool with_bias : {true, false}) {
      SCOPED_TRACE(with_bias ? "with bias" : "without bias");
      std::vector<float> out_ref = out0;
      cpu::MatmulForward<float>(out_ref.data(), inp.data(), weight.data(),
                                with_bias ? bias.data() : nullptr, N, C, OC, ld, nullptr);
      DevicePtr d_out = Upload(dtype, out0);
      ASSERT_OK(MatmulForward(k, d_out.get(), d_inp.get(), d_w.get(),
                              with_bias ? d_b.get() : nullptr, N, C, OC, ld));
      ExpectClose(Download(dtype, d_out.get(), out0.size()), out_ref, tol, "matmul out");
    }

    const std::vector<float> dout = Rounded(dtype, Uniform(rng_, size_t{N} * ld));
    const std::vector<float> dinp0 = Rounded(dtype, Uniform(rng_, size_t{N} * C));
    const std::vector<float> dweight0 = Uniform(rng_, size_t{OC} * C);
    const std::vector<float> dbias0 = Uniform(rng_, OC);
    std::vector<float> dinp_ref = dinp0, dweight_ref = dweight0, dbias_ref = dbias0;
    cpu::MatmulBackward<float>(dinp_ref.data(), dweight_ref.data(), dbias_ref.data(), dout.data(),
                               ld, inp.data(), weight.data(), N, C, OC, nullptr);
    DevicePtr d_dout = Upload(dtype, dout);
    for (bool all_outputs : {true, false}) {
      SCOPED_TRACE(all_outputs ? "dinp, dweight, dbias" : "dweight only");
      DevicePtr d_dinp = Upload(dtype, dinp0);
      DevicePtr d_dw = UploadF32(dweight0), d_db = UploadF32(dbias0);
      ASSERT_OK(MatmulBackward(k, all_outputs ? d_dinp.get() : nullptr,
                               static_cast<float*>(d_dw.get()),
                               all_outputs ? static_cast<float*>(d_db.get()) : nullptr,
                               d_dout.get(), ld, d_inp.get(), d_w.get(), N, C, OC));
      ExpectClose(DownloadF32(d_dw.get(), dweight0.size()), dweight_ref, tol, "matmul dweight");
      if (all_outputs) {
        ExpectClose(Download(dtype, d_dinp.get(), dinp0.size()), dinp_ref, tol, "matmul dinp");
        ExpectClose(DownloadF32(d_db.get(), OC), dbias_ref, tol, "matmul dbias");
      } else {  // untouched
        ExpectSameBits(Download(dtype, d_dinp.get(), dinp0.size()), dinp0, "dinp (null)");
        ExpectSameBits(DownloadF32(d_db.get(), OC), dbias0, "dbias (null)");
      }
    }
    // overwrite_dinp: dinp = dout · weight, whatever it held (NaN here).
    std::vector<float> set_ref(dinp0.size(), 0.0f), dw_scratch = dweight0;
    cpu::MatmulBackward<float>(set_ref.data(), dw_scratch.data(), nullptr, dout.data(), ld,
                               inp.data(), weight.data(), N, C, OC, nullptr);
    DevicePtr d_set = Upload(dtype, std::vector<float>(dinp0.size(), NAN));
    DevicePtr d_dw = UploadF32(dweight0);
    ASSERT_OK(MatmulBackward(k, d_set.get(), static_cast<float*>(d_dw.get()), nullptr, d_dout.get(),
                             ld, d_inp.get(), d_w.get(), N, C, OC, /*overwrite_dinp=*/true));
    ExpectClose(Download(dtype, d_set.get(), dinp0.size()), set_ref, tol, "matmul dinp (set)");
  }
}

TEST_F(CudaKernelsTest, MatmulBackwardIsDeterministic) {
  const int N = 300, C = 100, OC = 61, ld = 64;
  const KernelCtx& k = Ctx(kF32);
  DevicePtr d_inp = UploadF32(Uniform(rng_, size_t{N} * C));
  DevicePtr d_w = UploadF32(Uniform(rng_, size_t{OC} * C));
  DevicePtr d_dout = UploadF32(Uniform(rng_, size_t{N} * ld));
  std::vector<float> runs[2][3];
  for (auto& run : runs) {
    DevicePtr dinp = UploadF32(std::vector<float>(size_t{N} * C, 0.25f));
    DevicePtr dweight = UploadF32(std::vector<float>(size_t{OC} * C, 0.5f));
    DevicePtr dbias = UploadF32(std::vector<float>(OC, -0.5f));
    ASSERT_OK(MatmulBackward(k, dinp.get(), static_cast<float*>(dweight.get()),
                             static_cast<float*>(dbias.get()), d_dout.get(), ld, d_inp.get(),
                             d_w.get(), N, C, OC));
    run[0] = DownloadF32(dbias.get(), OC);
    run[1] = DownloadF32(dweight.get(), size_t{OC} * C);
    run[2] = DownloadF32(dinp.get(), size_t{N} * C);
  }
  ExpectSameBits(runs[0][0], runs[1][0], "dbias");
  // cuBLAS(Lt) promises the same bits on one GPU and stream for a fixed algo.
  ExpectSameBits(runs[0][1], runs[1][1], "dweight");
  ExpectSameBits(runs[0][2], runs[1][2], "dinp");
}

// -------------------------------------------------------------- attention

// Multi-head (KVH == NH; grouped-query: llama_kernels_test.cc). T = 37:
// rows of att are not whole 16-byte packs (the scalar softmax kernels); T =
// 40: they are (the packed ones).
TEST_F(CudaKernelsTest, AttentionMatchesCpu) {
  const int B = 2, C = 48, NH = 3;
  for (const auto& [dtype, T] : {std::pair<DataType, int>{kF32, 37},
                                 {DataType::kBFloat16, 37},
                                 {kF32, 40},
                                 {DataType::kBFloat16, 40}}) {
    SCOPED_TRACE(absl::StrCat(DataTypeName(dtype), " T=", T));
    const size_t qkv_n = size_t{B} * T * 3 * C, out_n = size_t{B} * T * C;
    const size_t att_n = size_t{B} * NH * T * T;
    const double tol = dtype == kF32 ? kFp32Tol : kLowPrecisionTol;
    const std::vector<float> qkv = Rounded(dtype, Uniform(rng_, qkv_n));
    const std::vector<float> dout = Rounded(dtype, Uniform(rng_, out_n));
    const std::vector<float> dqkv0 = Rounded(dtype, Uniform(rng_, qkv_n));
    std::vector<float> out_ref(out_n), att_ref(att_n), scratch_ref(att_n);
    cpu::AttentionForward<float>(out_ref.data(), att_ref.data(), qkv.data(), B, T, C, NH, NH,
                                 nullptr);
    std::vector<float> dqkv_ref = dqkv0;
    cpu::AttentionBackward<float>(dqkv_ref.data(), dout.data(), qkv.data(), att_ref.data(),
                                  scratch_ref.data(), B, T, C, NH, NH, nullptr);

    const KernelCtx& k = Ctx(dtype);
    const size_t eb = DataTypeSize(dtype);
    DevicePtr d_qkv = Upload(dtype, qkv), d_out = Alloc(out_n * eb);
    DevicePtr d_att = Alloc(att_n * eb), d_scratch = Alloc(att_n * eb);
    ASSERT_OK(AttentionForward(k, d_out.get(), d_att.get(), d_scratch.get(), d_qkv.get(), B, T, C,
                               NH, NH));
    ExpectClose(Download(dtype, d_att.get(), att_n), att_ref, tol, "att");
    ExpectClose(Download(dtype, d_out.get(), out_n), out_ref, tol, "attention out");

    DevicePtr d_dout = Upload(dtype, dout), d_dqkv = Upload(dtype, dqkv0);
    // The backward reads the saved att; the CPU's att is the reference's.
    ASSERT_OK(AttentionBackward(k, d_dqkv.get(), d_scratch.get(), d_dout.get(), d_qkv.get(),
                                d_att.get(), B, T, C, NH, NH));
    ExpectClose(Download(dtype, d_dqkv.get(), qkv_n), dqkv_ref, tol, "dqkv");
  }
}

// ---------------------------------------------------- gelu, residual, add

TEST_F(CudaKernelsTest, GeluMatchesCpu) {
  const int64_t n = 4099;  // not a multiple of the block
  for (DataType dtype : {kF32, DataType::kBFloat16, DataType::kFloat16}) {
    SCOPED_TRACE(std::string(DataTypeName(dtype)));
    const double tol = dtype == kF32 ? kFp32Tol : kLowPrecisionTol;
    const std::vector<float> inp = Rounded(dtype, Uniform(rng_, n, -6.0f, 6.0f));
    const std::vector<float> dout = Rounded(dtype, Uniform(rng_, n));
    const std::vector<float> dinp0 = Rounded(dtype, Uniform(rng_, n));
    std::vector<float> out_ref(n), dinp_ref = dinp0;
    cpu::GeluForward<float>(out_ref.data(), inp.data(), n, nullptr);
    cpu::GeluBackward<float>(dinp_ref.data(), inp.data(), dout.data(), n, nullptr);

    const KernelCtx& k = Ctx(dtype);
    DevicePtr d_inp = Upload(dtype, inp), d_out = Alloc(n * DataTypeSize(dtype));
    ASSERT_OK(GeluForward(k, d_out.get(), d_inp.get(), n));
    ExpectClose(Download(dtype, d_out.get(), n), out_ref, tol, "gelu out");
    DevicePtr d_dout = Upload(dtype, dout), d_dinp = Upload(dtype, dinp0);
    ASSERT_OK(GeluBackward(k, d_dinp.get(), d_inp.get(), d_dout.get(), n));
    ExpectClose(Download(dtype, d_dinp.get(), n), dinp_ref, tol, "gelu dinp");
  }
}

// One fp32 add per element: the CPU's bits exactly.
TEST_F(CudaKernelsTest, ResidualAndAddInPlaceMatchCpu) {
  const int64_t n = 1000;
  const std::vector<float> a = Uniform(rng_, n), b = Uniform(rng_, n);
  std::vector<float> sum_ref(n);
  cpu::ResidualForward<float>(sum_ref.data(), a.data(), b.data(), n, nullptr);
  const KernelCtx& k = Ctx(kF32);
  DevicePtr d_a = UploadF32(a), d_b = UploadF32(b), d_out = Alloc(n * sizeof(float));
  ASSERT_OK(ResidualForward(k, d_out.get(), d_a.get(), d_b.get(), n));
  ExpectSameBits(DownloadF32(d_out.get(), n), sum_ref, "residual out");
  ASSERT_OK(AddInPlace(k, d_a.get(), d_b.get(), n));
  ExpectSameBits(DownloadF32(d_a.get(), n), sum_ref, "AddInPlace dst");
}

// A row-parallel matmul's bias, added once after the tp sum: one fp32 add
// per element, the host's bits; in bf16 the rounded sum.
TEST_F(CudaKernelsTest, AddBiasMatchesHost) {
  const int N = 37, OC = 100;
  for (DataType dtype : {kF32, DataType::kBFloat16}) {
    SCOPED_TRACE(std::string(DataTypeName(dtype)));
    const std::vector<float> out0 = Rounded(dtype, Uniform(rng_, size_t{N} * OC));
    const std::vector<float> bias = Rounded(dtype, Uniform(rng_, OC));
    std::vector<float> want(out0.size());
    for (int r = 0; r < N; ++r) {
      for (int c = 0; c < OC; ++c) want[size_t(r) * OC + c] = out0[size_t(r) * OC + c] + bias[c];
    }
    want = Rounded(dtype, want);
    const KernelCtx& k = Ctx(dtype);
    DevicePtr d_out = Upload(dtype, out0), d_bias = Upload(dtype, bias);
    ASSERT_OK(AddBias(k, d_out.get(), d_bias.get(), N, OC));
    ExpectSameBits(Download(dtype, d_out.get(), out0.size()), want, "out + bias");
  }
}

// A sequence-parallel rank's rows [first, first + rows) of B·T rows get
// the position embeddings of (first + r) mod T: the host's bits in fp32.
TEST_F(CudaKernelsTest, AddPositionRowsMatchesHost) {
  const int T = 37, C = 48, rows = 50;
  const int64_t first = 61;  // wraps past T twice
  const std::vector<float> out0 = Uniform(rng_, size_t{rows} * C), wpe = Uniform(rng_, T * C);
  std::vector<float> want(out0);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < C; ++c) want[size_t(r) * C + c] += wpe[((first + r) % T) * C + c];
  }
  const KernelCtx& k = Ctx(kF32);
  DevicePtr d_out = UploadF32(out0), d_wpe = UploadF32(wpe);
  ASSERT_OK(AddPositionRows(k, d_out.get(), d_wpe.get(), first, rows, T, C));
  ExpectSameBits(DownloadF32(d_out.get(), out0.size()), want, "out + wpe rows");
}

// ---------------------------------------------------------- cross-entropy

// Padding columns hold large values the softmax must not see; backward sets
// them to 0 (the CPU leaves them: compared on [0,V) only).
TEST_F(CudaKernelsTest, CrossEntropyMatchesCpu) {
  const int N = 67, V = 61, Vp = 64;
  const float dloss = 1.0f / N;
  for (DataType dtype : {kF32, DataType::kBFloat16, DataType::kFloat16}) {
    SCOPED_TRACE(std::string(DataTypeName(dtype)));
    const double tol = dtype == kF32 ? kFp32Tol : kLowPrecisionTol;
    std::vector<float> logits = Uniform(rng_, size_t{N} * Vp, -4.0f, 4.0f);
    for (int r = 0; r < N; ++r) {
      for (int j = V; j < Vp; ++j) logits[static_cast<size_t>(r) * Vp + j] = 1000.0f;
    }
    logits = Rounded(dtype, logits);
    const std::vector<int> targets = Ids(rng_, N, V);
    std::vector<float> losses_ref(N), lse_ref(N);
    cpu::CrossEntropyForward<float>(losses_ref.data(), lse_ref.data(), logits.data(),
                                    targets.data(), N, V, Vp, nullptr);
    std::vector<float> dlogits_ref = logits;
    cpu::CrossEntropyBackwardInPlace<float>(dlogits_ref.data(), lse_ref.data(), targets.data(),
                                            dloss, N, V, Vp, nullptr);

    const KernelCtx& k = Ctx(dtype);
    DevicePtr d_logits = Upload(dtype, logits), d_targets = UploadInts(targets);
    DevicePtr d_losses = Alloc(N * sizeof(float)), d_lse = Alloc(N * sizeof(float));
    ASSERT_OK(CrossEntropyForward(k, static_cast<float*>(d_losses.get()),
                                  static_cast<float*>(d_lse.get()), d_logits.get(),
                                  static_cast<const int*>(d_targets.get()), N, V, Vp));
    // fp32 results from the same rounded logits.
    ExpectClose(DownloadF32(d_losses.get(), N), losses_ref, kFp32Tol, "losses");
    ExpectClose(DownloadF32(d_lse.get(), N), lse_ref, kFp32Tol, "lse");

    ASSERT_OK(CrossEntropyBackward(k, d_logits.get(), static_cast<const float*>(d_lse.get()),
                                   static_cast<const int*>(d_targets.get()), dloss, N, V, Vp));
    const std::vector<float> dlogits = Download(dtype, d_logits.get(), logits.size());
    std::vector<float> got_real, want_real;
    for (int r = 0; r < N; ++r) {
      for (int j = 0; j < Vp; ++j) {
        const size_t i = static_cast<size_t>(r) * Vp + j;
        if (j < V) {
          got_real.push_back(dlogits[i]);
          want_real.push_back(dlogits_ref[i]);
        } else {
          EXPECT_EQ(dlogits[i], 0.0f) << "padding column " << j << " of row " << r;
        }
      }
    }
    ExpectClose(got_real, want_real, tol, "dlogits");
  }
}

}  // namespace
}  // namespace shardtrain::engine::cuda
