// The CPU engine's GPT: initialisation, argument checks, gradient
// accumulation, and generation from it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "worker/engine/cpu/cpu_model.h"
#include "worker/engine/generate.h"

namespace shardtrain::engine::cpu {
namespace {

using model::kFcProjW, model::kFcW, model::kLn1W, model::kQkvB;
using model::MakeGptConfig;
using model::ModelConfig;
using model::ParamLayout;
using model::TensorInfo;

ModelConfig Tiny(int vocab = 100) {
  auto c = MakeGptConfig(2, 4, 32, 16, vocab);
  EXPECT_TRUE(c.ok());
  return *c;
}

TEST(GptTest, InitIsDeterministicWithGpt2Statistics) {
  auto cfg = MakeGptConfig(4, 4, 128, 64, 256);
  auto a = CpuModel::Create(*cfg, 1, 8, 2);
  auto b = CpuModel::Create(*cfg, 1, 8, 1);
  ASSERT_TRUE(a.ok() && b.ok());
  (*a)->InitParams(7);
  (*b)->InitParams(7);
  ASSERT_TRUE(std::equal((*a)->params().f32().begin(), (*a)->params().f32().end(),
                         (*b)->params().f32().begin()))
      << "init depends on the thread count";
  const ParamLayout& layout = (*a)->layout();
  auto stddev = [&](int tensor) {
    const TensorInfo& t = layout.tensors()[tensor];
    double s = 0, s2 = 0;
    for (size_t i = 0; i < t.numel; ++i) {
      const double x = (*a)->params().f32()[t.offset + i];
      s += x;
      s2 += x * x;
    }
    return std::sqrt(s2 / t.numel - (s / t.numel) * (s / t.numel));
  };
  EXPECT_NEAR(stddev(layout.wte()), 0.02, 0.001);
  EXPECT_NEAR(stddev(layout.block_tensor(0, kFcW)), 0.02, 0.001);
  EXPECT_NEAR(stddev(layout.block_tensor(0, kFcProjW)), 0.02 / std::sqrt(8.0), 0.0005);
  EXPECT_EQ((*a)->params().f32()[layout.offset(layout.block_tensor(0, kLn1W))], 1.0f);
  EXPECT_EQ((*a)->params().f32()[layout.offset(layout.block_tensor(0, kQkvB))], 0.0f);
  (*b)->InitParams(8);
  EXPECT_NE((*a)->params().f32()[5], (*b)->params().f32()[5]);
}

TEST(GptTest, CreateValidates) {
  EXPECT_EQ(CpuModel::Create(Tiny(), 0, 8, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CpuModel::Create(Tiny(), 1, 17, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CpuModel::Create(Tiny(), 1, 8, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GptDeathTest, ForwardAbortsOnOutOfRangeInput) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto m = CpuModel::Create(Tiny(), 1, 4, 1);
  ASSERT_TRUE(m.ok());
  std::vector<int> bad = {1, 2, 100, 3};
  EXPECT_DEATH((*m)->Forward(bad.data(), nullptr), "outside");
  std::vector<int> ok = {1, 2, 3, 4};
  EXPECT_DEATH((*m)->Forward(ok.data(), nullptr, 1, 5), "outside");
  (*m)->Forward(ok.data(), nullptr);
  EXPECT_DEATH((*m)->Backward(), "no preceding Forward with targets");
}

// Accumulating two half-scaled backwards of the same batch equals one
// backward; a split batch accumulated equals the whole batch (loss_scale 1/2).
TEST(GptTest, GradientAccumulation) {
  auto m = CpuModel::Create(Tiny(), 4, 8, 2);
  ASSERT_TRUE(m.ok());
  CpuModel& g = **m;
  g.InitParams(3);
  std::mt19937 rng(5);
  std::vector<int> tok(32), tgt(32);
  for (int i = 0; i < 32; ++i) {
    tok[i] = rng() % 100;
    tgt[i] = rng() % 100;
  }
  g.ZeroGrad();
  const float full_loss = g.Forward(tok.data(), tgt.data());
  g.Backward();
  std::vector<float> full(g.grads().f32().begin(), g.grads().f32().end());
  g.ZeroGrad();
  const float l0 = g.Forward(tok.data(), tgt.data(), 2, 8);
  g.Backward(0.5f);
  const float l1 = g.Forward(tok.data() + 16, tgt.data() + 16, 2, 8);
  g.Backward(0.5f);
  EXPECT_NEAR((l0 + l1) / 2, full_loss, 1e-5);
  double diff = 0, scale = 0;
  for (size_t i = 0; i < full.size(); ++i) {
    diff = std::max(diff, double(std::abs(full[i] - g.grads().f32()[i])));
    scale = std::max(scale, double(std::abs(full[i])));
  }
  std::printf("[accumulation] max rel diff %.3e\n", diff / scale);
  EXPECT_LT(diff / scale, 1e-5);
}

TEST(GenerateTest, GreedyAndSeededSampling) {
  auto m = CpuModel::Create(Tiny(), 1, 16, 2);
  (*m)->InitParams(5);
  CpuModel& g = **m;
  GenerateOptions greedy{20, 0.0f, 0};
  auto a = Generate(g, {1, 2, 3}, greedy);
  auto b = Generate(g, {1, 2, 3}, greedy);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->size(), 23u);  // beyond the 16-token window: sliding
  EXPECT_EQ(*a, *b);
  // Greedy picks the argmax of the last position's logits.
  g.Forward(std::vector<int>{1, 2, 3}.data(), nullptr, 1, 3);
  const float* row = g.logits() + 2 * g.config().padded_vocab;
  EXPECT_EQ((*a)[3], std::max_element(row, row + 100) - row);
  GenerateOptions sample{20, 1.0f, 42};
  auto s1 = Generate(g, {1, 2, 3}, sample);
  auto s2 = Generate(g, {1, 2, 3}, sample);
  sample.seed = 43;
  auto s3 = Generate(g, {1, 2, 3}, sample);
  EXPECT_EQ(*s1, *s2);
  EXPECT_NE(*s1, *s3);
  for (int t : *s1) EXPECT_TRUE(t >= 0 && t < 100);
  // candidates: only the first N tokens are drawn, greedy or sampled (a
  // byte-tokenized model with a larger vocabulary generates bytes).
  for (float temperature : {0.0f, 1.0f}) {
    GenerateOptions bytes{20, temperature, 42, /*candidates=*/7};
    auto few = Generate(g, {1, 2, 3}, bytes);
    ASSERT_TRUE(few.ok());
    for (size_t i = 3; i < few->size(); ++i) EXPECT_LT((*few)[i], 7) << temperature;
  }
  EXPECT_EQ(Generate(g, {}, greedy).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Generate(g, {100}, greedy).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardtrain::engine::cpu
