// Hugging Face Llama weights in and out (worker/checkpoint/hf_llama.h): an
// export read back by model.init's reader is the same model bit for bit
// (fp32; bf16 rounds each weight), sharded or not, tied or not; a
// checkpoint that disagrees with the spec is refused naming the field or
// tensor; and a Hugging Face checkpoint written by PyTorch (BF16 weights in
// HF's rotate_half order) gives the CPU engine the logits of a
// modeling_llama-style forward (or of transformers' LlamaForCausalLM where
// it is installed).
#include "worker/checkpoint/hf_llama.h"

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

#include "absl/strings/str_cat.h"
#include "common/model/param_layout.h"
#include "common/process.h"
#include "worker/checkpoint/hf_config.h"
#include "worker/checkpoint/model_weights.h"
#include "worker/checkpoint/safetensors.h"
#include "worker/engine/cpu/cpu_model.h"

#ifndef SHARDTRAIN_HF_LLAMA_LOGITS_SCRIPT
#error "SHARDTRAIN_HF_LLAMA_LOGITS_SCRIPT must be defined by CMake"
#endif

namespace shardtrain::checkpoint {
namespace {

namespace fs = std::filesystem;

// layers 2, heads 4, kv_heads 2, dim 32 (hs 8), ffn_dim 48, context 16,
// vocab 100 (padded to 128).
model::ModelConfig Config(bool tied = false) {
  return *model::MakeLlamaConfig({2, 4, 2, 32, 48, 16, 100, 10000, 1e-5, tied});
}

std::vector<float> RandomParams(const model::ModelConfig& c) {
  const model::ParamLayout layout(c);
  std::vector<float> p(layout.num_params());
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  for (float& x : p) x = normal(rng);
  // The padded vocabulary rows are zero, as the engines keep them.
  for (int k : {layout.wte(), layout.lm_head()}) {
    const model::TensorInfo& t = layout.tensors()[k];
    std::fill(p.begin() + t.offset + size_t(c.vocab) * c.dim, p.begin() + t.offset + t.numel, 0.0f);
  }
  return p;
}

class HfLlamaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("shardtrain_hf_llama_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string Dir(const std::string& sub) {
    fs::create_directories(dir_ / sub);
    return (dir_ / sub).string();
  }
  fs::path dir_;
};

TEST_F(HfLlamaTest, ExportThenInitIsTheSameModelShardedOrNotTiedOrNot) {
  for (bool tied : {false, true}) {
    const model::ModelConfig c = Config(tied);
    const std::vector<float> p = RandomParams(c);
    for (int64_t shard : {int64_t{5'000'000'000}, int64_t{20'000}}) {
      SCOPED_TRACE(absl::StrCat(tied ? "tied" : "untied", ", shards of ", shard, " bytes"));
      const std::string out = Dir(absl::StrCat(tied ? "1" : "0", "_", shard));
      HfExportOptions o;
      o.max_shard_bytes = shard;
      ASSERT_TRUE(ExportHfLlama(c, p, out, o).ok());
      const bool sharded = fs::exists(out + "/model.safetensors.index.json");
      EXPECT_EQ(sharded, shard < 1'000'000);
      EXPECT_EQ(fs::exists(out + "/model.safetensors"), !sharded);
      EXPECT_TRUE(fs::exists(out + "/generation_config.json"));
      absl::StatusOr<std::vector<float>> back = LoadModelWeights(out, c);
      ASSERT_TRUE(back.ok()) << back.status();
      EXPECT_EQ(*back, p);  // bit for bit
      // What transformers reads: q/k in rotate_half's order. Our q row 1
      // (pair 0's second channel) is Hugging Face's row hs/2 = 4.
      absl::StatusOr<std::unique_ptr<SafetensorsSet>> set = SafetensorsSet::Open(out);
      ASSERT_TRUE(set.ok()) << set.status();
      std::vector<float> row(32);
      ASSERT_TRUE(
          (*set)->Read("model.layers.1.self_attn.q_proj.weight", 4 * 32, 32, row.data()).ok());
      const model::ParamLayout layout(c);
      const size_t q = layout.offset(layout.block_tensor(1, model::kQkvW));
      EXPECT_TRUE(std::equal(row.begin(), row.end(), p.begin() + q + 1 * 32));
      EXPECT_EQ((*set)->Find("lm_head.weight") != nullptr, !tied);
      ASSERT_NE((*set)->Find("model.embed_tokens.weight"), nullptr);
      EXPECT_EQ((*set)->Find("model.embed_tokens.weight")->shape,
                (std::vector<int64_t>{100, 32}));  // the real vocabulary only
    }
  }
  // bf16: each weight rounded to bf16, the layout's padding still zero.
  const model::ModelConfig c = Config();
  const std::vector<float> p = RandomParams(c);
  const std::string out = Dir("bf16");
  HfExportOptions o;
  o.dtype = DataType::kBFloat16;
  ASSERT_TRUE(ExportHfLlama(c, p, out, o).ok());
  absl::StatusOr<std::vector<float>> back = LoadModelWeights(out, c);
  ASSERT_TRUE(back.ok()) << back.status();
  for (size_t i = 0; i < p.size(); ++i) {
    ASSERT_EQ((*back)[i], BFloat16ToFloat(FloatToBFloat16(p[i]))) << i;
  }
  EXPECT_EQ(fs::file_size(out + "/model.safetensors") <
                fs::file_size(Dir("0_5000000000") + "/model.safetensors"),
            true);
}

TEST_F(HfLlamaTest, ACheckpointThatDisagreesIsRefusedNamingTheFieldOrTensor) {
  const model::ModelConfig c = Config();
  const std::string out = Dir("ok");
  ASSERT_TRUE(ExportHfLlama(c, RandomParams(c), out, {}).ok());
  // Another spec: the field that differs is named.
  model::ModelConfig four = *model::MakeLlamaConfig({2, 4, 4, 32, 48, 16, 100, 10000, 1e-5});
  absl::StatusOr<std::unique_ptr<WeightsSource>> r = OpenModelWeights(out, four);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(
      r.status().message().find("config.json: num_key_value_heads 2, the spec's model.kv_heads 4"),
      std::string::npos)
      << r.status();
  model::ModelConfig theta = *model::MakeLlamaConfig({2, 4, 2, 32, 48, 16, 100, 500000, 1e-5});
  r = OpenModelWeights(out, theta);
  EXPECT_NE(r.status().message().find("rope_theta 10000, the spec's model.rope_theta 500000"),
            std::string::npos)
      << r.status();
  // Fields of a block computed otherwise.
  std::string text;
  ASSERT_TRUE(ReadFile(out + "/config.json", &text).ok());
  nlohmann::json j = nlohmann::json::parse(text);
  // rope_scaling: llama3's must be complete and equal the spec's; other
  // types are refused naming the type.
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 32.0}};
  EXPECT_NE(CheckHfLlamaConfig(j.dump(), c).message().find("low_freq_factor missing"),
            std::string::npos)
      << CheckHfLlamaConfig(j.dump(), c);
  j["rope_scaling"] = {{"rope_type", "llama3"},
                       {"factor", 32.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}};
  EXPECT_NE(CheckHfLlamaConfig(j.dump(), c)
                .message()
                .find("config.json: rope_scaling {type: llama3, factor: 32, low_freq_factor: 1, "
                      "high_freq_factor: 4, original_max_position_embeddings: 8192}, the spec's "
                      "model.rope_scaling none"),
            std::string::npos)
      << CheckHfLlamaConfig(j.dump(), c);
  model::LlamaShape scaled_shape{2, 4, 2, 32, 48, 16, 100, 10000, 1e-5, false, {32, 1, 4, 8192}};
  EXPECT_TRUE(CheckHfLlamaConfig(j.dump(), *model::MakeLlamaConfig(scaled_shape)).ok());
  for (const char* type : {"yarn", "dynamic", "linear"}) {
    j["rope_scaling"] = {{"rope_type", type}, {"factor", 4.0}};
    EXPECT_NE(CheckHfLlamaConfig(j.dump(), c)
                  .message()
                  .find(std::string("rope_type ") + type + " is not implemented"),
              std::string::npos)
        << CheckHfLlamaConfig(j.dump(), c);
  }
  j["rope_scaling"] = {{"rope_type", "default"}};
  EXPECT_TRUE(CheckHfLlamaConfig(j.dump(), c).ok());
  j["rope_scaling"] = nullptr;
  j["architectures"] = {"Qwen2ForCausalLM"};
  EXPECT_NE(CheckHfLlamaConfig(j.dump(), c).message().find("architectures Qwen2ForCausalLM"),
            std::string::npos);
  j["architectures"] = {"MistralForCausalLM"};
  j["sliding_window"] = 8;
  EXPECT_NE(CheckHfLlamaConfig(j.dump(), c).message().find("sliding_window 8"), std::string::npos);
  j["sliding_window"] = nullptr;
  EXPECT_TRUE(CheckHfLlamaConfig(j.dump(), c).ok());
  // A tensor of another shape, and a missing one.
  std::vector<TensorToWrite> tensors;
  std::vector<float> small(4 * 32, 0.0f);
  tensors.push_back({"model.embed_tokens.weight", {4, 32}, small});
  const std::string broken = Dir("broken");
  ASSERT_TRUE(
      WriteSafetensorsFile(broken + "/model.safetensors", tensors, DataType::kFloat32).ok());
  ASSERT_TRUE(
      WriteFileAtomically(broken + "/config.json", HfLlamaConfigJson(c, DataType::kFloat32)).ok());
  r = OpenModelWeights(broken, c);
  EXPECT_NE(r.status().message().find(
                "model.embed_tokens.weight: shape [4, 32] in the file, [100, 32] for the model"),
            std::string::npos)
      << r.status();
  tensors[0] = {"model.embed_tokens.weight", {100, 32}, std::vector<float>(3200, 0.0f)};
  std::vector<float> big(3200, 0.0f);
  tensors[0].data = big;
  ASSERT_TRUE(
      WriteSafetensorsFile(broken + "/model.safetensors", tensors, DataType::kFloat32).ok());
  r = OpenModelWeights(broken, c);
  EXPECT_NE(r.status().message().find("model.layers.0.input_layernorm.weight: missing"),
            std::string::npos)
      << r.status();
  // No config.json.
  fs::remove(broken + "/config.json");
  EXPECT_EQ(OpenModelWeights(broken, c).status().code(), absl::StatusCode::kNotFound);
}

