#include "worker/quant/weight_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "worker/optim/quant8.h"

namespace shardtrain::quant {
namespace {

using model::kNf4AbsmaxBlockSize;
using model::kNf4BlockSize;
using model::kNf4Levels;

// Rows (int8) or blocks (nf4) per parallel task.
constexpr int64_t kGrain = 16;

float AbsMax(const float* x, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
  return m;
}

}  // namespace

QuantWeightView QuantizedWeight::view() const {
  QuantWeightView v;
  v.format = format;
  v.rows = rows;
  v.cols = cols;
  v.codes = codes.data();
  if (absmax_codes.empty()) {
    v.absmax = absmax.data();
  } else {
    v.absmax_codes = absmax_codes.data();
    v.absmax_scale = absmax_scale.data();
    v.absmax_offset = absmax_offset;
  }
  return v;
}

int64_t QuantizedWeight::bytes() const {
  // What the vectors hold (and the offset, with double quantization).
  return static_cast<int64_t>(codes.size() + sizeof(float) * absmax.size() + absmax_codes.size() +
                              sizeof(float) * absmax_scale.size() +
                              (absmax_codes.empty() ? 0 : sizeof(float)));
}

QuantizedWeight QuantizeInt8Rows(const float* w, int64_t rows, int64_t cols,
                                 engine::ThreadPool* pool) {
  QuantizedWeight q;
  q.format = WeightFormat::kInt8;
  q.rows = rows;
  q.cols = cols;
  q.codes.resize(rows * cols);
  q.absmax.resize(rows);
  engine::ParallelFor(
      pool, rows,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const float* x = w + r * cols;
          const float m = AbsMax(x, cols);
          q.absmax[r] = m;
          const float inv = m > 0.0f ? 127.0f / m : 0.0f;
          for (int64_t c = 0; c < cols; ++c) {
            const auto code = static_cast<int8_t>(std::round(x[c] * inv));
            std::memcpy(&q.codes[r * cols + c], &code, 1);
          }
        }
      },
      kGrain);
  return q;
}

QuantizedWeight QuantizeFrozen(const model::FrozenFormat& format, const float* w, int64_t rows,
                               int64_t cols, engine::ThreadPool* pool) {
  return format.quant == model::FrozenQuant::kInt8
             ? QuantizeInt8Rows(w, rows, cols, pool)
             : QuantizeNf4(w, rows, cols, format.double_quant, pool);
}

uint8_t Nf4Code(float y) {
  // The first level whose midpoint with the next one is >= y: nearest, ties
  // to the lower level.
  uint8_t code = 0;
  while (code < 15 && y > 0.5f * (kNf4Levels[code] + kNf4Levels[code + 1])) ++code;
  return code;
}

QuantizedWeight QuantizeNf4(const float* w, int64_t rows, int64_t cols, bool double_quant,
                            engine::ThreadPool* pool) {
  QuantizedWeight q;
  q.format = WeightFormat::kNf4;
  q.rows = rows;
  q.cols = cols;
  const int64_t n = rows * cols, blocks = model::Nf4Blocks(n);
  q.codes.assign((n + 1) / 2, 0);
  q.absmax.resize(blocks);
  // kNf4BlockSize is even, so a block's codes fill whole bytes of its own.
  engine::ParallelFor(
      pool, blocks,
      [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; ++b) {
          const int64_t i0 = b * kNf4BlockSize, i1 = std::min(n, i0 + kNf4BlockSize);
          const float m = AbsMax(w + i0, i1 - i0);
          q.absmax[b] = m;
          const float inv = m > 0.0f ? 1.0f / m : 0.0f;
          for (int64_t i = i0; i < i1; ++i) {
            const uint8_t c = Nf4Code(w[i] * inv);
            q.codes[i / 2] |= (i % 2 == 0) ? uint8_t(c << 4) : c;
          }
        }
      },
      kGrain);
  if (!double_quant) return q;
  // bitsandbytes' compress_statistics: the mean off, then 8-bit blocks.
  double sum = 0;
  for (float a : q.absmax) sum += a;
  q.absmax_offset = blocks > 0 ? static_cast<float>(sum / blocks) : 0.0f;
  std::vector<float> centred(blocks);
  for (int64_t b = 0; b < blocks; ++b) centred[b] = q.absmax[b] - q.absmax_offset;
  const int64_t groups = (blocks + kNf4AbsmaxBlockSize - 1) / kNf4AbsmaxBlockSize;
  q.absmax_codes.resize(blocks);
  q.absmax_scale.resize(groups);
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t b0 = g * kNf4AbsmaxBlockSize, b1 = std::min(blocks, b0 + kNf4AbsmaxBlockSize);
    q.absmax_scale[g] = optim::QuantizeBlock(optim::SignedDynamicMap(),
                                             absl::MakeConstSpan(centred.data() + b0, b1 - b0),
                                             absl::MakeSpan(q.absmax_codes.data() + b0, b1 - b0));
  }
  q.absmax.clear();
  return q;
}

float Nf4BlockAbsmax(const QuantWeightView& w, int64_t b) {
  if (!w.double_quant()) return w.absmax[b];
  return optim::SignedDynamicMap()[w.absmax_codes[b]] * w.absmax_scale[b / kNf4AbsmaxBlockSize] +
         w.absmax_offset;
}

void DequantizeRows(const QuantWeightView& w, int64_t r0, int64_t r1, float* out) {
  if (w.format == WeightFormat::kInt8) {
    for (int64_t r = r0; r < r1; ++r) {
      const float s = w.absmax[r] / 127.0f;
      const auto* codes = reinterpret_cast<const int8_t*>(w.codes) + r * w.cols;
      float* o = out + (r - r0) * w.cols;
      for (int64_t c = 0; c < w.cols; ++c) o[c] = static_cast<float>(codes[c]) * s;
    }
    return;
  }
  const int64_t i0 = r0 * w.cols, i1 = r1 * w.cols;
  int64_t block = -1;
  float absmax = 0.0f;
  for (int64_t i = i0; i < i1; ++i) {
    if (i / kNf4BlockSize != block) {
      block = i / kNf4BlockSize;
      absmax = Nf4BlockAbsmax(w, block);
    }
    const uint8_t byte = w.codes[i / 2];
    const uint8_t code = (i % 2 == 0) ? (byte >> 4) : (byte & 0x0F);
    out[i - i0] = kNf4Levels[code] * absmax;
  }
}

}  // namespace shardtrain::quant
