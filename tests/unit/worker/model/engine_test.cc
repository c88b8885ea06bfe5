// Layout, init, optimizer helpers, weights file, generation and gradient
// accumulation of the CPU engine.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

#include "worker/model/generate.h"
#include "worker/model/gpt.h"
#include "worker/model/weights_file.h"
#include "worker/optim/adamw.h"

namespace shardtrain::model {
namespace {
namespace fs = std::filesystem;

GptConfig Tiny(int vocab = 100) {
  auto c = MakeGptConfig(2, 4, 32, 16, vocab);
  EXPECT_TRUE(c.ok());
  return *c;
}

TEST(ConfigTest, PaddedVocabAndPresets) {
  EXPECT_EQ(PaddedVocab(50257), 50304);
  EXPECT_EQ(PaddedVocab(256), 256);
  EXPECT_EQ(PaddedVocab(100), 128);
  EXPECT_EQ(PaddedVocab(300), 384);
  auto p = GptPreset("gpt2-124m");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->layers, 12);
  EXPECT_EQ(p->padded_vocab, 50304);
  // llm.c's parameter count for GPT-2 124M with the padded vocab.
  EXPECT_EQ(ParamLayout(*p).num_params(), 124475904u);
  EXPECT_EQ(GptPreset("gpt9").status().code(), absl::StatusCode::kNotFound);
  auto bad = MakeGptConfig(2, 3, 32, 16, 100);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("model.heads"), std::string::npos);
}

TEST(ParamLayoutTest, UnitsAreContiguousAndDecayOnlyOn2D) {
  const ParamLayout layout(Tiny());
  const auto& units = layout.units();
  ASSERT_EQ(units.size(), 4u);  // embeddings, block.0, block.1, final
  EXPECT_EQ(units[0].name, "embeddings");
  EXPECT_EQ(units[1].name, "block.0");
  EXPECT_EQ(units[3].name, "final");
  size_t next = 0;
  for (const UnitInfo& u : units) {
    EXPECT_EQ(u.offset, next) << u.name;
    size_t t_next = u.offset;
    for (int i = u.first_tensor; i < u.first_tensor + u.num_tensors; ++i) {
      const TensorInfo& t = layout.tensors()[i];
      EXPECT_EQ(t.offset, t_next) << t.name;
      EXPECT_EQ(&layout.units()[t.unit], &u);
      t_next += t.numel;
    }
    next = u.offset + u.numel;
    EXPECT_EQ(t_next, next);
  }
  EXPECT_EQ(next, layout.num_params());
  for (const TensorInfo& t : layout.tensors()) {
    EXPECT_EQ(t.decay, t.shape.size() == 2) << t.name;
  }
  EXPECT_TRUE(layout.tensors()[layout.wte()].decay);
  EXPECT_FALSE(layout.tensors()[layout.block_tensor(1, kQkvB)].decay);
  EXPECT_EQ(layout.tensors()[layout.block_tensor(1, kFcProjW)].name, "block.1.mlp.proj.weight");
  EXPECT_EQ(*layout.FindTensor("lnf.bias"), layout.lnf_b());
}

TEST(GptTest, InitIsDeterministicWithGpt2Statistics) {
  auto cfg = MakeGptConfig(4, 4, 128, 64, 256);
  auto a = Gpt::Create(*cfg, 1, 8, 2);
  auto b = Gpt::Create(*cfg, 1, 8, 1);
  ASSERT_TRUE(a.ok() && b.ok());
  (*a)->InitParams(7);
  (*b)->InitParams(7);
  ASSERT_TRUE(std::equal((*a)->params().begin(), (*a)->params().end(), (*b)->params().begin()))
      << "init depends on the thread count";
  const ParamLayout& layout = (*a)->layout();
  auto stddev = [&](int tensor) {
    const TensorInfo& t = layout.tensors()[tensor];
    double s = 0, s2 = 0;
    for (size_t i = 0; i < t.numel; ++i) {
      const double x = (*a)->params()[t.offset + i];
      s += x;
      s2 += x * x;
    }
    return std::sqrt(s2 / t.numel - (s / t.numel) * (s / t.numel));
  };
  EXPECT_NEAR(stddev(layout.wte()), 0.02, 0.001);
  EXPECT_NEAR(stddev(layout.block_tensor(0, kFcW)), 0.02, 0.001);
  EXPECT_NEAR(stddev(layout.block_tensor(0, kFcProjW)), 0.02 / std::sqrt(8.0), 0.0005);
  EXPECT_EQ((*a)->params()[layout.offset(layout.block_tensor(0, kLn1W))], 1.0f);
  EXPECT_EQ((*a)->params()[layout.offset(layout.block_tensor(0, kQkvB))], 0.0f);
  (*b)->InitParams(8);
  EXPECT_NE((*a)->params()[5], (*b)->params()[5]);
}

