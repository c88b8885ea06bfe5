#include "worker/optim/adamw.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "worker/optim/adamw8bit.h"
#include "worker/optim/quant8.h"

namespace shardtrain::optim {

namespace {

// Whether codes with absmax a dequantize to exactly x.
bool Reproduces(const Quant8Map& map, absl::Span<const float> x, absl::Span<const uint8_t> codes,
                float a) {
  for (size_t i = 0; i < x.size(); ++i) {
    if (map[codes[i]] * a != x[i]) return false;
  }
  return true;
}

// Quantizes one block x that may hold what 8-bit state dequantized to (a
// checkpoint's), so that the codes and absmax come back bit for bit. Plain
// QuantizeBlock takes max|x| as the absmax, which is the original one when
// the largest element came from the map's entry 1; the signed map has no -1,
// so a block whose largest element is negative came from its lowest entry
// (-0.99296875): the absmax is then |x| / 0.99296875 to within an ulp, and
// the one of the three nearest floats that reproduces x is it. x that no
// absmax reproduces (fp32 state) is quantized plainly.
float RequantizeBlock(const Quant8Map& map, absl::Span<const float> x, absl::Span<uint8_t> codes) {
  const float plain = QuantizeBlock(map, x, codes);
  if (plain == 0.0f || Reproduces(map, x, codes, plain)) return plain;
  std::vector<uint8_t> trial(codes.size());
  const float base = plain / std::abs(map[0]);
  for (const float a : {base, std::nextafter(base, 0.0f), std::nextafter(base, 2 * base)}) {
    for (size_t i = 0; i < x.size(); ++i) trial[i] = QuantizeValue(map, x[i] / a);
    if (Reproduces(map, x, trial, a)) {
      std::copy(trial.begin(), trial.end(), codes.begin());
      return a;
    }
  }
  return plain;  // codes still hold the plain quantization
}

}  // namespace

// The 8-bit m and v of the range, cut into segments that each start a grid
// of blocks (AdamWOptions::int8_state).
struct AdamW::Int8State {
  struct Segment {
    size_t begin = 0, end = 0;      // relative to the range's offset
    size_t first_block = 0;         // its first block in the absmax arrays
    std::vector<DecayRange> decay;  // relative to begin
    size_t first_range = 0;         // its decay ranges' first triple in `ranges` (a device's)
  };
  std::vector<Segment> segments;
  std::vector<uint8_t> m, v;              // one code per element
  std::vector<float> m_absmax, v_absmax;  // one per block
  size_t blocks = 0;
  // On a device's math (a GPU engine's) the codes, the absmax and every
  // segment's decay ranges ((begin, end, decayed) uint32 triples) live in
  // its memory and are updated there; m, v, m_absmax and v_absmax above are
  // then a host copy, made when a checkpoint reads the state (Pull, while
  // `fresh` is false) and written back when it sets it (Push).
  engine::FlatMath* device = nullptr;
  std::unique_ptr<engine::Buffer> d_m, d_v, d_m_absmax, d_v_absmax, d_ranges;
  bool fresh = false;

  static size_t Words(size_t bytes) { return (bytes + 3) / 4; }
  uint8_t* DeviceCodes(bool second) const {
    return static_cast<uint8_t*>((second ? d_v : d_m)->data());
  }
  void Pull(size_t count) {  // count: the range's elements
    if (device == nullptr || fresh) return;
    const size_t words = Words(count);
    m.resize(4 * words);
    v.resize(4 * words);
    m_absmax.resize(blocks);
    v_absmax.resize(blocks);
    device->CopyToHost(reinterpret_cast<float*>(m.data()), d_m->as<float>(), words);
    device->CopyToHost(reinterpret_cast<float*>(v.data()), d_v->as<float>(), words);
    device->CopyToHost(m_absmax.data(), d_m_absmax->as<float>(), blocks);
    device->CopyToHost(v_absmax.data(), d_v_absmax->as<float>(), blocks);
    fresh = true;
  }
  void Push(size_t count) {
    if (device == nullptr) return;
    const size_t words = Words(count);
    device->CopyFromHost(d_m->as<float>(), reinterpret_cast<const float*>(m.data()), words);
    device->CopyFromHost(d_v->as<float>(), reinterpret_cast<const float*>(v.data()), words);
    device->CopyFromHost(d_m_absmax->as<float>(), m_absmax.data(), blocks);
    device->CopyFromHost(d_v_absmax->as<float>(), v_absmax.data(), blocks);
    fresh = true;
  }