// The Python that runs the reference: $SHARDTRAIN_PYTHON (a GPU machine's,
// with transformers), else Debian's (scripts/setup installs its torch).
std::string Python() {
  const char* env = std::getenv("SHARDTRAIN_PYTHON");
  return env != nullptr && *env != '\0' ? env : "/usr/bin/python3";
}

// The reference script: where the build found it, else under the working
// directory (a copy of the tree elsewhere, as on a GPU machine).
std::string LogitsScript() {
  const std::string built = SHARDTRAIN_HF_LLAMA_LOGITS_SCRIPT;
  if (fs::exists(built)) return built;
  return "tests/unit/worker/checkpoint/hf_llama_logits.py";
}

// What the PyTorch side computed and what the CPU engine computes from the
// checkpoint it wrote into `d`.
struct TorchLogits {
  std::vector<float> want, got;
  std::string reference;
  double max_abs = 0, scale = 0;  // max |got - want|, max |want|
};

TorchLogits RunTorchCheckpoint(const model::ModelConfig& c, const std::string& d, int B, int T) {
  TorchLogits out;
  {
    std::ofstream s(d + "/shape.txt");
    s << "layers " << c.layers << "\nheads " << c.heads << "\nkv_heads " << c.kv_heads << "\ndim "
      << c.dim << "\nffn_dim " << c.ffn_dim << "\nvocab " << c.vocab << "\nrope_theta "
      << c.rope_theta << "\nnorm_eps " << c.norm_eps << "\ntie " << (c.tie_embeddings ? 1 : 0)
      << "\nbatch " << B << "\nseq_len " << T << "\n";
    if (c.head_size > 0) s << "head_dim " << c.head_size << "\n";
    if (c.qk_norm) s << "qk_norm 1\n";
    // Qwen3, Mixtral and Qwen3-MoE as transformers saves a large model:
    // several files and their index.
    if (c.qk_norm || c.moe.on()) s << "shards 3\n";
    if (const model::MoeConfig& m = c.moe; m.on()) {
      s << "experts " << m.experts << "\ntop_k " << m.top_k << "\nexpert_ffn " << m.expert_ffn_dim
        << "\nnorm_topk " << (m.norm_topk_prob ? 1 : 0) << "\nfirst_dense " << m.first_dense_layers
        << "\n";
    }
    if (const model::RopeScaling& r = c.rope_scaling; r.on()) {
      s << "rope_factor " << r.factor << "\nrope_low " << r.low_freq_factor << "\nrope_high "
        << r.high_freq_factor << "\nrope_original " << r.original_context << "\n";
    }
  }
  const std::string cmd = Python() + " " + LogitsScript() + " " + d;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  absl::StatusOr<std::vector<float>> w = LoadModelWeights(d, c);
  EXPECT_TRUE(w.ok()) << w.status();
  if (!w.ok()) return out;
  auto m = engine::cpu::CpuModel::Create(c, B, T, /*threads=*/2);
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return out;
  std::copy(w->begin(), w->end(), (*m)->params().f32().begin());
  std::vector<int> tokens(B * T);
  std::ifstream(d + "/tokens.bin", std::ios::binary)
      .read(reinterpret_cast<char*>(tokens.data()), sizeof(int) * tokens.size());
  (*m)->Forward(tokens.data(), nullptr);
  out.want.resize(size_t(B) * T * c.vocab);
  out.got.resize(out.want.size());
  std::ifstream(d + "/logits.bin", std::ios::binary)
      .read(reinterpret_cast<char*>(out.want.data()), sizeof(float) * out.want.size());
  for (int r = 0; r < B * T; ++r) (*m)->ReadLogits(r, out.got.data() + size_t(r) * c.vocab);
  for (size_t i = 0; i < out.want.size(); ++i) {
    out.max_abs = std::max(out.max_abs, std::abs(double(out.got[i]) - out.want[i]));
    out.scale = std::max(out.scale, std::abs(double(out.want[i])));
  }
  std::getline(std::ifstream(d + "/reference.txt"), out.reference);
  return out;
}

