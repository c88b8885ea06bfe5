#include "worker/optim/adamw8bit.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace shardtrain::optim {
namespace {

using Coefficients = engine::AdamWCoefficients;

// Calls f(i0, i1, decayed) on consecutive pieces that cover [begin, end),
// each inside one DecayRange or between two (decayed = false there).
// `ranges` sorted and non-overlapping.
template <class F>
void ForEachPiece(absl::Span<const DecayRange> ranges, size_t begin, size_t end, F&& f) {
  auto it = std::partition_point(ranges.begin(), ranges.end(),
                                 [&](const DecayRange& r) { return r.end <= begin; });
  size_t i = begin;
  while (i < end) {
    if (it == ranges.end() || it->begin >= end) {
      f(i, end, false);
      return;
    }
    if (it->begin > i) {
      f(i, it->begin, false);
      i = it->begin;
    }
    const size_t piece_end = std::min(it->end, end);
    if (i < piece_end) f(i, piece_end, it->decay);
    i = piece_end;
    ++it;
  }
}

// The step of block b: dequantize its m and v, update every element,
// requantize with the new absmax.
void UpdateBlock(size_t b, absl::Span<float> params, absl::Span<const float> grads, Quant8Span m,
                 Quant8Span v, absl::Span<const DecayRange> decay, const Coefficients& c,
                 const Quant8Map& m_map, const Quant8Map& v_map) {
  const size_t begin = b * kQuant8BlockSize;
  const size_t len = std::min(kQuant8BlockSize, params.size() - begin);
  float m_local[kQuant8BlockSize], v_local[kQuant8BlockSize];
  const absl::Span<float> m_block(m_local, len), v_block(v_local, len);
  const absl::Span<uint8_t> m_codes = m.codes.subspan(begin, len);
  const absl::Span<uint8_t> v_codes = v.codes.subspan(begin, len);
  DequantizeBlock(m_map, m_codes, m.absmax[b], m_block);
  DequantizeBlock(v_map, v_codes, v.absmax[b], v_block);
  const float b1 = c.beta1, b2 = c.beta2, eps = c.eps, step_size = c.step_size;
  const float inv_sqrt_bc2 = c.inv_sqrt_bc2, grad_scale = c.grad_scale;
  const float one_minus_b1 = 1.0f - b1, one_minus_b2 = 1.0f - b2;
  ForEachPiece(decay, begin, begin + len, [&](size_t i0, size_t i1, bool decayed) {
    const float d = decayed ? c.decay : 1.0f;
    for (size_t i = i0; i < i1; ++i) {
      const size_t j = i - begin;
      const float g = grads[i] * grad_scale;  // x · 1 == x: unscaled bits unchanged
      const float mj = std::fma(b1, m_local[j], one_minus_b1 * g);
      const float vj = std::fma(b2, v_local[j], one_minus_b2 * g * g);
      m_local[j] = mj;
      v_local[j] = vj;
      const float denom = std::fma(std::sqrt(vj), inv_sqrt_bc2, eps);
      params[i] = std::fma(params[i], d, -(step_size * mj / denom));
    }
  });
  m.absmax[b] = QuantizeBlock(m_map, m_block, m_codes);
  v.absmax[b] = QuantizeBlock(v_map, v_block, v_codes);
}

absl::Status Validate(size_t n, size_t grads, const Quant8Span& m, const Quant8Span& v,
                      absl::Span<const DecayRange> decay, const AdamW8bitStep& step,
                      size_t block_begin, size_t block_end) {
  const size_t blocks = Quant8Blocks(n);
  if (grads != n || m.codes.size() != n || v.codes.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("AdamW8bit: ", n, " params need as many grads and m and v codes, got ", grads,
                     ", ", m.codes.size(), " and ", v.codes.size()));
  }
  if (m.absmax.size() != blocks || v.absmax.size() != blocks) {
    return absl::InvalidArgumentError(absl::StrCat("AdamW8bit: ", n, " params need ", blocks,
                                                   " absmax for m and v, got ", m.absmax.size(),
                                                   " and ", v.absmax.size()));
  }
  if (block_begin > block_end || block_end > blocks) {
    return absl::InvalidArgumentError(absl::StrCat("AdamW8bit: blocks [", block_begin, ", ",
                                                   block_end, ") are not within the ", blocks,
                                                   " blocks of ", n, " params"));
  }
  if (step.t < 1) {
    return absl::InvalidArgumentError(absl::StrCat("AdamW8bit: step ", step.t, " < 1"));
  }
  size_t previous_end = 0;
  for (const DecayRange& r : decay) {
    if (r.begin < previous_end || r.begin > r.end || r.end > n) {
      return absl::InvalidArgumentError(
          absl::StrCat("AdamW8bit: decay range [", r.begin, ", ", r.end,
                       ") is unsorted, overlapping or beyond the ", n, " params"));
    }
    previous_end = r.end;
  }
  return absl::OkStatus();
}

}  // namespace