  Quant8Span M(const Segment& s) {
    return {absl::MakeSpan(m).subspan(s.begin, s.end - s.begin),
            absl::MakeSpan(m_absmax).subspan(s.first_block, Quant8Blocks(s.end - s.begin))};
  }
  Quant8Span V(const Segment& s) {
    return {absl::MakeSpan(v).subspan(s.begin, s.end - s.begin),
            absl::MakeSpan(v_absmax).subspan(s.first_block, Quant8Blocks(s.end - s.begin))};
  }
  // Elements [begin, end) of m (or v), dequantized: only the segments
  // that overlap them.
  std::vector<float> Dequantized(bool second, size_t begin, size_t end) const {
    std::vector<float> out(end - begin), seg;
    const Quant8Map& map = second ? UnsignedDynamicMap() : SignedDynamicMap();
    const std::vector<uint8_t>& codes = second ? v : m;
    const std::vector<float>& absmax = second ? v_absmax : m_absmax;
    for (const Segment& s : segments) {
      if (s.end <= begin || s.begin >= end) continue;
      const size_t n = s.end - s.begin;
      seg.resize(n);
      (void)Dequantize8(map, absl::MakeConstSpan(codes).subspan(s.begin, n),
                        absl::MakeConstSpan(absmax).subspan(s.first_block, Quant8Blocks(n)),
                        absl::MakeSpan(seg), nullptr);
      const size_t lo = std::max(s.begin, begin), hi = std::min(s.end, end);
      std::copy(seg.begin() + (lo - s.begin), seg.begin() + (hi - s.begin),
                out.begin() + (lo - begin));
    }
    return out;
  }
};

AdamW::AdamW(AdamW&&) noexcept = default;
AdamW& AdamW::operator=(AdamW&&) noexcept = default;
AdamW::~AdamW() = default;

absl::StatusOr<AdamW> AdamW::Create(const model::ParamLayout& layout, size_t offset, size_t count,
                                    const AdamWOptions& options, engine::FlatMath* math) {
  if (offset > layout.num_params() || count > layout.num_params() - offset) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer range [", offset, ", ", offset + count,
                     ") is outside the parameter buffer of ", layout.num_params(), " elements"));
  }
  std::vector<Segment> segments;
  const size_t end = offset + count;
  for (const model::TensorInfo& t : model::TrainedTensors(layout)) {
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
  AdamW a(offset, count, options, std::move(segments), math);
  if (options.int8_state) {
    // Block grids start at the range and at every unit and expert tail in it.
    std::vector<size_t> starts = {offset};
    for (const model::UnitInfo& u : layout.units()) starts.push_back(u.offset);
    for (const auto& [b, e] : layout.ExpertRanges()) starts.push_back(b);
    std::sort(starts.begin(), starts.end());
    starts.erase(std::unique(starts.begin(), starts.end()), starts.end());
    auto s8 = std::make_unique<Int8State>();
    for (size_t i = 0; i < starts.size(); ++i) {
      const size_t b = starts[i], e = i + 1 < starts.size() ? std::min(starts[i + 1], end) : end;
      if (b < offset || b >= e) continue;
      Int8State::Segment seg;
      seg.begin = b - offset;
      seg.end = e - offset;
      seg.first_block = s8->blocks;
      seg.decay = DecayRanges(layout, b, e - b);
      s8->blocks += Quant8Blocks(e - b);
      s8->segments.push_back(std::move(seg));
    }
    if (math != nullptr && dynamic_cast<engine::HostFlatMath*>(math) == nullptr) {
      // In the device's memory (zero-filled: the state before step 1), with
      // every segment's decay ranges beside it.
      std::vector<uint32_t> words;
      for (Int8State::Segment& seg : s8->segments) {
        if (seg.end - seg.begin > 0xffffffffu) {
          return absl::InvalidArgumentError(
              absl::StrCat("optimizer.state int8 on a GPU: a unit of ", seg.end - seg.begin,
                           " elements, the device's update indexes at most 2^32 - 1"));
        }
        seg.first_range = words.size() / 3;
        for (const DecayRange& r : seg.decay) {
          words.insert(words.end(), {static_cast<uint32_t>(r.begin), static_cast<uint32_t>(r.end),
                                     r.decay ? 1u : 0u});
        }
      }
      // (At least one element each: an empty ZeRO shard allocates too.)
      auto allocate = [&](size_t n) { return math->Allocate(std::max<size_t>(n, 1)); };
      s8->device = math;
      s8->d_m = allocate(Int8State::Words(count));
      s8->d_v = allocate(Int8State::Words(count));
      s8->d_m_absmax = allocate(s8->blocks);
      s8->d_v_absmax = allocate(s8->blocks);
      s8->d_ranges = allocate(words.size());
      if (!words.empty()) {
        math->CopyFromHost(s8->d_ranges->as<float>(), reinterpret_cast<const float*>(words.data()),
                           words.size());
      }
    } else {
      s8->m.assign(count, 0);
      s8->v.assign(count, 0);
      s8->m_absmax.assign(s8->blocks, 0.0f);
      s8->v_absmax.assign(s8->blocks, 0.0f);
    }
    a.int8_ = std::move(s8);
  }
  return a;
}

