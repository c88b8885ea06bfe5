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
#include "worker/engine/cuda/kernels.h"

#include <cublas_api.h>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "common/model/config.h"
#include "common/model/param_layout.h"
#include "worker/engine/cpu/layers.h"
#include "worker/engine/cuda/cublas_loader.h"
#include "worker/optim/adamw.h"

namespace shardtrain::engine::cuda {
namespace {

constexpr double kFp32Tol = 1e-5;
constexpr double kLowPrecisionTol = 2e-2;
constexpr DataType kF32 = DataType::kFloat32;
constexpr DataType kLowPrecision[] = {DataType::kBFloat16, DataType::kFloat16};

#define ASSERT_OK(expr)                   \
  do {                                    \
    const absl::Status status_ = (expr);  \
    ASSERT_TRUE(status_.ok()) << status_; \
  } while (0)

bool HaveDevice() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear it
    return false;
  }
  return n > 0;
}

// Largest |got - want| relative to the largest |want|; fails naming `what`
// with the max difference, where it is, and the tolerance.
void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, double tol,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double max_ref = 0, max_diff = 0;
  size_t at = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(double{want[i]}));
    const double diff = std::fabs(double{got[i]} - double{want[i]});
    if (!(diff <= max_diff)) {  // NaN counts as the worst
      max_diff = diff;
      at = i;
    }
  }
  const double scale = max_ref > 0 ? max_ref : 1.0;
  EXPECT_LE(max_diff / scale, tol)
      << what << ": max |diff| " << max_diff << " at " << at << " (got " << got[at] << ", want "
      << want[at] << "), max |ref| " << max_ref << ", relative tolerance " << tol;
}

void ExpectSameBits(const std::vector<float>& a, const std::vector<float>& b,
                    const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
      << what << ": two runs over the same inputs differ";
}

