#include "worker/optim/adamw.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace shardtrain::optim {

absl::StatusOr<AdamW> AdamW::Create(const model::ParamLayout& layout, size_t offset, size_t count,
                                    const AdamWOptions& options, engine::FlatMath* math) {
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
  return AdamW(offset, count, options, std::move(segments), math);
}

AdamW::AdamW(size_t offset, size_t count, const AdamWOptions& options,
             std::vector<Segment> segments, engine::FlatMath* math)
    : offset_(offset),
      count_(count),
      options_(options),
      segments_(std::move(segments)),
      math_(math) {
  engine::HostFlatMath host(nullptr);
  m_ = math_ != nullptr ? math_->Allocate(count) : host.Allocate(count);
  v_ = math_ != nullptr ? math_->Allocate(count) : host.Allocate(count);
}

engine::FlatMath& AdamW::math() const {
  static engine::HostFlatMath serial(nullptr);  // stateless: shared by every host optimizer
  return math_ != nullptr ? *math_ : serial;
}

void AdamW::Step(absl::Span<float> params, absl::Span<const float> grads, float lr,
                 engine::ThreadPool* pool) {
  engine::HostFlatMath host(pool);
  // zero_grads = false never writes through the pointer.
  StepImpl(params.data(), const_cast<float*>(grads.data()), lr, host, false);
}

void AdamW::StepAndZeroGrads(absl::Span<float> params, absl::Span<float> grads, float lr,
                             engine::ThreadPool* pool) {
  engine::HostFlatMath host(pool);
  StepImpl(params.data(), grads.data(), lr, host, true);
}

void AdamW::Step(float* params, float* grads, float lr, bool zero_grads, float grad_scale) {
  StepImpl(params, grads, lr, math(), zero_grads, grad_scale);
}

void AdamW::UpdateRange(absl::Span<float> params, absl::Span<const float> grads, float lr,
                        size_t begin, size_t end, engine::ThreadPool* pool) {
  engine::HostFlatMath host(pool);
  Update(params.data(), const_cast<float*>(grads.data()), lr, host, false, begin, end);
}

void AdamW::StepImpl(float* p, float* g, float lr, engine::FlatMath& math, bool zero_grads,
                     float grad_scale) {
  ++step_;
  Update(p, g, lr, math, zero_grads, 0, count_, grad_scale);
}

void AdamW::Update(float* p, float* g, float lr, engine::FlatMath& math, bool zero_grads,
                   size_t begin, size_t end, float grad_scale) {
  const float b1 = options_.beta1, b2 = options_.beta2;
  const float bc1 = 1.0f - static_cast<float>(std::pow(double{b1}, step_));
  const float bc2 = 1.0f - static_cast<float>(std::pow(double{b2}, step_));
  // torch: denom = sqrt(v)/sqrt(bc2) + eps; p -= (lr/bc1) * m / denom
  engine::AdamWCoefficients c;
  c.beta1 = b1;
  c.beta2 = b2;
  c.eps = options_.eps;
  c.step_size = lr / bc1;
  c.inv_sqrt_bc2 = 1.0f / std::sqrt(bc2);
  c.grad_scale = grad_scale;
  std::vector<engine::AdamWRange> ranges;
  for (const Segment& s : segments_) {
    const size_t first = std::max(s.begin, begin), last = std::min(s.end, end);
    if (first >= last) continue;
    ranges.push_back({first, last, s.decay ? 1.0f - lr * options_.weight_decay : 1.0f});
  }
  math.AdamWUpdateRanges(p, g, m_->as<float>(), v_->as<float>(), ranges, c, zero_grads);
}

std::vector<float> AdamW::CopyM(size_t begin, size_t end) const {
  std::vector<float> out(end - begin);
  math().CopyToHost(out.data(), m_->as<float>() + begin, out.size());
  return out;
}

std::vector<float> AdamW::CopyV(size_t begin, size_t end) const {
  std::vector<float> out(end - begin);
  math().CopyToHost(out.data(), v_->as<float>() + begin, out.size());
  return out;
}

void AdamW::SetState(absl::Span<const float> m, absl::Span<const float> v) {
  math().CopyFromHost(m_->as<float>(), m.data(), std::min(m.size(), count_));
  math().CopyFromHost(v_->as<float>(), v.data(), std::min(v.size(), count_));
}

double GradSquaredNorm(absl::Span<const float> grads, engine::ThreadPool* pool) {
  return engine::HostFlatMath(pool).SquaredNorm(grads.data(), grads.size());
}

void ScaleGrads(absl::Span<float> grads, float scale, engine::ThreadPool* pool) {
  engine::HostFlatMath(pool).Scale(grads.data(), grads.size(), scale);
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