TEST(GptTest, CreateValidates) {
  EXPECT_EQ(Gpt::Create(Tiny(), 0, 8, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Gpt::Create(Tiny(), 1, 17, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Gpt::Create(Tiny(), 1, 8, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GptDeathTest, ForwardAbortsOnOutOfRangeInput) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto m = Gpt::Create(Tiny(), 1, 4, 1);
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
  auto m = Gpt::Create(Tiny(), 4, 8, 2);
  ASSERT_TRUE(m.ok());
  Gpt& g = **m;
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
  std::vector<float> full(g.grads().begin(), g.grads().end());
  g.ZeroGrad();
  const float l0 = g.Forward(tok.data(), tgt.data(), 2, 8);
  g.Backward(0.5f);
  const float l1 = g.Forward(tok.data() + 16, tgt.data() + 16, 2, 8);
  g.Backward(0.5f);
  EXPECT_NEAR((l0 + l1) / 2, full_loss, 1e-5);
  double diff = 0, scale = 0;
  for (size_t i = 0; i < full.size(); ++i) {
    diff = std::max(diff, double(std::abs(full[i] - g.grads()[i])));
    scale = std::max(scale, double(std::abs(full[i])));
  }
  std::printf("[accumulation] max rel diff %.3e\n", diff / scale);
  EXPECT_LT(diff / scale, 1e-5);
}

TEST(OptimTest, LearningRateSchedule) {
  EXPECT_FLOAT_EQ(optim::LearningRate(0, 1.0f, 0.1f, 10, 100), 0.1f);
  EXPECT_FLOAT_EQ(optim::LearningRate(9, 1.0f, 0.1f, 10, 100), 1.0f);
  EXPECT_FLOAT_EQ(optim::LearningRate(10, 1.0f, 0.1f, 10, 100), 1.0f);
  EXPECT_NEAR(optim::LearningRate(55, 1.0f, 0.1f, 10, 100), 0.55f, 1e-6);
  EXPECT_FLOAT_EQ(optim::LearningRate(100, 1.0f, 0.1f, 10, 100), 0.1f);
  EXPECT_FLOAT_EQ(optim::LearningRate(1000, 1.0f, 0.1f, 10, 100), 0.1f);
}

TEST(OptimTest, ClipGradNorm) {
  ThreadPool pool(2);
  std::vector<float> g(200000, 0.0f);
  g[0] = 3;
  g[199999] = 4;
  EXPECT_FLOAT_EQ(optim::ClipGradNorm(absl::MakeSpan(g), 10.0f, &pool), 5.0f);
  EXPECT_EQ(g[0], 3.0f);  // below max: untouched
  EXPECT_FLOAT_EQ(optim::ClipGradNorm(absl::MakeSpan(g), 1.0f, &pool), 5.0f);
  EXPECT_NEAR(g[0], 0.6f, 1e-6);
  EXPECT_NEAR(g[199999], 0.8f, 1e-6);
}

class WeightsFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("shardtrain_weights_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  fs::path dir_;
};

TEST_F(WeightsFileTest, RoundTripAndErrors) {
  const GptConfig cfg = Tiny();
  auto m = Gpt::Create(cfg, 1, 8, 1);
  (*m)->InitParams(11);
  const std::string path = (dir_ / "w.bin").string();
  ASSERT_TRUE(SaveWeights(path, cfg, (*m)->params()).ok());
  EXPECT_FALSE(fs::exists(path + ".tmp." + std::to_string(::getpid())));
  auto w = LoadWeights(path);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->config, cfg);
  EXPECT_TRUE(std::equal(w->params.begin(), w->params.end(), (*m)->params().begin()));

  EXPECT_EQ(SaveWeights(path, cfg, absl::MakeConstSpan(w->params.data(), 10)).code(),
            absl::StatusCode::kInvalidArgument);
  auto missing = LoadWeights((dir_ / "none.bin").string());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("none.bin"), std::string::npos);
  // Corrupt one parameter byte: checksum.
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    f.put('\x7f');
  }
  auto corrupt = LoadWeights(path);
  EXPECT_EQ(corrupt.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(corrupt.status().message().find("checksum"), std::string::npos);
  // Truncate.
  fs::resize_file(path, 100);
  EXPECT_EQ(LoadWeights(path).status().code(), absl::StatusCode::kDataLoss);
  std::ofstream(path) << std::string(4096, 'x');  // long enough for a header
  auto magic = LoadWeights(path);
  EXPECT_EQ(magic.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(magic.status().message().find("magic"), std::string::npos);
}

TEST(GenerateTest, GreedyAndSeededSampling) {
  auto m = Gpt::Create(Tiny(), 1, 16, 2);
  (*m)->InitParams(5);
  Gpt& g = **m;
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
  EXPECT_EQ(Generate(g, {}, greedy).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Generate(g, {100}, greedy).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardtrain::model