bool HaveTorch() {
  return std::system((Python() + " -c 'import torch' >/dev/null 2>&1").c_str()) == 0;
}

TEST_F(HfLlamaTest, APytorchCheckpointGivesTheEngineItsLogits) {
  if (!HaveTorch()) {
    GTEST_SKIP() << Python() << " cannot import torch (scripts/setup installs python3-torch)";
  }
  if (!fs::exists(LogitsScript())) GTEST_SKIP() << "no " << LogitsScript();
  constexpr int B = 2, T = 12;
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    const TorchLogits r =
        RunTorchCheckpoint(Config(tied), Dir(tied ? "torch_tied" : "torch"), B, T);
    std::printf(
        "[hf-llama] %s: logits of %d tokens, max abs diff %.3g (largest logit %.3g), "
        "reference: %s\n",
        tied ? "tied" : "untied", B * T, r.max_abs, r.scale, r.reference.c_str());
    EXPECT_LT(r.max_abs, 1e-4 * std::max(1.0, r.scale));
  }
}

// A Llama 3.2-shaped checkpoint (tied, GQA) with rope_scaling of type
// llama3, its factors chosen so that every one of the formula's three
// bands holds a frequency (head size 8, θ 10000, original context 128:
// wavelengths 6.3 | 62.8 | 628, 6283 against 32 and 128), gives the engine
// the logits of transformers' formula — and different ones without it.
TEST_F(HfLlamaTest, ALlama32CheckpointWithRopeScalingGivesItsLogits) {
  if (!HaveTorch()) {
    GTEST_SKIP() << Python() << " cannot import torch (scripts/setup installs python3-torch)";
  }
  if (!fs::exists(LogitsScript())) GTEST_SKIP() << "no " << LogitsScript();
  constexpr int B = 2, T = 12;
  model::LlamaShape shape{2, 4, 2, 32, 48, 16, 100, 10000, 1e-5, true, {8, 1, 4, 128}};
  const model::ModelConfig c = *model::MakeLlamaConfig(shape);
  const std::vector<double> f = model::RotaryFrequencies(c);
  ASSERT_EQ(f.size(), 4u);
  EXPECT_EQ(f[0], double(1.0f));                // high frequency: kept
  EXPECT_NEAR(f[2], double(0.01f) / 8, 1e-12);  // low frequency: divided by factor
  EXPECT_GT(f[1], double(0.1f) / 8);            // between: blended
  EXPECT_LT(f[1], double(0.1f));
  const TorchLogits r = RunTorchCheckpoint(c, Dir("scaled"), B, T);
  std::printf(
      "[hf-llama] rope_scaling llama3 (factor 8, low 1, high 4, original 128): logits of %d "
      "tokens, max abs diff %.3g, relative %.3g (largest logit %.3g), reference: %s\n",
      B * T, r.max_abs, r.max_abs / r.scale, r.scale, r.reference.c_str());
  EXPECT_LT(r.max_abs, 1e-5 * std::max(1.0, r.scale));
  // The same weights read as a model without scaling compute other logits
  // (config.json's rope_scaling is refused for it: the check compares).
  model::LlamaShape plain = shape;
  plain.rope_scaling = {};
  const model::ModelConfig unscaled = *model::MakeLlamaConfig(plain);
  absl::StatusOr<std::vector<float>> refused = LoadModelWeights(Dir("scaled"), unscaled);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("rope_scaling"), std::string::npos) << refused.status();
  absl::StatusOr<std::vector<float>> w = LoadModelWeights(Dir("scaled"), c);
  ASSERT_TRUE(w.ok()) << w.status();
  auto m = engine::cpu::CpuModel::Create(unscaled, B, T, /*threads=*/2);
  ASSERT_TRUE(m.ok()) << m.status();
  std::copy(w->begin(), w->end(), (*m)->params().f32().begin());
  std::vector<int> tokens(B * T);
  std::ifstream(Dir("scaled") + "/tokens.bin", std::ios::binary)
      .read(reinterpret_cast<char*>(tokens.data()), sizeof(int) * tokens.size());
  (*m)->Forward(tokens.data(), nullptr);
  double differs = 0;
  std::vector<float> row(c.vocab);
  for (int t = 0; t < B * T; ++t) {
    (*m)->ReadLogits(t, row.data());
    for (int v = 0; v < c.vocab; ++v) {
      differs = std::max(differs, std::abs(double(row[v]) - r.want[size_t(t) * c.vocab + v]));
    }
  }
  std::printf("[hf-llama] the same weights without rope_scaling: max abs diff %.3g\n", differs);
  EXPECT_GT(differs, 1e-3 * std::max(1.0, r.scale));
}

