#include "worker/optim/quant8.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"

namespace shardtrain::optim {
namespace {

// create_dynamic_map's parameters for 8-bit optimizer state.
constexpr int kMaxExponentBits = 7;
constexpr int kTotalBits = 8;
// Both maps spend one bit on the sign or the indicator: bitsandbytes'
// `non_sign_bits = total_bits - (1 if signed else 1)`.
constexpr int kNonSignBits = kTotalBits - 1;
// 10 ** (-(max_exponent_bits - 1) + i) for i = 0..6, as Python evaluates it
// (correctly rounded doubles; torch then casts the scalar to float).
constexpr double kDecades[kMaxExponentBits] = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0};

// torch.linspace(start, end, steps) in float32 as ATen's scalar CPU kernel
// computes it: step = (end - start) / (steps - 1); the first half counts up
// from start, the second half down from end. Each product is rounded before
// the sum (volatile), as in torch, whatever -ffp-contract allows here.
std::vector<float> LinspaceF32(float start, float end, int steps) {
  std::vector<float> out(steps);
  const float step = (end - start) / static_cast<float>(steps - 1);
  const int halfway = steps / 2;
  for (int k = 0; k < steps; ++k) {
    if (k < halfway) {
      volatile float offset = step * static_cast<float>(k);
      out[k] = start + offset;
    } else {
      volatile float offset = step * static_cast<float>(steps - k - 1);
      out[k] = end - offset;
    }
  }
  return out;
}

}  // namespace

Quant8Map CreateDynamicMap(bool is_signed) {
  std::vector<float> data;
  // additional_items = 2^(non_sign_bits - max_exponent_bits) - 1 = 0 for
  // both maps: bitsandbytes' extra linear region is empty here.
  for (int i = 0; i < kMaxExponentBits; ++i) {
    const int fraction_items = is_signed ? (1 << (i + kNonSignBits - kMaxExponentBits)) + 1
                                         : (1 << (i + kNonSignBits - kMaxExponentBits + 1)) + 1;
    const std::vector<float> boundaries = LinspaceF32(0.1f, 1.0f, fraction_items);
    const float scale = static_cast<float>(kDecades[i]);
    for (int k = 0; k + 1 < fraction_items; ++k) {
      const float mean = (boundaries[k] + boundaries[k + 1]) / 2.0f;
      data.push_back(scale * mean);
      if (is_signed) data.push_back(-scale * mean);
    }
  }
  data.push_back(0.0f);
  data.push_back(1.0f);
  std::sort(data.begin(), data.end());
  Quant8Map map{};
  // 2 · (1 + 2 + ... + 64) + 2 (signed) or (2 + 4 + ... + 128) + 2 = 256.
  std::copy_n(data.begin(), std::min(data.size(), map.size()), map.begin());
  return map;
}

const Quant8Map& SignedDynamicMap() {
  static const Quant8Map map = CreateDynamicMap(true);
  return map;
}

const Quant8Map& UnsignedDynamicMap() {
  static const Quant8Map map = CreateDynamicMap(false);
  return map;
}

size_t Quant8Blocks(size_t n) { return (n + kQuant8BlockSize - 1) / kQuant8BlockSize; }

size_t Int8StateBytes(size_t n) { return 2 * n + 2 * sizeof(float) * Quant8Blocks(n); }

uint8_t QuantizeValue(const Quant8Map& map, float y) {
  // hi: the first entry above y; y lies in [*(hi - 1), *hi).
  const float* hi = std::upper_bound(map.data(), map.data() + map.size(), y);
  if (hi == map.data()) return 0;
  if (hi == map.data() + map.size()) return static_cast<uint8_t>(map.size() - 1);
  const float* lo = hi - 1;
  const float* nearest = *hi - y < y - *lo ? hi : lo;  // a tie keeps lo
  return static_cast<uint8_t>(nearest - map.data());
}

float QuantizeBlock(const Quant8Map& map, absl::Span<const float> x, absl::Span<uint8_t> codes) {
  float absmax = 0.0f;
  for (const float xi : x) absmax = std::max(absmax, std::fabs(xi));
  if (absmax == 0.0f) {
    std::fill(codes.begin(), codes.end(), QuantizeValue(map, 0.0f));
    return 0.0f;
  }
  for (size_t i = 0; i < x.size(); ++i) codes[i] = QuantizeValue(map, x[i] / absmax);
  return absmax;
}

void DequantizeBlock(const Quant8Map& map, absl::Span<const uint8_t> codes, float absmax,
                     absl::Span<float> x) {
  if (absmax == 0.0f) {
    std::fill(x.begin(), x.end(), 0.0f);
    return;
  }
  for (size_t i = 0; i < x.size(); ++i) x[i] = map[codes[i]] * absmax;
}

namespace {

// fn(b, begin, len) for each block b of n elements (elements [begin, begin +
// len)), blocks spread over the pool.
template <typename Fn>
void ForEachBlock(size_t n, engine::ThreadPool* pool, const Fn& fn) {
  engine::ParallelFor(
      pool, static_cast<int64_t>(Quant8Blocks(n)),
      [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; ++b) {
          const size_t begin = b * kQuant8BlockSize;
          fn(static_cast<size_t>(b), begin, std::min(kQuant8BlockSize, n - begin));
        }
      },
      /*min_grain=*/8);
}

}  // namespace

absl::Status Quantize8(const Quant8Map& map, absl::Span<const float> x, Quant8Span out,
                       engine::ThreadPool* pool) {
  const size_t n = x.size(), blocks = Quant8Blocks(n);
  if (out.codes.size() != n || out.absmax.size() != blocks) {
    return absl::InvalidArgumentError(absl::StrCat("Quantize8: ", n, " values need ", n,
                                                   " codes and ", blocks, " absmax, got ",
                                                   out.codes.size(), " and ", out.absmax.size()));
  }
  ForEachBlock(n, pool, [&](size_t b, size_t begin, size_t len) {
    out.absmax[b] = QuantizeBlock(map, x.subspan(begin, len), out.codes.subspan(begin, len));
  });
  return absl::OkStatus();
}

absl::Status Dequantize8(const Quant8Map& map, absl::Span<const uint8_t> codes,
                         absl::Span<const float> absmax, absl::Span<float> x,
                         engine::ThreadPool* pool) {
  const size_t n = x.size(), blocks = Quant8Blocks(n);
  if (codes.size() != n || absmax.size() != blocks) {
    return absl::InvalidArgumentError(absl::StrCat("Dequantize8: ", n, " values need ", n,
                                                   " codes and ", blocks, " absmax, got ",
                                                   codes.size(), " and ", absmax.size()));
  }
  ForEachBlock(n, pool, [&](size_t b, size_t begin, size_t len) {
    DequantizeBlock(map, codes.subspan(begin, len), absmax[b], x.subspan(begin, len));
  });
  return absl::OkStatus();
}

}  // namespace shardtrain::optim
