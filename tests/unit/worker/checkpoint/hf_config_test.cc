// A model from a Hugging Face config.json (worker/checkpoint/hf_config.h):
// the fields our own exports' config.json give, read back through the job
// spec, are the exported model (GPT-2, Llama, Llama with rope_scaling);
// configs describing a model shardtrain does not compute are refused naming
// the field; and which specs take their model from model.init
// (ModelShapeFromInit).
#include "worker/checkpoint/hf_config.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/job_spec.h"
#include "worker/checkpoint/hf_gpt2.h"
#include "worker/checkpoint/hf_llama.h"

namespace shardtrain::checkpoint {
namespace {

constexpr char kSpec[] = R"(
name: from-init
model: {init: some/dir}
data: {train: data/fortunes.txt}
batch: {global: 8, micro: 8, seq_len: 16}
steps: 1
)";

// The spec kSpec with config.json's fields as overrides, parsed.
absl::StatusOr<model::ModelConfig> ThroughTheSpec(const std::string& json) {
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> fields =
      ModelFieldsFromHfConfig(json);
  if (!fields.ok()) return fields.status();
  std::vector<std::string> sets;
  for (const auto& [key, value] : *fields) sets.push_back(absl::StrCat("model.", key, "=", value));
  absl::StatusOr<JobSpec> spec = ParseJobSpec(kSpec, sets);
  if (!spec.ok()) return spec.status();
  return spec->model.Config();
}

TEST(HfConfigTest, OurExportsConfigIsTheModelBackThroughTheSpec) {
  const model::ModelConfig gpt = *model::MakeGptConfig(2, 4, 32, 64, 300);
  absl::StatusOr<model::ModelConfig> back = ThroughTheSpec(HfGpt2ConfigJson(gpt));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, gpt) << ToString(*back);
  for (const char* preset : {"llama-tiny", "llama3-1b", "llama3-8b", "qwen3-0.6b"}) {
    SCOPED_TRACE(preset);
    const model::ModelConfig llama = *model::ModelPreset(preset);
    back = ThroughTheSpec(HfLlamaConfigJson(llama, DataType::kBFloat16));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, llama) << ToString(*back);
  }
  EXPECT_TRUE(model::ModelPreset("llama3-1b")->rope_scaling.on());
  EXPECT_NE(HfLlamaConfigJson(*model::ModelPreset("qwen3-0.6b"), DataType::kBFloat16)
                .find("\"Qwen3ForCausalLM\""),
            std::string::npos);
}

// Llama 3.2 1B's published config.json (its fields that shape the model).
constexpr char kLlama32[] = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
  "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
  "num_key_value_heads": 8, "head_dim": 64, "max_position_embeddings": 131072,
  "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": true,
  "vocab_size": 128256, "hidden_act": "silu", "attention_bias": false, "mlp_bias": false,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"}
})";

TEST(HfConfigTest, Llama32sConfigIsThePresetAtItsFullContext) {
  absl::StatusOr<model::ModelConfig> c = ThroughTheSpec(kLlama32);
  ASSERT_TRUE(c.ok()) << c.status();
  model::ModelConfig preset = *model::ModelPreset("llama3-1b");
  EXPECT_EQ(c->context, 131072);
  preset.context = 131072;
  EXPECT_EQ(*c, preset) << ToString(*c);
  // And it passes the reader's own check of the same file.
  EXPECT_TRUE(CheckHfLlamaConfig(kLlama32, *c).ok()) << CheckHfLlamaConfig(kLlama32, *c);
}

TEST(HfConfigTest, WhatIsNotComputedHereIsRefusedNamingTheField) {
  nlohmann::json j = nlohmann::json::parse(kLlama32);
  auto message = [&] { return std::string(ModelFieldsFromHfConfig(j.dump()).status().message()); };
  j["architectures"] = {"DeepseekV3ForCausalLM"};
  EXPECT_NE(message().find("config.json: architectures DeepseekV3ForCausalLM"), std::string::npos)
      << message();
  // A Qwen3-MoE config without its experts' fields names the missing one.
  j["architectures"] = {"Qwen3MoeForCausalLM"};
  EXPECT_NE(message().find("config.json: num_experts missing (it gives model.moe.experts)"),
            std::string::npos)
      << message();
  j["num_experts"] = 8;
  j["num_experts_per_tok"] = 2;
  j["moe_intermediate_size"] = 64;
  j["mlp_only_layers"] = {1};
  EXPECT_NE(message().find("config.json: mlp_only_layers [1]: the dense layers must be the "
                           "leading ones"),
            std::string::npos)
      << message();
  j.erase("mlp_only_layers");
  j["architectures"] = {"LlamaForCausalLM"};
  j["head_dim"] = "128";
  EXPECT_NE(message().find("config.json: head_dim \"128\" is not a positive integer"),
            std::string::npos)
      << message();
  j["head_dim"] = 64;
  j["rope_scaling"]["rope_type"] = "yarn";
  EXPECT_NE(message().find("rope_type yarn is not implemented"), std::string::npos) << message();
  j["rope_scaling"] = nullptr;
  j.erase("num_hidden_layers");
  EXPECT_NE(message().find("config.json: num_hidden_layers missing (it gives model.layers)"),
            std::string::npos)
      << message();
  j["num_hidden_layers"] = "16";
  EXPECT_NE(message().find("num_hidden_layers is not an integer"), std::string::npos) << message();
  EXPECT_NE(
      std::string(ModelFieldsFromHfConfig("[1, 2]").status().message()).find("not a JSON object"),
      std::string::npos);
}