// A Qwen3-shaped checkpoint (Qwen3ForCausalLM: heads of 16 on a width of
// 32, so the attention is 64 wide; q/k norms; tied) written by PyTorch
// gives the engine its logits, and our export of it reads back bit for bit
// as a Qwen3ForCausalLM.
TEST_F(HfLlamaTest, AQwen3CheckpointGivesItsLogitsAndExportsBack) {
  model::LlamaShape shape{2, 4, 2, 32, 48, 16, 100, 1e6, 1e-6, true, {}, 16, true};
  const model::ModelConfig c = *model::MakeLlamaConfig(shape);
  ASSERT_EQ(c.q_dim(), 64);
  const std::vector<float> p = RandomParams(c);
  const std::string out = Dir("export");
  ASSERT_TRUE(ExportHfLlama(c, p, out, {}).ok());
  absl::StatusOr<std::vector<float>> back = LoadModelWeights(out, c);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, p);
  std::string text;
  ASSERT_TRUE(ReadFile(out + "/config.json", &text).ok());
  EXPECT_NE(text.find("\"Qwen3ForCausalLM\""), std::string::npos) << text;
  EXPECT_NE(text.find("\"head_dim\": 16"), std::string::npos) << text;
  // The same file for a model without q/k norms is refused naming both.
  model::LlamaShape llama = shape;
  llama.qk_norm = false;
  absl::StatusOr<std::vector<float>> refused =
      LoadModelWeights(out, *model::MakeLlamaConfig(llama));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("Qwen3ForCausalLM (with q/k norms), the spec's "
                                            "model.qk_norm false"),
            std::string::npos)
      << refused.status();
  if (!HaveTorch()) {
    GTEST_SKIP() << Python() << " cannot import torch (scripts/setup installs python3-torch)";
  }
  if (!fs::exists(LogitsScript())) GTEST_SKIP() << "no " << LogitsScript();
  const TorchLogits r = RunTorchCheckpoint(c, Dir("qwen3"), 2, 12);
  std::printf(
      "[hf-llama] qwen3 (head_dim 16 on dim 32, q/k norms): logits of 24 tokens, max abs diff "
      "%.3g, relative %.3g (largest logit %.3g), reference: %s\n",
      r.max_abs, r.max_abs / r.scale, r.scale, r.reference.c_str());
  EXPECT_LT(r.max_abs, 1e-5 * std::max(1.0, r.scale));
}