engine::AdamWCoefficients AdamW8bitCoefficients(const AdamWOptions& o, const AdamW8bitStep& s) {
  const float bc1 = 1.0f - static_cast<float>(std::pow(double{o.beta1}, s.t));
  const float bc2 = 1.0f - static_cast<float>(std::pow(double{o.beta2}, s.t));
  engine::AdamWCoefficients c;
  c.beta1 = o.beta1;
  c.beta2 = o.beta2;
  c.eps = o.eps;
  c.step_size = s.lr / bc1;
  c.inv_sqrt_bc2 = 1.0f / std::sqrt(bc2);
  c.decay = std::fma(-s.lr, o.weight_decay, 1.0f);
  c.grad_scale = s.grad_scale;
  return c;
}

std::vector<DecayRange> DecayRanges(const model::ParamLayout& layout, size_t offset, size_t count) {
  std::vector<DecayRange> ranges;
  const size_t end = offset + count;
  for (const model::TensorInfo& t : model::TrainedTensors(layout)) {
    const size_t b = std::max(offset, t.offset);
    const size_t e = std::min(end, t.offset + t.numel);
    if (b >= e) continue;
    if (!ranges.empty() && ranges.back().decay == t.decay && ranges.back().end == b - offset) {
      ranges.back().end = e - offset;
    } else {
      ranges.push_back({b - offset, e - offset, t.decay});
    }
  }
  return ranges;
}

absl::Status AdamW8bitUpdateBlocks(absl::Span<float> params, absl::Span<const float> grads,
                                   Quant8Span m, Quant8Span v, absl::Span<const DecayRange> decay,
                                   const AdamWOptions& options, const AdamW8bitStep& step,
                                   size_t block_begin, size_t block_end, engine::ThreadPool* pool) {
  if (absl::Status s =
          Validate(params.size(), grads.size(), m, v, decay, step, block_begin, block_end);
      !s.ok()) {
    return s;
  }
  const Coefficients c = AdamW8bitCoefficients(options, step);
  const Quant8Map& m_map = SignedDynamicMap();
  const Quant8Map& v_map = UnsignedDynamicMap();
  engine::ParallelFor(
      pool, static_cast<int64_t>(block_end - block_begin),
      [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; ++b) {
          UpdateBlock(block_begin + b, params, grads, m, v, decay, c, m_map, v_map);
        }
      },
      /*min_grain=*/8);  // 16Ki elements, as the fp32 update
  return absl::OkStatus();
}

absl::Status AdamW8bitUpdate(absl::Span<float> params, absl::Span<const float> grads, Quant8Span m,
                             Quant8Span v, absl::Span<const DecayRange> decay,
                             const AdamWOptions& options, const AdamW8bitStep& step,
                             engine::ThreadPool* pool) {
  return AdamW8bitUpdateBlocks(params, grads, m, v, decay, options, step, 0,
                               Quant8Blocks(params.size()), pool);
}

}  // namespace shardtrain::optim