// router_aux_loss_coef gives router.aux_loss_coef scaled to our per-layer
// loss: × top_k (Hugging Face's loss counts each token's K choices) and
// / MoE layers (it adds one loss over all of them); dense models give none.
TEST(HfConfigTest, AnMoeCheckpointsAuxLossCoefficientIsOursPerLayer) {
  nlohmann::json j = nlohmann::json::parse(kLlama32);
  EXPECT_EQ(*HfRouterAuxLossCoef(j.dump()), std::nullopt);  // dense
  j["architectures"] = {"Qwen3MoeForCausalLM"};
  j["num_hidden_layers"] = 6;
  j["num_experts"] = 8;
  j["num_experts_per_tok"] = 2;
  j["moe_intermediate_size"] = 64;
  j["mlp_only_layers"] = {0, 1};
  EXPECT_EQ(*HfRouterAuxLossCoef(j.dump()), std::nullopt);  // no coefficient
  j["router_aux_loss_coef"] = 0.001;
  EXPECT_EQ(*HfRouterAuxLossCoef(j.dump()), "0.0005");  // 0.001 · 2 / 4
  j["architectures"] = {"MixtralForCausalLM"};
  j["num_local_experts"] = 8;
  j["router_aux_loss_coef"] = 0.02;
  j.erase("mlp_only_layers");
  EXPECT_EQ(*HfRouterAuxLossCoef(j.dump()), "0.006666666666666667");
  j["router_aux_loss_coef"] = -1;
  EXPECT_NE(std::string(HfRouterAuxLossCoef(j.dump()).status().message())
                .find("config.json: router_aux_loss_coef -1 is not a number >= 0"),
            std::string::npos);
}

TEST(HfConfigTest, OnlyASpecNamingJustInitTakesItsModelFromIt) {
  absl::StatusOr<ModelFromInit> from = ModelShapeFromInit(kSpec);
  ASSERT_TRUE(from.ok()) << from.status();
  EXPECT_EQ(from->init, "some/dir");
  EXPECT_TRUE(from->shape_from_init);
  EXPECT_FALSE(from->aux_loss_coef_set);
  EXPECT_EQ(from->keys_set, std::vector<std::string>{"init"});
  // Fields it also sets are kept (and listed); a preset or layers means the
  // spec describes its model itself.
  from = ModelShapeFromInit(kSpec, {"model.recompute=full", "model.context=2048"});
  ASSERT_TRUE(from.ok()) << from.status();
  EXPECT_EQ(from->init, "some/dir");
  EXPECT_EQ(from->keys_set, (std::vector<std::string>{"init", "recompute", "context"}));
  for (const char* set : {"model.preset=llama3-1b", "model.layers=2"}) {
    from = ModelShapeFromInit(kSpec, {set, "router.aux_loss_coef=0"});
    ASSERT_TRUE(from.ok()) << from.status();
    EXPECT_EQ(from->init, "some/dir") << set;
    EXPECT_FALSE(from->shape_from_init) << set;
    EXPECT_TRUE(from->aux_loss_coef_set) << set;
  }
  from = ModelShapeFromInit("name: x\nmodel: {layers: 2}\n");
  ASSERT_TRUE(from.ok());
  EXPECT_EQ(from->init, "");
  EXPECT_FALSE(from->shape_from_init);
  // Without the CLI's fields the spec names what is missing and the way out.
  absl::StatusOr<JobSpec> bare = ParseJobSpec(kSpec);
  ASSERT_FALSE(bare.ok());
  EXPECT_NE(bare.status().message().find("model.init"), std::string::npos) << bare.status();
  EXPECT_EQ(HfConfigPathOf("/nonexistent/model.safetensors"), "/nonexistent/config.json");
}

}  // namespace
}  // namespace shardtrain::checkpoint