AdamW::AdamW(size_t offset, size_t count, const AdamWOptions& options,
             std::vector<Segment> segments, engine::FlatMath* math)
    : offset_(offset),
      count_(count),
      options_(options),
      segments_(std::move(segments)),
      math_(math) {
  if (options.int8_state) return;  // Create makes the 8-bit state
  engine::HostFlatMath host(nullptr);
  m_ = math_ != nullptr ? math_->Allocate(count) : host.Allocate(count);
  v_ = math_ != nullptr ? math_->Allocate(count) : host.Allocate(count);
}

int64_t AdamW::state_bytes() const {
  if (int8_ == nullptr) return 8 * static_cast<int64_t>(count_);
  return 2 * static_cast<int64_t>(count_) + 8 * static_cast<int64_t>(int8_->blocks);
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
  if (int8_ != nullptr) {
    if (begin != 0 || end != count_) {
      std::fprintf(stderr, "AdamW: 8-bit state is stepped whole, not [%zu, %zu) of %zu\n", begin,
                   end, count_);
      std::abort();
    }
    const AdamW8bitStep step{lr, step_, grad_scale};
    if (int8_->device != nullptr) {  // on the device, the arrays its memory's
      if (&math != int8_->device) {
        std::fprintf(stderr, "AdamW: 8-bit state on a device stepped with another math's arrays\n");
        std::abort();
      }
      const engine::AdamWCoefficients c = AdamW8bitCoefficients(options_, step);
      const uint32_t* ranges = static_cast<const uint32_t*>(int8_->d_ranges->data());
      for (const Int8State::Segment& s : int8_->segments) {
        math.AdamW8bitUpdate(p + s.begin, g + s.begin, int8_->DeviceCodes(false) + s.begin,
                             int8_->d_m_absmax->as<float>() + s.first_block,
                             int8_->DeviceCodes(true) + s.begin,
                             int8_->d_v_absmax->as<float>() + s.first_block, s.end - s.begin,
                             ranges + 3 * s.first_range, static_cast<int>(s.decay.size()), c,
                             SignedDynamicMap().data(), UnsignedDynamicMap().data(), zero_grads);
      }
      int8_->fresh = false;
      return;
    }
    auto* host = dynamic_cast<engine::HostFlatMath*>(&math);
    for (const Int8State::Segment& s : int8_->segments) {
      const size_t n = s.end - s.begin;
      const absl::Status st = AdamW8bitUpdate(
          absl::MakeSpan(p + s.begin, n), absl::MakeConstSpan(g + s.begin, n), int8_->M(s),
          int8_->V(s), s.decay, options_, step, host != nullptr ? host->pool() : nullptr);
      if (!st.ok()) {  // sizes and ranges are the optimizer's own: a bug
        std::fprintf(stderr, "AdamW: %s\n", st.ToString().c_str());
        std::abort();
      }
    }
    if (zero_grads) std::fill(g, g + count_, 0.0f);
    return;
  }
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
  if (int8_ != nullptr) {
    int8_->Pull(count_);
    return int8_->Dequantized(false, begin, end);
  }
  std::vector<float> out(end - begin);
  math().CopyToHost(out.data(), m_->as<float>() + begin, out.size());
  return out;
}

std::vector<float> AdamW::CopyV(size_t begin, size_t end) const {
  if (int8_ != nullptr) {
    int8_->Pull(count_);
    return int8_->Dequantized(true, begin, end);
  }
  std::vector<float> out(end - begin);
  math().CopyToHost(out.data(), v_->as<float>() + begin, out.size());
  return out;
}

void AdamW::SetState(absl::Span<const float> m, absl::Span<const float> v) {
  if (int8_ != nullptr) {  // block by block, each back to its codes and absmax
    int8_->Pull(count_);   // a device's: the segments SetState does not reach keep theirs
    for (const Int8State::Segment& s : int8_->segments) {
      const size_t n = s.end - s.begin;
      if (s.end > m.size() || s.end > v.size()) break;
      for (const bool second : {false, true}) {
        const Quant8Map& map = second ? UnsignedDynamicMap() : SignedDynamicMap();
        const absl::Span<const float> x = (second ? v : m).subspan(s.begin, n);
        const Quant8Span q = second ? int8_->V(s) : int8_->M(s);
        for (size_t b = 0; b < q.absmax.size(); ++b) {
          const size_t at = b * kQuant8BlockSize, len = std::min(kQuant8BlockSize, n - at);
          q.absmax[b] = RequantizeBlock(map, x.subspan(at, len), q.codes.subspan(at, len));
        }
      }
    }
    int8_->Push(count_);
    return;
  }
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