// Mixtral- and Qwen3-MoE-shaped checkpoints (MixtralForCausalLM's
// block_sparse_moe; Qwen3MoeForCausalLM's mlp with q/k norms, a dense first
// layer and gates not renormalised) written by PyTorch give the engine
// their logits; our export of each reads back bit for bit, its config.json
// gives the spec's model.moe back, and a spec without MoE is refused.
TEST_F(HfLlamaTest, MixtralAndQwen3MoeCheckpointsGiveTheirLogitsAndExportBack) {
  model::LlamaShape mixtral{2, 4, 2, 32, 48, 16, 100, 1e6, 1e-5, false};
  mixtral.moe = {/*experts=*/4, /*top_k=*/2, /*expert_ffn_dim=*/24};
  model::LlamaShape qwen{3, 4, 2, 32, 48, 16, 100, 1e6, 1e-6, true, {}, 16, true};
  qwen.moe = {6,
              3,
              16,
              0,
              model::RouterScoring::kSoftmax,
              /*norm_topk_prob=*/false,
              /*first_dense_layers=*/1};
  for (const model::LlamaShape& shape : {mixtral, qwen}) {
    const model::ModelConfig c = *model::MakeLlamaConfig(shape);
    const char* name = c.qk_norm ? "qwen3-moe" : "mixtral";
    SCOPED_TRACE(name);
    const std::vector<float> p = RandomParams(c);
    const std::string out = Dir(std::string(name) + "_export");
    ASSERT_TRUE(ExportHfLlama(c, p, out, {}).ok());
    absl::StatusOr<std::vector<float>> back = LoadModelWeights(out, c);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, p);
    std::string text;
    ASSERT_TRUE(ReadFile(out + "/config.json", &text).ok());
    absl::StatusOr<std::vector<std::pair<std::string, std::string>>> fields =
        ModelFieldsFromHfConfig(text);
    ASSERT_TRUE(fields.ok()) << fields.status();
    std::string moe;
    for (const auto& [k, v] : *fields) {
      if (k == "moe") moe = v;
    }
    EXPECT_EQ(moe, c.qk_norm ? "{experts: 6, top_k: 3, expert_ffn_dim: 16, norm_topk_prob: false, "
                               "first_dense_layers: 1}"
                             : "{experts: 4, top_k: 2, expert_ffn_dim: 24, norm_topk_prob: true, "
                               "first_dense_layers: 0}");
    model::LlamaShape dense = shape;
    dense.moe = {};
    absl::StatusOr<std::vector<float>> refused =
        LoadModelWeights(out, *model::MakeLlamaConfig(dense));
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.status().message().find("MoE layers), the spec's model.moe none"),
              std::string::npos)
        << refused.status();
    if (!HaveTorch() || !fs::exists(LogitsScript())) continue;
    const TorchLogits r = RunTorchCheckpoint(c, Dir(name), 2, 12);
    std::printf(
        "[hf-llama] %s: logits of 24 tokens, max abs diff %.3g, relative %.3g (largest logit "
        "%.3g), reference: %s\n",
        name, r.max_abs, r.max_abs / r.scale, r.scale, r.reference.c_str());
    EXPECT_LT(r.max_abs, 1e-5 * std::max(1.0, r.scale));
  }
}

