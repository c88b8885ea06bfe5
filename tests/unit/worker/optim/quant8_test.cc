// Block-wise 8-bit AdamW state (quant8.h, adamw8bit.h): the two dynamic maps
// against entries worked out by hand from bitsandbytes' create_dynamic_map,
// the quantization round trip against the map's step, the 8-bit update bit
// for bit against an independent scalar reference and close to fp32 AdamW,
// the decay mask, grad_scale, and the state's size.
#include "worker/optim/quant8.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "common/model/config.h"
#include "common/model/param_layout.h"
#include "worker/engine/thread_pool.h"
#include "worker/optim/adamw.h"
#include "worker/optim/adamw8bit.h"

namespace shardtrain::optim {
namespace {

using engine::ThreadPool;
constexpr size_t kB = kQuant8BlockSize;

// ---------------------------------------------------------------------------
// The maps.
//
// create_dynamic_map(signed, max_exponent_bits=7, total_bits=8): for decade
// i = 0..6 the boundaries are linspace(0.1, 1, k + 1) with k = 2^i (signed)
// or 2^(i+1) (unsigned), the entries 10^(i-6) times the midpoints of
// neighbouring boundaries (and their negatives when signed), plus 0 and 1.
// By hand:
//   signed, i = 0: {0.1, 1} -> 0.55e-6: the smallest positive entry, map[128]
//     (127 negatives and 0 below it); -0.55e-6 = map[126].
//   signed, i = 1: {0.1, 0.55, 1} -> 0.325e-5, 0.775e-5 = map[129], map[130].
//   signed, i = 5: spacing 0.9/32 = 0.028125, first midpoint 0.1140625 ->
//     0.01140625 = map[128 + 31] (1+2+4+8+16 = 31 smaller positives).
//   signed, i = 6: spacing 0.9/64 = 0.0140625, first midpoint 0.10703125 =
//     map[128 + 63], last 1 - 0.00703125 = 0.99296875 = map[254]; so
//     map[0] = -0.99296875 (bitsandbytes' signed map has no -1).
//   unsigned, i = 0: {0.1, 0.55, 1} -> 0.325e-6, 0.775e-6 = map[1], map[2].
//   unsigned, i = 3: spacing 0.9/16 = 0.05625, first midpoint 0.128125 ->
//     1.28125e-4 = map[1 + 2+4+8] = map[15].
//   unsigned, i = 6: spacing 0.9/128 = 0.00703125, first midpoint
//     0.103515625 = map[1 + 126] = map[127], last 0.996484375 = map[254].
// The map is built in float32, so these hold to a few ulps (FLOAT_EQ).

void ExpectSortedWithin(const Quant8Map& map, float lo, float hi) {
  for (size_t k = 1; k < map.size(); ++k) {
    EXPECT_LT(map[k - 1], map[k]) << "entries " << k - 1 << " and " << k;
  }
  EXPECT_GE(map.front(), lo);
  EXPECT_EQ(map.back(), hi);
}

TEST(Quant8MapTest, SignedDynamicMapIsBitsandbytesFormula) {
  const Quant8Map& map = SignedDynamicMap();
  ASSERT_EQ(map.size(), 256u);
  ExpectSortedWithin(map, -1.0f, 1.0f);  // 256 distinct entries in [-1, 1]
  EXPECT_EQ(map[127], 0.0f);
  for (int k = 0; k < 127; ++k) EXPECT_EQ(map[k], -map[254 - k]) << k;  // mirrored but 1
  EXPECT_FLOAT_EQ(map[128], 0.55e-6f);
  EXPECT_FLOAT_EQ(map[126], -0.55e-6f);
  EXPECT_FLOAT_EQ(map[129], 0.325e-5f);
  EXPECT_FLOAT_EQ(map[130], 0.775e-5f);
  EXPECT_FLOAT_EQ(map[159], 0.01140625f);
  EXPECT_FLOAT_EQ(map[191], 0.10703125f);
  EXPECT_FLOAT_EQ(map[254], 0.99296875f);
  EXPECT_FLOAT_EQ(map[0], -0.99296875f);
  EXPECT_EQ(CreateDynamicMap(true), map);
}

TEST(Quant8MapTest, UnsignedDynamicMapIsBitsandbytesFormula) {
  const Quant8Map& map = UnsignedDynamicMap();
  ASSERT_EQ(map.size(), 256u);
  ExpectSortedWithin(map, 0.0f, 1.0f);
  EXPECT_EQ(map[0], 0.0f);
  EXPECT_FLOAT_EQ(map[1], 0.325e-6f);
  EXPECT_FLOAT_EQ(map[2], 0.775e-6f);
  EXPECT_FLOAT_EQ(map[15], 1.28125e-4f);
  EXPECT_FLOAT_EQ(map[127], 0.103515625f);
  EXPECT_FLOAT_EQ(map[254], 0.996484375f);
  EXPECT_EQ(CreateDynamicMap(false), map);
}

// Exactly halfway between two entries goes to the smaller one; outside the
// map, to its ends. Midpoints next to 0 are exact in float (x/2).
TEST(Quant8MapTest, NearestEntryAndTies) {
  const Quant8Map& s = SignedDynamicMap();
  const Quant8Map& u = UnsignedDynamicMap();
  EXPECT_EQ(QuantizeValue(s, 0.0f), 127);
  EXPECT_EQ(QuantizeValue(s, s[128] / 2), 127);  // tie between 0 and map[128]
  EXPECT_EQ(QuantizeValue(s, s[126] / 2), 126);  // tie between map[126] and 0
  EXPECT_EQ(QuantizeValue(s, std::nextafter(s[128] / 2, 1.0f)), 128);
  EXPECT_EQ(QuantizeValue(u, u[1] / 2), 0);
  EXPECT_EQ(QuantizeValue(u, std::nextafter(u[1] / 2, 1.0f)), 1);
  EXPECT_EQ(QuantizeValue(s, -1.0f), 0);  // below map[0] = -0.99296875
  EXPECT_EQ(QuantizeValue(s, 1.0f), 255);
  EXPECT_EQ(QuantizeValue(s, 0.5f * (s[200] + s[201]) * 0.999f), 200);
  for (int k = 0; k < 256; ++k) {
    EXPECT_EQ(QuantizeValue(s, s[k]), k);
    EXPECT_EQ(QuantizeValue(u, u[k]), k);
  }
}

// ---------------------------------------------------------------------------
// The round trip.

// The map entry nearest y by a scan of all 256 (ties: the first, the smaller).
uint8_t NearestByScan(const Quant8Map& map, float y) {
  int best = 0;
  for (int k = 1; k < 256; ++k) {
    if (std::fabs(y - map[k]) < std::fabs(y - map[best])) best = k;
  }
  return static_cast<uint8_t>(best);
}

// Half the gap between the two map entries around y (the end gap outside).
float HalfStep(const Quant8Map& map, float y) {
  size_t k = 0;
  while (k + 2 < map.size() && map[k + 1] <= y) ++k;
  return (map[k + 1] - map[k]) / 2;
}

// n = 9 whole blocks and a partial one of 777; per block: normal, zeros,
// huge (1e30), tiny (1e-30), magnitudes spread over 12 decades, an outlier
// 1e4 among normals, subnormals (1e-41), a constant, near float max (1e37),
// normal (the partial block). For the unsigned map, |x|.
std::vector<float> RoundTripData(uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> decades(-12.0f, 0.0f);
  const size_t n = 9 * kB + 777;
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) {
    const size_t b = i / kB;
    const float z = normal(rng);
    switch (b) {
      case 1:
        x[i] = 0.0f;
        break;
      case 2:
        x[i] = z * 1e30f;
        break;
      case 3:
        x[i] = z * 1e-30f;
        break;
      case 4:
        x[i] = z * std::pow(10.0f, decades(rng));
        break;
      case 6:
        x[i] = z * 1e-41f;
        break;
      case 7:
        x[i] = -3.0f;
        break;
      case 8:
        x[i] = z * 1e37f;
        break;
      default:
        x[i] = z;
    }
  }
  x[5 * kB + 1000] = 1e4f;
  return x;
}

void CheckRoundTrip(const Quant8Map& map, const std::vector<float>& x, const char* name) {
  const size_t n = x.size(), blocks = Quant8Blocks(n);
  ThreadPool pool(2);
  std::vector<uint8_t> codes(n), serial_codes(n);
  std::vector<float> absmax(blocks), serial_absmax(blocks), y(n);
  ASSERT_TRUE(Quantize8(map, x, {absl::MakeSpan(codes), absl::MakeSpan(absmax)}, &pool).ok());
  ASSERT_TRUE(
      Quantize8(map, x, {absl::MakeSpan(serial_codes), absl::MakeSpan(serial_absmax)}, nullptr)
          .ok());
  EXPECT_EQ(codes, serial_codes);
  EXPECT_EQ(absmax, serial_absmax);
  ASSERT_TRUE(Dequantize8(map, codes, absmax, absl::MakeSpan(y), &pool).ok());
  double max_err_over_absmax = 0, max_err_over_bound = 0;
  int wrong_codes = 0, over = 0;
  for (size_t b = 0; b < blocks; ++b) {
    const size_t begin = b * kB, end = std::min(n, begin + kB);
    float expect_absmax = 0;
    for (size_t i = begin; i < end; ++i) expect_absmax = std::max(expect_absmax, std::fabs(x[i]));
    ASSERT_EQ(absmax[b], expect_absmax) << name << " block " << b;
    for (size_t i = begin; i < end; ++i) {
      if (expect_absmax == 0) {
        EXPECT_EQ(y[i], 0.0f);
        EXPECT_FALSE(std::signbit(y[i]));
        continue;
      }
      const float yi = x[i] / expect_absmax;
      wrong_codes += codes[i] != NearestByScan(map, yi);
      // Within half a step of the map, scaled, plus the rounding of x/absmax
      // and of map·absmax (2^-24 relative each, doubled) and of subnormals.
      const double err = std::fabs(double{x[i]} - y[i]);
      const double bound = double{HalfStep(map, yi)} * expect_absmax +
                           (std::fabs(x[i]) + std::fabs(y[i])) * 0x1p-23 + FLT_TRUE_MIN;
      over += err > bound;
      max_err_over_absmax = std::max(max_err_over_absmax, err / expect_absmax);
      max_err_over_bound = std::max(max_err_over_bound, err / bound);
    }
  }
  EXPECT_EQ(wrong_codes, 0) << name << ": codes that are not the nearest entry";
  EXPECT_EQ(over, 0) << name << ": elements off by more than half the map's step";
  std::printf(
      "[ %s ] round trip of %zu values: max |x - dq(q(x))| / absmax = %.6g, "
      "max error / (half step · absmax) = %.4f\n",
      name, n, max_err_over_absmax, max_err_over_bound);
}

TEST(Quant8Test, RoundTripWithinTheMapsStep) {
  const std::vector<float> x = RoundTripData(7);
  std::vector<float> magnitudes(x.size());
  for (size_t i = 0; i < x.size(); ++i) magnitudes[i] = std::fabs(x[i]);
  CheckRoundTrip(SignedDynamicMap(), x, "signed");
  CheckRoundTrip(UnsignedDynamicMap(), magnitudes, "unsigned");
}

TEST(Quant8Test, ZeroAbsmaxReadsZeroAndSizesAreChecked) {
  const size_t n = kB + 3;
  std::vector<uint8_t> codes(n, 0);  // map[0] = -0.99..., but absmax 0
  std::vector<float> absmax(2, 0.0f), y(n, 5.0f);
  ASSERT_TRUE(Dequantize8(SignedDynamicMap(), codes, absmax, absl::MakeSpan(y), nullptr).ok());
  for (float v : y) {
    ASSERT_EQ(v, 0.0f);
    ASSERT_FALSE(std::signbit(v)) << "-0 from map[0] · 0";
  }
  std::vector<float> short_absmax(1);
  EXPECT_EQ(Dequantize8(SignedDynamicMap(), codes, short_absmax, absl::MakeSpan(y), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Quantize8(SignedDynamicMap(), y,
                      {absl::MakeSpan(codes).subspan(1), absl::MakeSpan(absmax)}, nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------
// The 8-bit update.

// 8-bit AdamW state of n elements.
struct State8 {
  explicit State8(size_t n)
      : m_codes(n), v_codes(n), m_absmax(Quant8Blocks(n)), v_absmax(Quant8Blocks(n)) {}
  Quant8Span m() { return {absl::MakeSpan(m_codes), absl::MakeSpan(m_absmax)}; }
  Quant8Span v() { return {absl::MakeSpan(v_codes), absl::MakeSpan(v_absmax)}; }
  bool operator==(const State8& o) const {
    return m_codes == o.m_codes && v_codes == o.v_codes && m_absmax == o.m_absmax &&
           v_absmax == o.v_absmax;
  }
  std::vector<uint8_t> m_codes, v_codes;
  std::vector<float> m_absmax, v_absmax;
};

// The 8-bit step written out as plain loops, independently of adamw8bit.cc:
// per block dequantize, the update as adamw8bit.h specifies (fused
// multiply-adds where it says), absmax and the nearest code by a full scan.
// decay_mask: per element.
void ReferenceStep(std::vector<float>& p, const std::vector<float>& g, State8& s,
                   const std::vector<bool>& decay_mask, const AdamWOptions& o, float lr, int64_t t,
                   float grad_scale) {
  const Quant8Map& smap = SignedDynamicMap();
  const Quant8Map& umap = UnsignedDynamicMap();
  const float b1 = o.beta1, b2 = o.beta2;
  const float bc1 = 1.0f - static_cast<float>(std::pow(double{b1}, t));
  const float bc2 = 1.0f - static_cast<float>(std::pow(double{b2}, t));
  const float step_size = lr / bc1, inv_sqrt_bc2 = 1.0f / std::sqrt(bc2);
  const float decay = std::fma(-lr, o.weight_decay, 1.0f);
  const size_t n = p.size();
  for (size_t b = 0; b < Quant8Blocks(n); ++b) {
    const size_t begin = b * kB, end = std::min(n, begin + kB);
    std::vector<float> m(end - begin), v(end - begin);
    for (size_t i = begin; i < end; ++i) {
      m[i - begin] = s.m_absmax[b] == 0 ? 0.0f : smap[s.m_codes[i]] * s.m_absmax[b];
      v[i - begin] = s.v_absmax[b] == 0 ? 0.0f : umap[s.v_codes[i]] * s.v_absmax[b];
    }
    float m_max = 0, v_max = 0;
    for (size_t i = begin; i < end; ++i) {
      float& mi = m[i - begin];
      float& vi = v[i - begin];
      const float gi = g[i] * grad_scale;
      mi = std::fma(b1, mi, (1.0f - b1) * gi);
      vi = std::fma(b2, vi, (1.0f - b2) * gi * gi);
      const float denom = std::fma(std::sqrt(vi), inv_sqrt_bc2, o.eps);
      p[i] = std::fma(p[i], decay_mask[i] ? decay : 1.0f, -(step_size * mi / denom));
      m_max = std::max(m_max, std::fabs(mi));
      v_max = std::max(v_max, std::fabs(vi));
    }
    s.m_absmax[b] = m_max;
    s.v_absmax[b] = v_max;
    for (size_t i = begin; i < end; ++i) {
      s.m_codes[i] = NearestByScan(smap, m_max == 0 ? 0.0f : m[i - begin] / m_max);
      s.v_codes[i] = NearestByScan(umap, v_max == 0 ? 0.0f : v[i - begin] / v_max);
    }
  }
}

// A small GPT's layout (dim 16: 4 blocks, dim 48: 32 blocks): decayed and
// undecayed tensors alternate, and its size is not a multiple of the block.
model::ParamLayout SmallGptLayout(int dim) {
  auto config = model::MakeGptConfig(/*layers=*/2, /*heads=*/2, dim, /*context=*/16,
                                     /*vocab=*/97);
  EXPECT_TRUE(config.ok()) << config.status();
  return model::ParamLayout(*config);
}

std::vector<bool> DecayMask(const model::ParamLayout& layout) {
  std::vector<bool> mask(layout.num_params(), false);
  for (const model::TensorInfo& t : layout.tensors()) {
    for (size_t i = t.offset; i < t.offset + t.numel; ++i) mask[i] = t.decay;
  }
  return mask;
}

// 100 steps on random gradients of a model's whole range: the 8-bit update
// (on 2 threads, the range split into two block ranges on odd steps) equals
// the scalar reference in every bit of params, codes and absmax after every
// step.
TEST(AdamW8bitTest, EqualsScalarReferenceBitForBit) {
  const model::ParamLayout layout = SmallGptLayout(16);
  const size_t n = layout.num_params();
  ASSERT_NE(n % kB, 0u);
  const std::vector<DecayRange> ranges = DecayRanges(layout, 0, n);
  const std::vector<bool> mask = DecayMask(layout);
  AdamWOptions o;
  o.weight_decay = 0.1f;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> p(n), g(n);
  for (float& x : p) x = 0.1f * normal(rng);
  std::vector<float> p_ref = p;
  State8 s(n), s_ref(n);
  ThreadPool pool(2);
  const size_t blocks = Quant8Blocks(n);
  for (int64_t t = 1; t <= 100; ++t) {
    // Gradient scales differ per tensor and shrink over the steps.
    for (size_t i = 0; i < n; ++i) g[i] = normal(rng) * (1.0f + (i / 997) % 5) / std::sqrt(t);
    const float lr = 1e-3f * (1.0f + 0.01f * t), clip = t % 3 == 0 ? 0.7f : 1.0f;
    const AdamW8bitStep step{lr, t, clip};
    if (t % 2 == 1) {
      const size_t k = blocks / 3;
      ASSERT_TRUE(AdamW8bitUpdateBlocks(absl::MakeSpan(p), g, s.m(), s.v(), ranges, o, step, k,
                                        blocks, &pool)
                      .ok());
      ASSERT_TRUE(
          AdamW8bitUpdateBlocks(absl::MakeSpan(p), g, s.m(), s.v(), ranges, o, step, 0, k, &pool)
              .ok());
    } else {
      ASSERT_TRUE(AdamW8bitUpdate(absl::MakeSpan(p), g, s.m(), s.v(), ranges, o, step, &pool).ok());
    }
    ReferenceStep(p_ref, g, s_ref, mask, o, lr, t, clip);
    ASSERT_EQ(p, p_ref) << "params differ after step " << t;
    ASSERT_TRUE(s == s_ref) << "state differs after step " << t;
  }
}

// 8-bit against fp32 AdamW (the optimizer of adamw.h) on the same random
// gradients: 100 steps of lr 1e-2 and decay 0.1 on the 2-D tensors of a
// model's range, gradients N(0, s²) with s = 1..5 changing every 997
// elements (so blocks mix scales). The 8-bit moments are held within half a
// map step of what the update computed: at |m| / absmax of 0.1-1 that is
// 0.7-7% (likewise v), and an m or v whose change per step is below it stays
// put. So each update is off by a few percent, and the runs drift apart by
// a few percent of how far the parameters moved. Measured (libstdc++'s
// normal_distribution): 3.0% of ‖p32 - p0‖, 0.72% of ‖p32‖, at most 0.023
// for an element that moved up to ~lr·100 = 1. Tolerances: twice those.
TEST(AdamW8bitTest, CloseToFp32AdamWOnTheSameGradients) {
  const model::ParamLayout layout = SmallGptLayout(48);
  const size_t n = layout.num_params();
  AdamWOptions o;
  o.weight_decay = 0.1f;
  auto fp32 = AdamW::Create(layout, 0, n, o);
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> p0(n), g(n);
  for (float& x : p0) x = 0.5f * normal(rng);
  std::vector<float> p8 = p0, p32 = p0;
  State8 s(n);
  const std::vector<DecayRange> ranges = DecayRanges(layout, 0, n);
  ThreadPool pool(2);
  const float lr = 1e-2f;
  for (int64_t t = 1; t <= 100; ++t) {
    for (size_t i = 0; i < n; ++i) g[i] = (1.0f + (i / 997) % 5) * normal(rng);
    ASSERT_TRUE(
        AdamW8bitUpdate(absl::MakeSpan(p8), g, s.m(), s.v(), ranges, o, {lr, t, 1.0f}, &pool).ok());
    fp32->Step(absl::MakeSpan(p32), g, lr, &pool);
  }
  double diff2 = 0, moved2 = 0, norm2 = 0, max_diff = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = double{p8[i]} - p32[i], moved = double{p32[i]} - p0[i];
    diff2 += d * d;
    moved2 += moved * moved;
    norm2 += double{p32[i]} * p32[i];
    max_diff = std::max(max_diff, std::fabs(d));
  }
  const double of_moved = std::sqrt(diff2 / moved2), of_params = std::sqrt(diff2 / norm2);
  std::printf(
      "[ 8-bit vs fp32 ] %zu params, 100 steps: ||p8 - p32|| / ||p32 - p0|| = %.4g, "
      "||p8 - p32|| / ||p32|| = %.4g, max |p8 - p32| = %.4g\n",
      n, of_moved, of_params, max_diff);
  EXPECT_LT(of_moved, 0.06);
  EXPECT_LT(of_params, 0.015);
  EXPECT_LT(max_diff, 0.05);
}

// With zero gradients (and zero state) a step only decays: decayed elements
// become p · (1 - lr·wd), the others stay exactly as they were. Hand ranges
// cross block boundaries and include an explicit no-decay range; then the
// layout's ranges against TensorInfo::decay.
TEST(AdamW8bitTest, DecayOnlyWhereTold) {
  AdamWOptions o;
  o.weight_decay = 0.1f;
  const float lr = 0.5f, factor = 1.0f - lr * o.weight_decay;  // 0.95
  auto check = [&](size_t n, const std::vector<DecayRange>& ranges,
                   const std::vector<bool>& expect_decay) {
    std::vector<float> p(n), g(n, 0.0f);
    for (size_t i = 0; i < n; ++i) p[i] = 1.0f + 0.001f * (i % 1000);
    const std::vector<float> before = p;
    State8 s(n);
    ASSERT_TRUE(
        AdamW8bitUpdate(absl::MakeSpan(p), g, s.m(), s.v(), ranges, o, {lr, 1, 1.0f}, nullptr)
            .ok());
    int wrong = 0;
    for (size_t i = 0; i < n; ++i) {
      if (expect_decay[i]) {
        wrong += std::fabs(p[i] - before[i] * factor) > 1e-6f * before[i];
      } else {
        wrong += p[i] != before[i];
      }
    }
    EXPECT_EQ(wrong, 0) << "elements decayed where not told, or not where told";
  };
  const size_t n = 3 * kB + 5;
  const std::vector<DecayRange> ranges = {
      {100, 3000, true}, {3000, 3100, false}, {4095, 4097, true}, {n - 1, n, true}};
  std::vector<bool> expect(n, false);
  for (const DecayRange& r : ranges) {
    for (size_t i = r.begin; i < r.end; ++i) expect[i] = r.decay;
  }
  check(n, ranges, expect);
  const model::ParamLayout layout = SmallGptLayout(48);
  check(layout.num_params(), DecayRanges(layout, 0, layout.num_params()), DecayMask(layout));
  // A sub-range of the layout: ranges relative to its offset.
  const size_t offset = 5000, count = 20000;
  const std::vector<bool> whole = DecayMask(layout);
  check(count, DecayRanges(layout, offset, count),
        std::vector<bool>(whole.begin() + offset, whole.begin() + offset + count));
}

// grad_scale inside the step equals scaling the gradients first: the same
// params, codes and absmax bit for bit over three steps; grads untouched.
TEST(AdamW8bitTest, GradScaleEqualsScalingFirst) {
  const model::ParamLayout layout = SmallGptLayout(48);
  const size_t n = layout.num_params();
  const std::vector<DecayRange> ranges = DecayRanges(layout, 0, n);
  AdamWOptions o;
  std::vector<float> p_fused(n), p_apart(n), grads(n);
  for (size_t i = 0; i < n; ++i) p_fused[i] = p_apart[i] = std::sin(0.37f * i);
  State8 fused(n), apart(n);
  for (int64_t t = 1; t <= 3; ++t) {
    for (size_t i = 0; i < n; ++i) grads[i] = std::cos(0.11f * i * t);
    const float clip = 0.3f + 0.1f * t;
    std::vector<float> g = grads, scaled = grads;
    for (float& x : scaled) x *= clip;
    ASSERT_TRUE(AdamW8bitUpdate(absl::MakeSpan(p_fused), g, fused.m(), fused.v(), ranges, o,
                                {1e-2f, t, clip}, nullptr)
                    .ok());
    ASSERT_TRUE(AdamW8bitUpdate(absl::MakeSpan(p_apart), scaled, apart.m(), apart.v(), ranges, o,
                                {1e-2f, t, 1.0f}, nullptr)
                    .ok());
    EXPECT_EQ(g, grads) << "the step changed the gradients";
  }
  EXPECT_EQ(p_fused, p_apart);
  EXPECT_TRUE(fused == apart);
}

TEST(AdamW8bitTest, RejectsMismatchedSizesAndRanges) {
  const size_t n = 2 * kB + 1;
  std::vector<float> p(n, 1.0f), g(n, 1.0f);
  State8 s(n);
  AdamWOptions o;
  const AdamW8bitStep step{1e-3f, 1, 1.0f};
  auto code = [&](absl::Span<const float> grads, Quant8Span m, std::vector<DecayRange> ranges,
                  AdamW8bitStep st, size_t b0, size_t b1) {
    return AdamW8bitUpdateBlocks(absl::MakeSpan(p), grads, m, s.v(), ranges, o, st, b0, b1, nullptr)
        .code();
  };
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(code(absl::MakeSpan(g).subspan(1), s.m(), {}, step, 0, 3), kInvalid);
  EXPECT_EQ(
      code(g, {absl::MakeSpan(s.m_codes), absl::MakeSpan(s.m_absmax).subspan(1)}, {}, step, 0, 3),
      kInvalid);
  EXPECT_EQ(code(g, s.m(), {}, step, 0, 4), kInvalid);
  EXPECT_EQ(code(g, s.m(), {}, step, 2, 1), kInvalid);
  EXPECT_EQ(code(g, s.m(), {}, {1e-3f, 0, 1.0f}, 0, 3), kInvalid);
  EXPECT_EQ(code(g, s.m(), {{10, 20, true}, {15, 30, true}}, step, 0, 3), kInvalid);
  EXPECT_EQ(code(g, s.m(), {{10, n + 1, true}}, step, 0, 3), kInvalid);
  EXPECT_EQ(code(g, s.m(), {{20, 10, true}}, step, 0, 3), kInvalid);
  EXPECT_EQ(p, std::vector<float>(n, 1.0f)) << "a rejected call wrote params";
  EXPECT_EQ(code(g, s.m(), {{10, 20, true}, {20, 30, false}}, step, 1, 1), absl::StatusCode::kOk);
  EXPECT_EQ(p, std::vector<float>(n, 1.0f)) << "an empty block range wrote params";
}

// The state of n parameters: 2·n code bytes and two fp32 absmax per block.
TEST(Quant8Test, Int8StateBytes) {
  EXPECT_EQ(Int8StateBytes(0), 0u);
  EXPECT_EQ(Int8StateBytes(1), 2u + 8u);
  EXPECT_EQ(Int8StateBytes(2048), 4096u + 8u);
  EXPECT_EQ(Int8StateBytes(2049), 4098u + 16u);
  EXPECT_EQ(Int8StateBytes(124'439'808), 2u * 124'439'808 + 8u * 60'762);  // GPT-2 124M
  for (size_t n : {1u, 777u, 2048u, 4097u, 100000u}) {
    const State8 s(n);
    const size_t held = s.m_codes.size() + s.v_codes.size() +
                        sizeof(float) * (s.m_absmax.size() + s.v_absmax.size());
    EXPECT_EQ(Int8StateBytes(n), held) << n;
  }
  EXPECT_LT(Int8StateBytes(1 << 20) * 3.9, 8.0 * (1 << 20));  // ~1/4 of fp32 AdamW's
}

}  // namespace
}  // namespace shardtrain::optim
