#include "worker/engine/flat_math.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/dtype.h"

namespace shardtrain::engine {
namespace {

// Plain host memory as a Buffer (the optimizer's m and v).
class HostBuffer final : public Buffer {
 public:
  static std::unique_ptr<Buffer> Make(size_t n) {
    auto storage = std::make_unique<std::vector<float>>(n, 0.0f);
    float* data = storage->data();
    return std::unique_ptr<Buffer>(new HostBuffer(std::move(storage), data, n));
  }
  void Release(size_t begin, size_t n) override {
    std::fill(storage_->begin() + begin, storage_->begin() + begin + n, 0.0f);
  }
  int64_t ResidentBytes(size_t begin, size_t n) const override {
    return static_cast<int64_t>(n * sizeof(float));
  }
  void SetReleaseBoundary(size_t) override {}

 private:
  HostBuffer(std::unique_ptr<std::vector<float>> storage, float* data, size_t n)
      : Buffer(data, n, DataType::kFloat32, DeviceKind::kCpu), storage_(std::move(storage)) {}
  std::unique_ptr<std::vector<float>> storage_;
};

}  // namespace

double HostFlatMath::SquaredNorm(const float* g, size_t size) {
  // Fixed 64Ki-element chunks: the result does not depend on the threads.
  constexpr int64_t kChunk = 1 << 16;
  const int64_t n = static_cast<int64_t>(size);
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(chunks, 0.0);
  ParallelFor(pool_, chunks, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t b = c * kChunk, e = std::min(n, b + kChunk);
      double s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t i = b; i < e; ++i) s += double{g[i]} * g[i];
      partial[c] = s;
    }
  });
  double total = 0;
  for (double s : partial) total += s;
  return total;
}

void FlatMath::AdamW8bitUpdate(float*, float*, uint8_t*, float*, uint8_t*, float*, size_t,
                               const uint32_t*, int, const AdamWCoefficients&, const float*,
                               const float*, bool) {
  std::fprintf(stderr, "FlatMath: this math has no 8-bit AdamW (the host's optimizer steps it)\n");
  std::abort();
}

void HostFlatMath::Scale(float* g, size_t n, float scale) {
  ParallelFor(
      pool_, static_cast<int64_t>(n),
      [&](int64_t i0, int64_t i1) {
#pragma omp simd
        for (int64_t i = i0; i < i1; ++i) g[i] *= scale;
      },
      1 << 14);
}

void HostFlatMath::ToBFloat16(uint16_t* dst, const float* src, size_t n) {
  ParallelFor(
      pool_, static_cast<int64_t>(n),
      [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) dst[i] = FloatToBFloat16(src[i]);
      },
      1 << 14);
}

void HostFlatMath::FromBFloat16(float* dst, const uint16_t* src, size_t n) {
  ParallelFor(
      pool_, static_cast<int64_t>(n),
      [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) dst[i] = BFloat16ToFloat(src[i]);
      },
      1 << 14);
}

void HostFlatMath::Accumulate(float* dst, const float* src, size_t n, bool add) {
  if (!add) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  ParallelFor(
      pool_, static_cast<int64_t>(n),
      [&](int64_t i0, int64_t i1) {
#pragma omp simd
        for (int64_t i = i0; i < i1; ++i) dst[i] += src[i];
      },
      1 << 14);
}

void HostFlatMath::AdamWUpdate(float* p, float* g, float* m, float* v, size_t n,
                               const AdamWCoefficients& c, bool zero_grads) {
  const float b1 = c.beta1, b2 = c.beta2, eps = c.eps, decay = c.decay;
  const float step_size = c.step_size, inv_sqrt_bc2 = c.inv_sqrt_bc2;
  const float grad_scale = c.grad_scale;
  auto body = [&](auto zero) {
    ParallelFor(
        pool_, static_cast<int64_t>(n),
        [&](int64_t i0, int64_t i1) {
#pragma omp simd
          for (int64_t i = i0; i < i1; ++i) {
            const float gi = g[i] * grad_scale;  // x · 1 == x: unscaled bits unchanged
            if constexpr (decltype(zero)::value) g[i] = 0.0f;
            const float mi = b1 * m[i] + (1.0f - b1) * gi;
            const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
            m[i] = mi;
            v[i] = vi;
            const float denom = std::sqrt(vi) * inv_sqrt_bc2 + eps;
            p[i] = p[i] * decay - step_size * mi / denom;
          }
        },
        1 << 14);
  };
  if (zero_grads) {
    body(std::true_type{});
  } else {
    body(std::false_type{});
  }
}

void HostFlatMath::CopyToHost(float* host, const float* x, size_t n) {
  std::memcpy(host, x, n * sizeof(float));
}

void HostFlatMath::CopyFromHost(float* x, const float* host, size_t n) {
  std::memcpy(x, host, n * sizeof(float));
}

std::unique_ptr<Buffer> HostFlatMath::Allocate(size_t n) { return HostBuffer::Make(n); }

}  // namespace shardtrain::engine
