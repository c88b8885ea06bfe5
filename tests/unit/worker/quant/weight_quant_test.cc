// The frozen-weight formats (worker/quant/weight_quant.h) and the tiled
// matmuls on them (quant_matmul.h): NF4's levels are the paper's
// construction, quantization picks the nearest level (or int8 step) and
// packs as bitsandbytes does, double quantization keeps each block's absmax
// within its 8-bit map's step, and the matmuls equal dequantizing the whole
// weight first.
#include "worker/quant/weight_quant.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "worker/engine/cpu/layers.h"
#include "worker/engine/cpu/quant_matmul.h"
#include "worker/optim/quant8.h"

namespace shardtrain::quant {
namespace {

using engine::cpu::QuantMatmulBackwardInput;
using engine::cpu::QuantMatmulForward;
using model::kNf4BlockSize;
using model::kNf4Levels;

// The standard normal's quantile, by bisection on std::erf (double).
double NormalQuantile(double p) {
  double lo = -10, hi = 10;
  for (int i = 0; i < 200; ++i) {
    const double mid = 0.5 * (lo + hi);
    (0.5 * (1 + std::erf(mid / std::sqrt(2.0))) < p ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

std::vector<float> Linspace(float a, float b, int n) {  // torch.linspace's values, in float
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = a + (b - a) * float(i) / float(n - 1);
  return v;
}

TEST(WeightQuantTest, Nf4LevelsAreThePapersNormalQuantiles) {
  // QLoRA's NF4 (bitsandbytes' create_normal_map(0.9677083, use_extra_value)):
  // 8 positive quantiles of N(0, 1) at linspace(offset, 0.5, 9)[:-1], 7
  // negative at linspace(offset, 0.5, 8)[:-1], an exact 0, sorted and divided
  // by the largest.
  const float offset = 0.9677083f;
  std::vector<double> v;
  for (float p : Linspace(offset, 0.5f, 9)) v.push_back(NormalQuantile(p));
  v.pop_back();
  const std::vector<float> neg = Linspace(offset, 0.5f, 8);
  for (size_t i = 0; i + 1 < neg.size(); ++i) v.push_back(-NormalQuantile(neg[i]));
  v.push_back(0.0);
  std::sort(v.begin(), v.end());
  ASSERT_EQ(v.size(), 16u);
  double worst = 0;
  for (int i = 0; i < 16; ++i) worst = std::max(worst, std::abs(v[i] / v[15] - kNf4Levels[i]));
  std::printf("[nf4] levels vs the paper's quantile construction: max abs diff %.2e\n", worst);
  EXPECT_LT(worst, 1e-6);
  EXPECT_EQ(kNf4Levels[7], 0.0f);
}

TEST(WeightQuantTest, Nf4PicksTheNearestLevelAndPacksTheEvenElementHigh) {
  const float w[4] = {1.0f, -1.0f, 0.0f, 0.08f};
  const QuantizedWeight q = QuantizeNf4(w, 1, 4, false, nullptr);
  ASSERT_EQ(q.codes.size(), 2u);
  EXPECT_EQ(q.codes[0], 0xF0);  // 1.0 is level 15, -1.0 level 0
  EXPECT_EQ(q.codes[1], 0x78);  // 0 is level 7, 0.08 nearest 0.0796 (level 8)
  EXPECT_EQ(q.absmax[0], 1.0f);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int k = 0; k < 10000; ++k) {
    const float y = u(rng);
    const uint8_t c = Nf4Code(y);
    for (int j = 0; j < 16; ++j)
      ASSERT_LE(std::abs(y - kNf4Levels[c]), std::abs(y - kNf4Levels[j])) << y;
  }
}

std::vector<float> RandomWeight(int64_t n, unsigned seed, float scale = 0.02f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> w(n);
  for (float& x : w) x = d(rng);
  return w;
}

TEST(WeightQuantTest, Nf4RoundTripIsTheNearestLevelTimesTheBlocksAbsmax) {
  const int64_t rows = 37, cols = 70;  // blocks of 64 straddle rows; the last is partial
  const std::vector<float> w = RandomWeight(rows * cols, 1);
  const QuantizedWeight q = QuantizeNf4(w.data(), rows, cols, false, nullptr);
  EXPECT_EQ(q.bytes(), model::Nf4Bytes(rows * cols, false));
  std::vector<float> back(rows * cols);
  DequantizeRows(q.view(), 0, rows, back.data());
  double worst = 0;
  for (int64_t i = 0; i < rows * cols; ++i) {
    const float absmax = q.absmax[i / kNf4BlockSize];
    const float y = w[i] / absmax;
    float nearest = kNf4Levels[0];
    for (float l : kNf4Levels)
      if (std::abs(y - l) < std::abs(y - nearest)) nearest = l;
    ASSERT_EQ(back[i], nearest * absmax) << i;
    worst = std::max(worst, double(std::abs(back[i] - w[i]) / absmax));
  }
  // Within half the widest gap between levels (-1 .. -0.6962).
  double gap = 0;
  for (int j = 0; j + 1 < 16; ++j) gap = std::max(gap, double(kNf4Levels[j + 1] - kNf4Levels[j]));
  std::printf("[nf4] round trip: worst |error| / absmax %.4f (half the widest gap %.4f)\n", worst,
              0.5 * gap);
  EXPECT_LE(worst, 0.5 * gap + 1e-6);
  // Rows out of the middle dequantize as the whole does.
  std::vector<float> part(5 * cols);
  DequantizeRows(q.view(), 11, 16, part.data());
  for (int64_t i = 0; i < 5 * cols; ++i) ASSERT_EQ(part[i], back[11 * cols + i]);
}

TEST(WeightQuantTest, DoubleQuantizationKeepsEachAbsmaxWithinItsMapStep) {
  // 600 blocks: three groups of 256 blocks, the last partial.
  const int64_t rows = 600, cols = 64;
  std::vector<float> w = RandomWeight(rows * cols, 2);
  for (int64_t r = 0; r < rows; r += 7) w[r * cols] = 0.2f;  // some blocks far above the mean
  const QuantizedWeight plain = QuantizeNf4(w.data(), rows, cols, false, nullptr);
  const QuantizedWeight dq = QuantizeNf4(w.data(), rows, cols, true, nullptr);
  ASSERT_EQ(dq.absmax_codes.size(), 600u);
  ASSERT_EQ(dq.absmax_scale.size(), 3u);
  EXPECT_TRUE(dq.absmax.empty());
  EXPECT_EQ(dq.codes, plain.codes);
  const optim::Quant8Map& map = optim::SignedDynamicMap();
  float gap = 0;
  for (int i = 0; i + 1 < 256; ++i) gap = std::max(gap, map[i + 1] - map[i]);
  double worst = 0;
  for (int64_t b = 0; b < 600; ++b) {
    const double err = std::abs(Nf4BlockAbsmax(dq.view(), b) - plain.absmax[b]);
    const double bound = 0.5 * gap * dq.absmax_scale[b / 256] + 1e-7;
    ASSERT_LE(err, bound) << b;
    worst = std::max(worst, err / plain.absmax[b]);
  }
  const double per = double(dq.bytes()) / double(rows * cols);
  std::printf(
      "[nf4] double quantization: absmax relative error <= %.4f; %.4f bytes per "
      "element (without: %.4f)\n",
      worst, per, double(plain.bytes()) / double(rows * cols));
  EXPECT_EQ(dq.bytes(), model::Nf4Bytes(rows * cols, true));
  EXPECT_LT(dq.bytes(), plain.bytes());
}

TEST(WeightQuantTest, Int8RowsRoundTripWithinHalfAStep) {
  const int64_t rows = 9, cols = 33;
  std::vector<float> w = RandomWeight(rows * cols, 3);
  for (int64_t c = 0; c < cols; ++c) w[4 * cols + c] = 0.0f;  // a zero row
  const QuantizedWeight q = QuantizeInt8Rows(w.data(), rows, cols, nullptr);
  EXPECT_EQ(q.bytes(), model::Int8RowsBytes(rows, cols));
  std::vector<float> back(rows * cols);
  DequantizeRows(q.view(), 0, rows, back.data());
  for (int64_t r = 0; r < rows; ++r) {
    const float step = q.absmax[r] / 127.0f;
    for (int64_t c = 0; c < cols; ++c)
      ASSERT_LE(std::abs(back[r * cols + c] - w[r * cols + c]), 0.5f * step * 1.0001f + 1e-9f);
  }
  for (int64_t c = 0; c < cols; ++c) EXPECT_EQ(back[4 * cols + c], 0.0f);
}

double MaxRel(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, s = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, double(std::abs(a[i] - b[i])));
    s = std::max(s, double(std::abs(b[i])));
  }
  return d / s;
}

// The tiled matmuls against the whole weight dequantized, then the engine's
// own MatmulForward / MatmulBackward.
void CheckMatmuls(const char* name, const QuantizedWeight& q, engine::ThreadPool* pool) {
  const int OC = int(q.rows), IC = int(q.cols), N = 11, ld = OC + 3, tile = 5;
  std::vector<float> whole(size_t(OC) * IC);
  DequantizeRows(q.view(), 0, OC, whole.data());
  const std::vector<float> inp = RandomWeight(int64_t{N} * IC, 4, 1.0f);
  const std::vector<float> bias = RandomWeight(OC, 5, 1.0f);
  std::vector<float> out(size_t(N) * ld, 0.0f), ref(size_t(N) * ld, 0.0f);
  std::vector<float> scratch(size_t(tile) * IC);
  QuantMatmulForward(out.data(), ld, inp.data(), q.view(), bias.data(), N, scratch.data(), tile,
                     pool);
  engine::cpu::MatmulForward<float>(ref.data(), inp.data(), whole.data(), bias.data(), N, IC, OC,
                                    ld, pool);
  const double fwd = MaxRel(out, ref);
  const std::vector<float> dout = RandomWeight(int64_t{N} * ld, 6, 1.0f);
  std::vector<float> dinp(size_t(N) * IC, 0.5f), dref(size_t(N) * IC, 0.5f);
  std::vector<float> dw(whole.size()), db(OC);
  QuantMatmulBackwardInput(dinp.data(), dout.data(), ld, q.view(), N, scratch.data(), tile, pool);
  engine::cpu::MatmulBackward<float>(dref.data(), dw.data(), db.data(), dout.data(), ld, inp.data(),
                                     whole.data(), N, IC, OC, pool);
  const double bwd = MaxRel(dinp, dref);
  std::printf("[quant-matmul] %-12s forward max rel diff %.2e, input gradient %.2e\n", name, fwd,
              bwd);
  EXPECT_LT(fwd, 1e-6) << name;
  EXPECT_LT(bwd, 1e-6) << name;
}

TEST(QuantMatmulTest, TiledMatmulsEqualDequantizeThenMatmul) {
  const int64_t OC = 13, IC = 70;  // 13 rows in tiles of 5; blocks straddle rows
  const std::vector<float> w = RandomWeight(OC * IC, 8);
  engine::ThreadPool pool(2);
  CheckMatmuls("int8", QuantizeInt8Rows(w.data(), OC, IC, nullptr), nullptr);
  CheckMatmuls("nf4", QuantizeNf4(w.data(), OC, IC, false, nullptr), nullptr);
  CheckMatmuls("nf4 dq", QuantizeNf4(w.data(), OC, IC, true, &pool), &pool);
}

TEST(WeightQuantTest, ThreadsDoNotChangeTheCodes) {
  const std::vector<float> w = RandomWeight(300 * 64, 9);
  engine::ThreadPool pool(2);
  const QuantizedWeight a = QuantizeNf4(w.data(), 300, 64, true, nullptr);
  const QuantizedWeight b = QuantizeNf4(w.data(), 300, 64, true, &pool);
  EXPECT_EQ(a.codes, b.codes);
  EXPECT_EQ(a.absmax_codes, b.absmax_codes);
  EXPECT_EQ(a.absmax_scale, b.absmax_scale);
  const QuantizedWeight c = QuantizeInt8Rows(w.data(), 300, 64, nullptr);
  const QuantizedWeight d = QuantizeInt8Rows(w.data(), 300, 64, &pool);
  EXPECT_EQ(c.codes, d.codes);
  EXPECT_EQ(c.absmax, d.absmax);
}

}  // namespace
}  // namespace shardtrain::quant
