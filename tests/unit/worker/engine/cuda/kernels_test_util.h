// Shared by the kernel tests (kernels_test.cc, kernels_layers_test.cc): the
// tolerances, data makers and comparisons, and the fixture that owns one
// KernelContext per compute type and skips without a GPU.
#ifndef SHARDTRAIN_TESTS_UNIT_WORKER_ENGINE_CUDA_KERNELS_TEST_UTIL_H_
#define SHARDTRAIN_TESTS_UNIT_WORKER_ENGINE_CUDA_KERNELS_TEST_UTIL_H_

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
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
#include "worker/engine/cuda/kernels.h"
#include "worker/optim/adamw.h"

namespace shardtrain::engine::cuda {

constexpr double kFp32Tol = 1e-5;
constexpr double kLowPrecisionTol = 2e-2;
constexpr DataType kF32 = DataType::kFloat32;
constexpr DataType kLowPrecision[] = {DataType::kBFloat16, DataType::kFloat16};

#define ASSERT_OK(expr)                   \
  do {                                    \
    const absl::Status status_ = (expr);  \
    ASSERT_TRUE(status_.ok()) << status_; \
  } while (0)

inline bool HaveDevice() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear it
    return false;
  }
  return n > 0;
}

// Largest |got - want| relative to the largest |want|; fails naming `what`
// with the max difference, where it is, and the tolerance.
inline void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, double tol,
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

// ExpectClose after printing "[tag] <what> max |diff| …, relative …
// (tolerance …)": the figures a GPU run's log keeps.
inline void CompareAndPrint(const char* tag, const std::vector<float>& got,
                            const std::vector<float>& want, double tol, const std::string& what) {
  double max_ref = 0, max_diff = 0;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(double{want[i]}));
    const double diff = std::fabs(double{got[i]} - double{want[i]});
    if (!(diff <= max_diff)) max_diff = diff;  // NaN counts as the worst
  }
  std::printf("[%s] %-46s max |diff| %.3g, relative %.3g (tolerance %.0e)\n", tag, what.c_str(),
              max_diff, max_diff / (max_ref > 0 ? max_ref : 1.0), tol);
  ExpectClose(got, want, tol, what);
}

inline void ExpectSameBits(const std::vector<float>& a, const std::vector<float>& b,
                           const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
      << what << ": two runs over the same inputs differ";
}

inline std::vector<float> Uniform(std::mt19937& rng, size_t n, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

inline std::vector<int> Ids(std::mt19937& rng, size_t n, int below) {
  std::uniform_int_distribution<int> dist(0, below - 1);
  std::vector<int> x(n);
  for (int& v : x) v = dist(rng);
  return x;
}

// x rounded to dtype and back (what the GPU sees after an upload).
inline std::vector<float> Rounded(DataType dtype, const std::vector<float>& x) {
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

}  // namespace shardtrain::engine::cuda

#endif  // SHARDTRAIN_TESTS_UNIT_WORKER_ENGINE_CUDA_KERNELS_TEST_UTIL_H_
