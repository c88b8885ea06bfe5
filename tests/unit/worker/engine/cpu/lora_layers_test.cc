// LoRA's layer (worker/engine/cpu/lora_layers.h) against finite
// differences in double, the zero B of step 0, and the merged weight.
#include "worker/engine/cpu/lora_layers.h"

#include <gtest/gtest.h>

#include <random>

#include "tests/unit/worker/engine/cpu/fd_test_util.h"
#include "worker/engine/cpu/layers.h"

namespace shardtrain::engine::cpu {
namespace {

using fd::Dot;
using fd::ExpectGradClose;
using fd::MaxRelDiff;
using fd::NumericGrad;
using fd::RandomVec;
using fd::Vec;

TEST(LoraLayersTest, BackwardMatchesFiniteDifferences) {
  // ld_out > OC: the adapter adds into a wider row, as the fused qkv's does.
  const int N = 6, IC = 7, OC = 5, r = 3, ld = 8;
  const double scale = 16.0 / r;
  std::mt19937_64 rng(11);
  Vec inp = RandomVec(N * IC, rng), A = RandomVec(r * IC, rng), B = RandomVec(OC * r, rng);
  Vec base = RandomVec(N * ld, rng), w = RandomVec(N * ld, rng), xa(N * r), out(N * ld);
  auto loss = [&] {
    out = base;
    LoraForward<double>(out.data(), ld, xa.data(), inp.data(), A.data(), B.data(), scale, N, IC, OC,
                        r, nullptr);
    return Dot(out, w);
  };
  loss();
  Vec dinp(inp.size()), dA(A.size()), dB(B.size()), g(N * r);
  LoraBackward<double>(dinp.data(), dA.data(), dB.data(), g.data(), w.data(), ld, inp.data(),
                       xa.data(), A.data(), B.data(), scale, N, IC, OC, r, nullptr);
  ExpectGradClose("lora", "inp", dinp, NumericGrad(inp, loss));
  ExpectGradClose("lora", "A", dA, NumericGrad(A, loss));
  ExpectGradClose("lora", "B", dB, NumericGrad(B, loss));
  // The padding columns of each row are not the adapter's.
  for (int n = 0; n < N; ++n)
    for (int j = OC; j < ld; ++j) EXPECT_EQ(out[n * ld + j], base[n * ld + j]);
}

TEST(LoraLayersTest, ZeroBLeavesTheOutputBitForBitAndMergeEqualsTheAdaptedLayer) {
  const int N = 9, IC = 12, OC = 10, r = 4;
  const float scale = 2.0f;
  std::mt19937_64 rng(12);
  auto f = [&](size_t n) { return fd::ToFloat(RandomVec(n, rng)); };
  std::vector<float> inp = f(N * IC), W = f(OC * IC), A = f(r * IC), B(OC * r, 0.0f);
  std::vector<float> out(N * OC), xa(N * r);
  MatmulForward<float>(out.data(), inp.data(), W.data(), nullptr, N, IC, OC, OC, nullptr);
  const std::vector<float> plain = out;
  LoraForward<float>(out.data(), OC, xa.data(), inp.data(), A.data(), B.data(), scale, N, IC, OC, r,
                     nullptr);
  EXPECT_EQ(out, plain);
  B = f(OC * r);
  out = plain;
  LoraForward<float>(out.data(), OC, xa.data(), inp.data(), A.data(), B.data(), scale, N, IC, OC, r,
                     nullptr);
  std::vector<float> merged = W, mout(N * OC);
  LoraMerge<float>(merged.data(), A.data(), B.data(), scale, IC, OC, r, nullptr);
  MatmulForward<float>(mout.data(), inp.data(), merged.data(), nullptr, N, IC, OC, OC, nullptr);
  const double rel = MaxRelDiff(Vec(mout.begin(), mout.end()), Vec(out.begin(), out.end()));
  std::printf("[lora] merged weight vs adapted layer: max rel diff %.2e\n", rel);
  EXPECT_LT(rel, 1e-6);
}

}  // namespace
}  // namespace shardtrain::engine::cpu