// An expert-parallel rank reads only its share of a sharded checkpoint:
// ep rank r of 2 reads the dense tensors and its half of the experts, the
// values equal the whole model's at those places, and Stats says how
// many bytes that took (each rank's line is what its worker logs).
TEST_F(HfLlamaTest, AnExpertParallelRankReadsOnlyItsExperts) {
  model::LlamaShape shape{2, 4, 2, 32, 48, 16, 100, 1e6, 1e-5, false};
  shape.moe = {/*experts=*/4, /*top_k=*/2, /*expert_ffn_dim=*/64};
  const model::ModelConfig c = *model::MakeLlamaConfig(shape);
  const std::vector<float> p = RandomParams(c);
  const std::string out = Dir("mixtral_ep_reads");
  HfExportOptions o;
  o.max_shard_bytes = 40'000;  // fp32: several files
  ASSERT_TRUE(ExportHfLlama(c, p, out, o).ok());
  const model::ParamLayout whole(c);
  int64_t expert_bytes = 0;  // fp32 bytes of every expert tensor
  for (const model::TensorInfo& t : whole.tensors()) {
    if (t.name.find(".experts.") != std::string::npos) expert_bytes += int64_t(t.numel) * 4;
  }
  // The file has no padded vocabulary rows (zeros, never read) of wte and the head.
  const int64_t all_bytes =
      (int64_t(whole.num_params()) - int64_t(c.padded_vocab - c.vocab) * c.dim * 2) * 4;
  for (int rank = 0; rank < 2; ++rank) {
    model::ModelSlice slice;
    slice.ep = 2;
    slice.ep_rank = rank;
    const model::ParamLayout layout(c, slice);
    absl::StatusOr<std::unique_ptr<WeightsSource>> source = OpenModelWeights(out, c);
    ASSERT_TRUE(source.ok()) << source.status();
    std::vector<float> got(layout.num_params());
    for (const model::FlatRun& run : layout.GlobalRuns(0, layout.num_params())) {
      ASSERT_TRUE((*source)->Read(run.global, run.count, got.data() + run.local).ok());
      for (size_t i = 0; i < run.count; ++i) ASSERT_EQ(got[run.local + i], p[run.global + i]);
    }
    const ReadStats r = (*source)->Stats();
    std::printf("[hf-llama] ep rank %d of 2: %s\n", rank, ReadStatsText(r).c_str());
    EXPECT_EQ(r.data_bytes, all_bytes);
    EXPECT_EQ(r.bytes_read, all_bytes - expert_bytes / 2);
    EXPECT_GT(r.files, 2);
    EXPECT_LE(r.files_read, r.files);
  }
}

}  // namespace
}  // namespace shardtrain::checkpoint
