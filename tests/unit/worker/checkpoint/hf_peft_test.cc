// LoRA adapters out to Hugging Face PEFT's format (worker/checkpoint/
// hf_peft.h): the adapter_config.json and tensor names PEFT loads, and —
// with Debian's torch (skipped without it) — a plain-PyTorch
// implementation of PEFT's LoRA forward (peft_lora_logits.py) on our
// exported base model and adapter gives the CPU engine's adapted logits.
#include "worker/checkpoint/hf_peft.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "common/model/param_layout.h"
#include "common/process.h"
#include "worker/checkpoint/hf_llama.h"
#include "worker/checkpoint/safetensors.h"
#include "worker/engine/cpu/cpu_model.h"

namespace shardtrain::checkpoint {
namespace {

namespace fs = std::filesystem;

class HfPeftTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("shardtrain_peft_" + std::to_string(::getpid()))).string();
    fs::create_directories(dir_ + "/base");
    fs::create_directories(dir_ + "/adapter");
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string dir_;
};

// Llama with GQA and rank-4 adapters on every projection.
model::ModelConfig Adapted() {
  model::ModelConfig c = *model::MakeLlamaConfig({2, 4, 2, 32, 48, 16, 256, 1e4, 1e-5, false});
  c.lora = {4, 8.0, (1u << model::kNumLoraTargets) - 1};
  return c;
}

// The engine with its frozen model from seed 3 and adapters whose B is not
// zero (a trained adapter's).
std::unique_ptr<engine::cpu::CpuModel> AdaptedEngine(const model::ModelConfig& c, int B, int T) {
  auto m = engine::cpu::CpuModel::Create(c, B, T, /*threads=*/2);
  EXPECT_TRUE(m.ok()) << m.status();
  (*m)->InitParams(3);
  std::vector<float> frozen((*m)->frozen_layout().num_params());
  (*m)->InitFrozenInto(3, 0, frozen.size(), frozen.data());
  (*m)->SetFrozen(frozen.data());
  std::mt19937 rng(9);
  std::normal_distribution<float> d(0.0f, 0.05f);
  for (const model::TensorInfo& t : model::TrainedTensors((*m)->layout())) {
    if (t.name.back() != 'B') continue;
    for (size_t i = 0; i < t.numel; ++i) (*m)->params().f32()[t.offset + i] = d(rng);
  }
  return *std::move(m);
}

TEST_F(HfPeftTest, WritesPeftsConfigAndTensorNames) {
  const model::ModelConfig c = Adapted();
  auto m = AdaptedEngine(c, 1, 4);
  ASSERT_TRUE(
      ExportPeftAdapter(c, (*m).params().f32(), dir_ + "/adapter", DataType::kFloat32).ok());
  std::string text;
  ASSERT_TRUE(ReadFile(dir_ + "/adapter/adapter_config.json", &text).ok());
  const nlohmann::json j = nlohmann::json::parse(text);
  EXPECT_EQ(j["peft_type"], "LORA");
  EXPECT_EQ(j["r"], 4);
  EXPECT_EQ(j["lora_alpha"], 8);
  EXPECT_EQ(j["target_modules"], nlohmann::json({"q_proj", "k_proj", "v_proj", "o_proj",
                                                 "gate_proj", "up_proj", "down_proj"}));
  absl::StatusOr<std::unique_ptr<SafetensorsSet>> set =
      SafetensorsSet::Open(dir_ + "/adapter/adapter_model.safetensors");
  ASSERT_TRUE(set.ok()) << set.status();
  const std::vector<std::string> names = (*set)->Names();
  EXPECT_EQ(names.size(), 2u * 7 * 2);
  const std::string k = "base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight";
  EXPECT_NE(std::find(names.begin(), names.end(), k), names.end()) << k;
  // A GPT-2 model and a model without adapters are refused.
  model::ModelConfig gpt2 = *model::MakeGptConfig(1, 2, 16, 8, 256);
  gpt2.lora = {2, 2.0, 1u};
  EXPECT_EQ(ExportPeftAdapter(gpt2, {}, dir_, DataType::kFloat32).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ExportPeftAdapter(model::BaseConfig(c), {}, dir_, DataType::kFloat32).code(),
            absl::StatusCode::kInvalidArgument);
}

