#include "worker/optim/adamw.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace shardtrain::optim {

absl::StatusOr<AdamW> AdamW::Create(const model::ParamLayout& layout, size_t offset, size_t count,
                                    const AdamWOptions& options) {
  if (offset > layout.num_params() || count > layout.num_params() - offset) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer range [", offset, ", ", offset + count,
                     ") is outside the parameter buffer of ", layout.num_params(), " elements"));
  }
  std::vector<Segment> segments;
  const size_t end = offset + count;
  for (const model::TensorInfo& t : layout.tensors()) {
    const size_t b = std::max(offset, t.offset);
    const size_t e = std::min(end, t.offset + t.numel);
    if (b >= e) continue;
    if (!segments.empty() && segments.back().decay == t.decay &&
        segments.back().end == b - offset) {
      segments.back().end = e - offset;  // merge neighbours with equal rule
    } else {
      segments.push_back({b - offset, e - offset, t.decay});
    }
  }
  return AdamW(offset, count, options, std::move(segments));
}

AdamW::AdamW(size_t offset, size_t count, const AdamWOptions& options,
             std::vector<Segment> segments)
    : offset_(offset),
      count_(count),
      options_(options),
      segments_(std::move(segments)),
      m_(count, 0.0f),
      v_(count, 0.0f) {}

void AdamW::Step(absl::Span<float> params, absl::Span<const float> grads, float lr,
                 engine::ThreadPool* pool) {
  // kZero = false never writes through the pointer.
  StepImpl<false>(params.data(), const_cast<float*>(grads.data()), lr, pool);
}

void AdamW::StepAndZeroGrads(absl::Span<float> params, absl::Span<float> grads, float lr,
                             engine::ThreadPool* pool) {
  StepImpl<true>(params.data(), grads.data(), lr, pool);
}

template <bool kZero>
void AdamW::StepImpl(float* p, float* g, float lr, engine::ThreadPool* pool) {
  ++step_;
  const float b1 = options_.beta1, b2 = options_.beta2, eps = options_.eps;
  const float bc1 = 1.0f - static_cast<float>(std::pow(double{b1}, step_));
  const float bc2 = 1.0f - static_cast<float>(std::pow(double{b2}, step_));
  // torch: denom = sqrt(v)/sqrt(bc2) + eps; p -= (lr/bc1) * m / denom
  const float step_size = lr / bc1;
  const float inv_sqrt_bc2 = 1.0f / std::sqrt(bc2);
  float* m = m_.data();
  float* v = v_.data();
  for (const Segment& s : segments_) {
    const float decay = s.decay ? 1.0f - lr * options_.weight_decay : 1.0f;
    engine::ParallelFor(
        pool, static_cast<int64_t>(s.end - s.begin),
        [&](int64_t i0, int64_t i1) {
          const int64_t base = static_cast<int64_t>(s.begin);
#pragma omp simd
          for (int64_t i = base + i0; i < base + i1; ++i) {
            const float gi = g[i];
            if constexpr (kZero) g[i] = 0.0f;
            const float mi = b1 * m[i] + (1.0f - b1) * gi;
            const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
            m[i] = mi;
            v[i] = vi;
            const float denom = std::sqrt(vi) * inv_sqrt_bc2 + eps;
            p[i] = p[i] * decay - step_size * mi / denom;
          }
        },
        1 << 14);
  }
}

double GradSquaredNorm(absl::Span<const float> grads, engine::ThreadPool* pool) {
  constexpr int64_t kChunk = 1 << 16;
  const int64_t n = static_cast<int64_t>(grads.size());
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  // Per-chunk partial sums on the stack when small, else a local vector
  // (called once per step; the allocation is negligible next to the pass).
  std::vector<double> partial(chunks, 0.0);
  const float* g = grads.data();
  engine::ParallelFor(pool, chunks, [&](int64_t c0, int64_t c1) {
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

void ScaleGrads(absl::Span<float> grads, float scale, engine::ThreadPool* pool) {
  float* g = grads.data();
  engine::ParallelFor(
      pool, static_cast<int64_t>(grads.size()),
      [&](int64_t i0, int64_t i1) {
#pragma omp simd
        for (int64_t i = i0; i < i1; ++i) g[i] *= scale;
      },
      1 << 14);
}

float ClipScale(float norm, float max_norm) {
  return max_norm > 0 && norm > max_norm ? max_norm / (norm + 1e-6f) : 1.0f;
}

float ClipGradNorm(absl::Span<float> grads, float max_norm, engine::ThreadPool* pool) {
  const float norm = static_cast<float>(std::sqrt(GradSquaredNorm(grads, pool)));
  if (const float scale = ClipScale(norm, max_norm); scale != 1.0f) ScaleGrads(grads, scale, pool);
  return norm;
}

}  // namespace shardtrain::optim
