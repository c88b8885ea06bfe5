// The final weights file: round trip, and refusals of wrong sizes, missing,
// corrupt, truncated and foreign files.
#include "worker/checkpoint/weights_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/model/config.h"
#include "common/model/param_layout.h"
#include "common/planner.h"

namespace shardtrain::checkpoint {
namespace {
namespace fs = std::filesystem;

model::ModelConfig Tiny() { return *model::MakeGptConfig(2, 4, 32, 16, 100); }

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
  const model::ModelConfig cfg = Tiny();
  std::vector<float> params(model::ParamLayout(cfg).num_params());
  for (size_t i = 0; i < params.size(); ++i) params[i] = 0.001f * float(i % 997) - 0.5f;
  const std::string path = (dir_ / "w.bin").string();
  ASSERT_TRUE(SaveWeights(path, cfg, absl::MakeConstSpan(params)).ok());
  EXPECT_FALSE(fs::exists(path + ".tmp." + std::to_string(::getpid())));
  // The planner's size of it (`shardtrain plan`, the free-space warning).
  EXPECT_EQ(int64_t(fs::file_size(path)),
            WeightsFileBytes(int64_t(params.size()), model::ModelConfig{}));
  auto w = LoadWeights(path);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->config, cfg);
  EXPECT_TRUE(std::equal(w->params.begin(), w->params.end(), params.begin()));

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

// A Llama model's file (version 2, its recipe after the header) reads back
// with its config; a GPT-2 file is still version 1.
TEST_F(WeightsFileTest, LlamaRecipeRoundTripsAndGpt2StaysVersion1) {
  // layers, heads, kv_heads, dim, ffn_dim, context, vocab, rope_theta, norm_eps, tied
  const model::ModelConfig llama =
      *model::MakeLlamaConfig({2, 4, 1, 32, 48, 16, 100, 10000, 1e-6, true});
  std::vector<float> params(model::ParamLayout(llama).num_params(), 0.25f);
  const std::string path = (dir_ / "llama.bin").string();
  ASSERT_TRUE(SaveWeights(path, llama, absl::MakeConstSpan(params)).ok());
  auto w = LoadWeights(path);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->config, llama);
  EXPECT_EQ(w->params, params);
  auto version = [](const std::string& p) {
    uint32_t v = 0;
    std::ifstream in(p, std::ios::binary);
    in.seekg(8);
    in.read(reinterpret_cast<char*>(&v), sizeof v);
    return v;
  };
  EXPECT_EQ(version(path), 2u);
  EXPECT_EQ(int64_t(fs::file_size(path)), WeightsFileBytes(int64_t(params.size()), llama));
  const std::string gpt2 = (dir_ / "gpt2.bin").string();
  std::vector<float> g(model::ParamLayout(Tiny()).num_params(), 0.5f);
  ASSERT_TRUE(SaveWeights(gpt2, Tiny(), absl::MakeConstSpan(g)).ok());
  EXPECT_EQ(version(gpt2), 1u);
  // With rope_scaling: version 3, its record after the recipe.
  const model::ModelConfig scaled =
      *model::MakeLlamaConfig({2, 4, 1, 32, 48, 16, 100, 10000, 1e-6, true, {8, 1.5, 4, 12}});
  const std::string scaled_path = (dir_ / "scaled.bin").string();
  ASSERT_TRUE(SaveWeights(scaled_path, scaled, absl::MakeConstSpan(params)).ok());
  EXPECT_EQ(version(scaled_path), 3u);
  EXPECT_EQ(int64_t(fs::file_size(scaled_path)), WeightsFileBytes(int64_t(params.size()), scaled));
  w = LoadWeights(scaled_path);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->config, scaled);
  EXPECT_EQ(w->params, params);
  // With MoE layers, of either family: version 4, its record after the
  // extension.
  model::ModelConfig gpt_moe = Tiny();
  gpt_moe.moe = {4, 2, 16, 1, model::RouterScoring::kSigmoid, false, 1};
  model::ModelConfig llama_moe = *model::ModelPreset("moe-tiny");
  for (const model::ModelConfig& c : {gpt_moe, llama_moe}) {
    ASSERT_TRUE(model::ValidateModelConfig(c).ok());
    const std::string moe_path = (dir_ / "moe.bin").string();
    std::vector<float> p(model::ParamLayout(c).num_params(), 0.25f);
    ASSERT_TRUE(SaveWeights(moe_path, c, absl::MakeConstSpan(p)).ok());
    EXPECT_EQ(version(moe_path), 4u);
    EXPECT_EQ(int64_t(fs::file_size(moe_path)), WeightsFileBytes(int64_t(p.size()), c));
    w = LoadWeights(moe_path);
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ(w->config, c) << model::ToString(w->config);
    EXPECT_EQ(w->params, p);
  }
}

}  // namespace
}  // namespace shardtrain::checkpoint