std::vector<float> Uniform(std::mt19937& rng, size_t n, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

std::vector<int> Ids(std::mt19937& rng, size_t n, int below) {
  std::uniform_int_distribution<int> dist(0, below - 1);
  std::vector<int> x(n);
  for (int& v : x) v = dist(rng);
  return x;
}

// x rounded to dtype and back (what the GPU sees after an upload).
std::vector<float> Rounded(DataType dtype, const std::vector<float>& x) {
  std::vector<uint8_t> raw(x.size() * DataTypeSize(dtype));
  FromFloat32(dtype, x.data(), raw.data(), x.size());
  std::vector<float> out(x.size());
  ToFloat32(dtype, raw.data(), out.data(), x.size());
  return out;
}

struct CudaFree {
  void operator()(void* p) const { cudaFree(p); }
};
using DevicePtr = std::unique_ptr<void, CudaFree>;

// Device memory, uploads and downloads. Tests run on one blocking stream, so
// the plain (legacy-stream) cudaMemcpy calls are ordered with the kernels.
class CudaKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveDevice()) GTEST_SKIP() << "no CUDA device: the kernels are checked on a GPU only";
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
  }
  void TearDown() override {
    for (auto& c : contexts_) c.reset();
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  // The context of compute type `dtype` on the test's stream.
  const KernelCtx& Ctx(DataType dtype) {
    std::unique_ptr<KernelContext>& c = contexts_[static_cast<int>(dtype)];
    if (c == nullptr) {
      c = std::make_unique<KernelContext>();
      const absl::Status s = KernelContext::Create(stream_, dtype, c.get());
      EXPECT_TRUE(s.ok()) << s;
    }
    return c->ctx();
  }

  DevicePtr Alloc(size_t bytes) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(bytes, 1)), cudaSuccess);
    return DevicePtr(p);
  }
  DevicePtr UploadBytes(const void* host, size_t bytes) {
    DevicePtr d = Alloc(bytes);
    EXPECT_EQ(cudaMemcpy(d.get(), host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    return d;
  }
  // x converted to dtype on the host, then uploaded.
  DevicePtr Upload(DataType dtype, const std::vector<float>& x) {
    std::vector<uint8_t> raw(x.size() * DataTypeSize(dtype));
    FromFloat32(dtype, x.data(), raw.data(), x.size());
    return UploadBytes(raw.data(), raw.size());
  }
  DevicePtr UploadF32(const std::vector<float>& x) {
    return UploadBytes(x.data(), x.size() * sizeof(float));
  }
  DevicePtr UploadInts(const std::vector<int>& x) {
    return UploadBytes(x.data(), x.size() * sizeof(int));
  }
  // n elements of dtype at d, as fp32, after the stream's work.
  std::vector<float> Download(DataType dtype, const void* d, size_t n) {
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    std::vector<uint8_t> raw(n * DataTypeSize(dtype));
    EXPECT_EQ(cudaMemcpy(raw.data(), d, raw.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    std::vector<float> out(n);
    ToFloat32(dtype, raw.data(), out.data(), n);
    return out;
  }
  std::vector<float> DownloadF32(const void* d, size_t n) { return Download(kF32, d, n); }

  cudaStream_t stream_ = nullptr;
  std::unique_ptr<KernelContext> contexts_[3];
  std::mt19937 rng_{20240601};
};

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

// -------------------------------------------------------------- layernorm

struct LayerNormCase {
  static constexpr int N = 67, C = 100;
  std::vector<float> inp, weight, bias, dout, dinp0, dweight0, dbias0;
  LayerNormCase(std::mt19937& rng, DataType dtype) {
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
  for (DataType dtype : {kF32, DataType::kBFloat16, DataType::kFloat16}) {
    SCOPED_TRACE(std::string(DataTypeName(dtype)));
    const double tol = dtype == kF32 ? kFp32Tol : kLowPrecisionTol;
    LayerNormCase c(rng_, dtype);
    const int N = LayerNormCase::N, C = LayerNormCase::C;
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
TEST_F(CudaKernelsTest, MatmulMatchesCpu) {
  const int N = 67, C = 100, OC = 61, ld = 64;
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

TEST_F(CudaKernelsTest, AttentionMatchesCpu) {
  const int B = 2, T = 37, C = 48, NH = 3;
  const size_t qkv_n = size_t{B} * T * 3 * C, out_n = size_t{B} * T * C;
  const size_t att_n = size_t{B} * NH * T * T;
  for (DataType dtype : {kF32, DataType::kBFloat16}) {
    SCOPED_TRACE(std::string(DataTypeName(dtype)));
    const double tol = dtype == kF32 ? kFp32Tol : kLowPrecisionTol;
    const std::vector<float> qkv = Rounded(dtype, Uniform(rng_, qkv_n));
    const std::vector<float> dout = Rounded(dtype, Uniform(rng_, out_n));
    const std::vector<float> dqkv0 = Rounded(dtype, Uniform(rng_, qkv_n));
    std::vector<float> out_ref(out_n), att_ref(att_n), scratch_ref(att_n);
    cpu::AttentionForward<float>(out_ref.data(), att_ref.data(), qkv.data(), B, T, C, NH, nullptr);
    std::vector<float> dqkv_ref = dqkv0;
    cpu::AttentionBackward<float>(dqkv_ref.data(), dout.data(), qkv.data(), att_ref.data(),
                                  scratch_ref.data(), B, T, C, NH, nullptr);

    const KernelCtx& k = Ctx(dtype);
    const size_t eb = DataTypeSize(dtype);
    DevicePtr d_qkv = Upload(dtype, qkv), d_out = Alloc(out_n * eb);
    DevicePtr d_att = Alloc(att_n * eb), d_scratch = Alloc(att_n * eb);
    ASSERT_OK(
        AttentionForward(k, d_out.get(), d_att.get(), d_scratch.get(), d_qkv.get(), B, T, C, NH));
    ExpectClose(Download(dtype, d_att.get(), att_n), att_ref, tol, "att");
    ExpectClose(Download(dtype, d_out.get(), out_n), out_ref, tol, "attention out");

    DevicePtr d_dout = Upload(dtype, dout), d_dqkv = Upload(dtype, dqkv0);
    // The backward reads the saved att; the CPU's att is the reference's.
    ASSERT_OK(AttentionBackward(k, d_dqkv.get(), d_scratch.get(), d_dout.get(), d_qkv.get(),
                                d_att.get(), B, T, C, NH));
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

// ----------------------------------------------------------- size checks

TEST_F(CudaKernelsTest, LaunchersRejectBadSizes) {
  const KernelCtx& k = Ctx(kF32);
  EXPECT_EQ(GeluForward(k, nullptr, nullptr, -1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MatmulForward(k, nullptr, nullptr, nullptr, nullptr, 4, 4, 8, 7).code(),
            absl::StatusCode::kInvalidArgument);  // ld_out < OC
  EXPECT_EQ(AttentionForward(k, nullptr, nullptr, nullptr, nullptr, 1, 4, 10, 4).code(),
            absl::StatusCode::kInvalidArgument);  // NH does not divide C
  EXPECT_EQ(CrossEntropyForward(k, nullptr, nullptr, nullptr, nullptr, 2, 65, 64).code(),
            absl::StatusCode::kInvalidArgument);  // V > Vp
  AdamWArgs bad;
  bad.bias1 = 0;
  EXPECT_EQ(AdamWUpdate(stream_, nullptr, nullptr, nullptr, nullptr, 4, bad).code(),
            absl::StatusCode::kInvalidArgument);
  // Nothing to do is not an error.
  EXPECT_TRUE(GeluForward(k, nullptr, nullptr, 0).ok());
  EXPECT_TRUE(LayerNormForward(k, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 8).ok());
}

}  // namespace
}  // namespace shardtrain::engine::cuda
