// Llama 3's rope_scaling (common/model/config.h): the frequencies of
// transformers' _compute_llama3_parameters, computed by hand here for Llama
// 3.2 1B's settings; validation naming the field; the spec's
// model.rope_scaling (read, refused, written back); the presets.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "common/job_spec.h"
#include "common/model/config.h"

namespace shardtrain::model {
namespace {

TEST(RopeScalingTest, FrequenciesFollowLlama3sThreeBands) {
  const ModelConfig c = *ModelPreset("llama3-1b");  // hs 64, θ 500000, factor 32, 1, 4, 8192
  ASSERT_TRUE(c.rope_scaling.on());
  const std::vector<double> f = RotaryFrequencies(c);
  ASSERT_EQ(f.size(), 32u);
  constexpr double kPi = 3.14159265358979323846;
  int kept = 0, divided = 0, blended = 0;
  for (int i = 0; i < 32; ++i) {
    const double base = 1.0f / static_cast<float>(std::pow(500000.0, 2.0 * i / 64));
    const double wavelen = 2 * kPi / base;
    if (wavelen < 8192.0 / 4) {  // high frequencies
      EXPECT_EQ(f[i], base) << i;
      ++kept;
    } else if (wavelen > 8192.0 / 1) {  // low frequencies
      EXPECT_DOUBLE_EQ(f[i], base / 32) << i;
      ++divided;
    } else {
      const double s = (8192.0 / wavelen - 1) / (4 - 1);
      EXPECT_DOUBLE_EQ(f[i], (1 - s) * base / 32 + s * base) << i;
      EXPECT_LT(f[i], base);
      EXPECT_GT(f[i], base / 32);
      ++blended;
    }
  }
  // Llama 3's 32 frequencies: each band holds some.
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(blended, 0);
  std::printf("[rope] llama3-1b: %d kept, %d blended, %d divided by 32\n", kept, blended, divided);
  // The table rotates by them: position p's angle for frequency i.
  const std::vector<float> table = RotaryTable(c);
  const int p = 4000, i = 31;
  EXPECT_EQ(table[(size_t(p) * 32 + i) * 2], static_cast<float>(std::cos(p * f[i])));
  EXPECT_EQ(table[(size_t(p) * 32 + i) * 2 + 1], static_cast<float>(std::sin(p * f[i])));
  // Off: the plain frequencies.
  ModelConfig plain = c;
  plain.rope_scaling = {};
  EXPECT_EQ(RotaryFrequencies(plain)[31], 1.0f / static_cast<float>(std::pow(500000.0, 62.0 / 64)));
  EXPECT_NE(RotaryTable(plain), table);
}

TEST(RopeScalingTest, PresetsCarryTheirCheckpointsScaling) {
  EXPECT_EQ(ModelPreset("llama3-1b")->rope_scaling, (RopeScaling{32, 1, 4, 8192}));
  EXPECT_EQ(ModelPreset("llama3-8b")->rope_scaling, (RopeScaling{8, 1, 4, 8192}));
  EXPECT_FALSE(ModelPreset("llama-tiny")->rope_scaling.on());
  EXPECT_NE(ToString(*ModelPreset("llama3-8b")).find("rope_scaling llama3 (factor 8"),
            std::string::npos);
}

TEST(RopeScalingTest, ValidationNamesTheField) {
  auto message = [](RopeScaling r) {
    LlamaShape s{2, 4, 2, 32, 64, 16, 256};
    s.rope_scaling = r;
    return std::string(MakeLlamaConfig(s).status().message());
  };
  EXPECT_EQ(message({8, 1, 4, 128}), "");
  EXPECT_NE(message({-1, 1, 4, 128}).find("model.rope_scaling.factor: must be"), std::string::npos);
  EXPECT_NE(message({0, 1, 4, 128}).find("model.rope_scaling.factor"), std::string::npos);
  EXPECT_NE(message({8, 0, 4, 128}).find("model.rope_scaling.low_freq_factor"), std::string::npos);
  EXPECT_NE(message({8, 4, 4, 128})
                .find("model.rope_scaling.high_freq_factor: 4 must be greater "
                      "than low_freq_factor 4"),
            std::string::npos);
  EXPECT_NE(message({8, 1, 4, 0}).find("model.rope_scaling.original_max_position_embeddings"),
            std::string::npos);
  ModelConfig gpt = *MakeGptConfig(2, 4, 32, 16, 256);
  gpt.rope_scaling = {8, 1, 4, 128};
  EXPECT_NE(std::string(ValidateModelConfig(gpt).message()).find("only for rotary positions"),
            std::string::npos);
}

std::string Spec(const std::string& model) {
  return "name: r\nmodel: " + model +
         "\ndata: {train: data/fortunes.txt}\nbatch: {global: 8, micro: 8, seq_len: 16}\n"
         "steps: 1\n";
}

TEST(RopeScalingTest, TheSpecReadsRefusesAndWritesIt) {
  const std::string llama = "arch: llama, layers: 2, heads: 4, dim: 32, context: 16, vocab: 256";
  absl::StatusOr<JobSpec> s = ParseJobSpec(
      Spec("{" + llama +
           ", rope_scaling: {type: llama3, factor: 8, low_freq_factor: 1, high_freq_factor: 4, "
           "original_max_position_embeddings: 128}}"));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->model.rope_scaling, (RopeScaling{8, 1, 4, 128}));
  EXPECT_EQ(s->model.Config()->rope_scaling, (RopeScaling{8, 1, 4, 128}));
  absl::StatusOr<JobSpec> again = ParseJobSpec(JobSpecToYaml(*s));
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << JobSpecToYaml(*s);
  EXPECT_TRUE(*again == *s);
  // Hugging Face's key rope_type reads too; a preset's scaling goes with none.
  s = ParseJobSpec(Spec("{" + llama +
                        ", rope_scaling: {rope_type: llama3, factor: 2, low_freq_factor: 1, "
                        "high_freq_factor: 2, original_max_position_embeddings: 8}}"));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->model.rope_scaling.factor, 2);
  s = ParseJobSpec(Spec("{preset: llama3-1b, layers: 2, rope_scaling: none}"));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE(s->model.rope_scaling.on());
  again = ParseJobSpec(JobSpecToYaml(*s));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(*again == *s);
  s = ParseJobSpec(Spec("{preset: llama3-1b}"), {"model.rope_scaling={type: llama3, factor: 16, "
                                                 "low_freq_factor: 1, high_freq_factor: 4, "
                                                 "original_max_position_embeddings: 8192}"});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->model.rope_scaling.factor, 16);

  // Qwen3's fields: read and written back.
  s = ParseJobSpec(Spec("{" + llama + ", head_dim: 16, qk_norm: true}"));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->model.Config()->q_dim(), 64);
  again = ParseJobSpec(JobSpecToYaml(*s));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(*again == *s);

  struct Bad {
    std::string model, want;
  };
  const Bad cases[] = {
      {"{" + llama + ", rope_scaling: {type: yarn, factor: 4}}",
       "model.rope_scaling.type: \"yarn\": only llama3"},
      {"{" + llama + ", rope_scaling: {factor: 4}}", "model.rope_scaling.type: missing"},
      {"{" + llama + ", rope_scaling: {type: llama3, factor: 4}}",
       "model.rope_scaling.low_freq_factor"},
      {"{" + llama +
           ", rope_scaling: {type: llama3, factor: 4, low_freq_factor: 1, "
           "high_freq_factor: 4, original_max_position_embeddings: 8, extra: 1}}",
       "model.rope_scaling.extra"},
      {"{" + llama +
           ", rope_scaling: {type: llama3, factor: 4, low_freq_factor: 4, "
           "high_freq_factor: 1, original_max_position_embeddings: 8}}",
       "model.rope_scaling.high_freq_factor: 1 must be greater than low_freq_factor 4"},
      {"{" + llama + ", rope_scaling: 4}", "model.rope_scaling: expected none or a map"},
      {"{layers: 2, heads: 4, dim: 32, context: 16, vocab: 256, rope_scaling: none}",
       "model.rope_scaling: only for model.arch: llama"},
      {"{layers: 2, heads: 4, dim: 32, context: 16, vocab: 256, qk_norm: true}",
       "model.qk_norm: only for model.arch: llama"},
      {"{" + llama + ", head_dim: 7}", "model.head_dim: rotary positions need an even head size"},
      {"{" + llama + ", head_dim: 0}", "model.head_dim: must be >= 1"},
  };
  for (const Bad& b : cases) {
    absl::StatusOr<JobSpec> bad = ParseJobSpec(Spec(b.model));
    ASSERT_FALSE(bad.ok()) << b.model;
    EXPECT_NE(bad.status().message().find(b.want), std::string::npos)
        << b.model << "\n  got: " << bad.status().message() << "\n  want: " << b.want;
  }
}

}  // namespace
}  // namespace shardtrain::model