std::string Python() {
  const char* env = std::getenv("SHARDTRAIN_PYTHON");
  return env != nullptr && *env != '\0' ? env : "/usr/bin/python3";
}

TEST_F(HfPeftTest, PeftsLoraForwardOnTheExportsGivesTheEnginesLogits) {
  if (std::system((Python() + " -c 'import torch' >/dev/null 2>&1").c_str()) != 0) {
    GTEST_SKIP() << Python() << " cannot import torch (scripts/setup installs python3-torch)";
  }
  const std::string script = SHARDTRAIN_PEFT_LORA_LOGITS_SCRIPT;
  if (!fs::exists(script)) GTEST_SKIP() << "no " << script;
  constexpr int B = 2, T = 12;
  const model::ModelConfig c = Adapted();
  auto m = AdaptedEngine(c, B, T);
  // The base model as `shardtrain export` writes it, the adapter as
  // `export --adapter` does.
  std::vector<float> frozen(m->frozen_layout().num_params());
  m->GetFrozen(frozen.data());
  ASSERT_TRUE(ExportHfLlama(model::BaseConfig(c), frozen, dir_ + "/base", {}).ok());
  ASSERT_TRUE(ExportPeftAdapter(c, m->params().f32(), dir_ + "/adapter", DataType::kFloat32).ok());
  std::vector<int> tokens(B * T);
  std::mt19937 rng(4);
  for (int& t : tokens) t = int(rng() % 256);
  std::ofstream(dir_ + "/tokens.bin", std::ios::binary)
      .write(reinterpret_cast<const char*>(tokens.data()), sizeof(int) * tokens.size());
  std::ofstream(dir_ + "/shape.txt") << "batch " << B << "\nseq_len " << T << "\n";
  const std::string cmd = Python() + " " + script + " " + dir_;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::vector<float> want(size_t(B) * T * c.vocab), got(want.size()), plain(want.size());
  std::ifstream(dir_ + "/logits.bin", std::ios::binary)
      .read(reinterpret_cast<char*>(want.data()), sizeof(float) * want.size());
  m->Forward(tokens.data(), nullptr);
  for (int r = 0; r < B * T; ++r) m->ReadLogits(r, got.data() + size_t(r) * c.vocab);
  double max_abs = 0, scale = 0, adapted = 0;
  // The base model alone, to show the adapters matter.
  auto base = engine::cpu::CpuModel::Create(model::BaseConfig(c), B, T, 2);
  ASSERT_TRUE(base.ok());
  std::copy(frozen.begin(), frozen.end(), (*base)->params().f32().begin());
  (*base)->Forward(tokens.data(), nullptr);
  for (int r = 0; r < B * T; ++r) (*base)->ReadLogits(r, plain.data() + size_t(r) * c.vocab);
  for (size_t i = 0; i < want.size(); ++i) {
    max_abs = std::max(max_abs, std::abs(double(got[i]) - want[i]));
    scale = std::max(scale, std::abs(double(want[i])));
    adapted = std::max(adapted, std::abs(double(plain[i]) - want[i]));
  }
  std::printf(
      "[peft] logits of %d tokens with rank-%d adapters on 7 projections: max abs diff "
      "%.3g (largest logit %.3g; the adapters move them by up to %.3g)\n",
      B * T, c.lora.rank, max_abs, scale, adapted);
  EXPECT_LE(max_abs, 1e-5 * std::max(1.0, scale));
  EXPECT_GT(adapted, 100 * max_abs);
}

}  // namespace
}  // namespace shardtrain::checkpoint
