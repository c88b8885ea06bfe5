// Whole-model check against PyTorch (float32 on both sides): the same weights
// and batch give the same loss and every gradient; 10 AdamW steps match
// torch.optim.AdamW with the same param groups. Relative difference of a
// tensor = max|ours - torch| / max(max|torch|, 1e-30); tolerance 1e-5.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "worker/engine/cpu/cpu_model.h"
#include "worker/optim/adamw.h"
#include "worker/optim/lr_schedule.h"

#ifndef SHARDTRAIN_TORCH_CROSSCHECK_SCRIPT
#error "SHARDTRAIN_TORCH_CROSSCHECK_SCRIPT must be defined by CMake"
#endif

namespace shardtrain::engine::cpu {
namespace {

using model::MakeGptConfig;
using model::ModelConfig;
using model::TensorInfo;
namespace fs = std::filesystem;

constexpr const char* kPython = "/usr/bin/python3";
constexpr double kTol = 1e-5;

bool TorchAvailable() {
  static const bool ok = std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0;
  return ok;
}

template <typename T>
void WriteBin(const fs::path& p, const T* data, size_t n) {
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char*>(data), n * sizeof(T));
  ASSERT_TRUE(out.good()) << p;
}

std::vector<float> ReadFloats(const fs::path& p, size_t n) {
  std::vector<float> v(n);
  std::ifstream in(p, std::ios::binary);
  in.read(reinterpret_cast<char*>(v.data()), n * sizeof(float));
  EXPECT_TRUE(in.good()) << "reading " << p;
  return v;
}

double RelDiff(const float* a, const float* b, size_t n) {
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::abs(double{a[i]} - b[i]));
    scale = std::max(scale, std::abs(double{b[i]}));
  }
  return diff / scale;
}

class CrossCheckTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!TorchAvailable()) GTEST_SKIP() << kPython << " cannot import torch";
    dir_ = fs::temp_directory_path() /
           ("shardtrain_crosscheck_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    absl::StatusOr<ModelConfig> cfg = Config();
    ASSERT_TRUE(cfg.ok()) << cfg.status();
    config_ = *cfg;
    auto m = CpuModel::Create(config_, kB, kT, /*threads=*/2, Options());
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
    model_->InitParams(1234);
  }
  void TearDown() override {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }

  // The model under test. V = 100 pads to Vp = 128: the padded-logits path
  // is exercised.
  virtual absl::StatusOr<ModelConfig> Config() const {
    return MakeGptConfig(/*layers=*/2, /*heads=*/4, /*dim=*/64, /*context=*/32, /*vocab=*/100);
  }

  virtual ModelEngineOptions Options() const { return {}; }

  void WriteCommon(const std::string& extra_config) {
    std::ofstream c(dir_ / "config.txt");
    c << "arch " << model::ArchName(config_.arch) << "\nlayers " << config_.layers << "\nheads "
      << config_.heads << "\ndim " << config_.dim << "\ncontext " << config_.context << "\nvocab "
      << config_.vocab << "\npadded_vocab " << config_.padded_vocab << "\nbatch " << kB
      << "\nseq_len " << kT << "\n";
    if (config_.arch == model::Arch::kLlama) {
      char theta[64], eps[64];
      std::snprintf(theta, sizeof theta, "%.17g", config_.rope_theta);
      std::snprintf(eps, sizeof eps, "%.17g", config_.norm_eps);
      c << "kv_heads " << config_.kv_heads << "\nffn_dim " << config_.ffn_dim << "\nrope_theta "
        << theta << "\nnorm_eps " << eps << "\ntie_embeddings " << (config_.tie_embeddings ? 1 : 0)
        << "\nhead_dim " << config_.head_dim() << "\nqk_norm " << (config_.qk_norm ? 1 : 0) << "\n";
    }
    if (config_.moe.on()) {
      const model::MoeConfig& m = config_.moe;
      const MoeOptions o = Options().moe;
      c << "experts " << m.experts << "\ntop_k " << m.top_k << "\nexpert_ffn_dim "
        << m.expert_ffn_dim << "\nshared_experts " << m.shared_experts << "\nscoring "
        << (m.scoring == model::RouterScoring::kSigmoid ? "sigmoid" : "softmax")
        << "\nnorm_topk_prob " << (m.norm_topk_prob ? 1 : 0) << "\nfirst_dense_layers "
        << m.first_dense_layers << "\naux_loss_coef " << o.aux_loss_coef << "\nz_loss_coef "
        << o.z_loss_coef << "\n";
    }
    c << extra_config;
    std::ofstream l(dir_ / "layout.txt");
    for (const TensorInfo& t : model_->layout().tensors()) {
      l << t.name << " " << t.offset << " " << t.numel << " " << (t.decay ? 1 : 0);
      for (int64_t d : t.shape) l << " " << d;
      l << "\n";
    }
    WriteBin(dir_ / "params.bin", model_->params().f32().data(), model_->params().f32().size());
  }

  int RunTorch(const std::string& mode) {
    const std::string cmd = std::string(kPython) + " " + SHARDTRAIN_TORCH_CROSSCHECK_SCRIPT + " " +
                            dir_.string() + " " + mode;
    return std::system(cmd.c_str());
  }

  void ExpectLossLogitsAndGradientsMatchTorch();

  static constexpr int kB = 2, kT = 16;
  fs::path dir_;
  ModelConfig config_;
  std::unique_ptr<CpuModel> model_;
};

// The same loss, logits and gradients as PyTorch on the same weights.
void CrossCheckTest::ExpectLossLogitsAndGradientsMatchTorch() {
  std::mt19937 rng(7);
  std::vector<int> tokens(kB * kT), targets(kB * kT);
  for (int i = 0; i < kB * kT; ++i) {
    tokens[i] = static_cast<int>(rng() % config_.vocab);
    targets[i] = static_cast<int>(rng() % config_.vocab);
  }
  WriteCommon("");
  WriteBin(dir_ / "tokens.bin", tokens.data(), tokens.size());
  WriteBin(dir_ / "targets.bin", targets.data(), targets.size());

  model_->ZeroGrad();
  const float loss = model_->Forward(tokens.data(), targets.data());
  // Logits of the forward (slot 0's, (B, T, Vp): the real V columns), read
  // before Backward overwrites them with their gradient.
  std::vector<float> logits(size_t(kB) * kT * config_.vocab);
  for (int r = 0; r < kB * kT; ++r)
    model_->ReadLogits(r, logits.data() + size_t(r) * config_.vocab);
  model_->Backward();
  // The gradients are of the loss plus the MoE layers' balancing losses
  // (torch_crosscheck.py's too).
  const MoeStats moe = model_->TakeMoeStats();
  if (config_.moe.on()) {
    std::printf("[torch] MoE: aux loss %.6f, z-loss %.6f, %lld pairs, %lld dropped\n", moe.aux_loss,
                moe.z_loss, static_cast<long long>(moe.pairs), static_cast<long long>(moe.dropped));
    EXPECT_EQ(moe.forwards, 1);
    EXPECT_GT(moe.aux_loss, 0.0);
  }
  ASSERT_EQ(RunTorch("grad"), 0);
  const std::vector<float> torch_logits = ReadFloats(dir_ / "logits.bin", logits.size());
  double max_abs = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    max_abs = std::max(max_abs, std::abs(double{logits[i]} - torch_logits[i]));
  }
  const double logits_rel = RelDiff(logits.data(), torch_logits.data(), logits.size());
  std::printf("[torch] %s logits: max abs diff %.3e, rel %.3e over %zu\n",
              model::ArchName(config_.arch), max_abs, logits_rel, logits.size());
  EXPECT_LT(logits_rel, kTol);

  float torch_loss = 0;
  std::ifstream(dir_ / "loss.txt") >> torch_loss;
  const double loss_rel = std::abs(double{loss} - torch_loss) / std::abs(torch_loss);
  std::printf("[torch] loss ours %.7f torch %.7f rel diff %.3e\n", loss, torch_loss, loss_rel);
  EXPECT_LT(loss_rel, kTol);

  const auto& grads = model_->grads().f32();
  const std::vector<float> ref = ReadFloats(dir_ / "grads.bin", grads.size());
  double worst = 0;
  std::string worst_name;
  for (const TensorInfo& t : model_->layout().tensors()) {
    const double rel = RelDiff(grads.data() + t.offset, ref.data() + t.offset, t.numel);
    EXPECT_LT(rel, kTol) << "gradient of " << t.name;
    if (rel > worst) {
      worst = rel;
      worst_name = t.name;
    }
  }
  std::printf("[torch] gradients: max rel diff %.3e (%s) over %zu tensors\n", worst,
              worst_name.c_str(), model_->layout().tensors().size());
  // Padded rows of wte (and of an untied head) get no gradient.
  for (int k : {model_->layout().wte(), model_->layout().lm_head()}) {
    const TensorInfo& t = model_->layout().tensors()[k];
    for (size_t i = size_t(config_.vocab) * config_.dim; i < t.numel; ++i)
      ASSERT_EQ(grads[t.offset + i], 0.0f) << t.name;
  }
}

TEST_F(CrossCheckTest, LossAndGradientsMatchTorch) { ExpectLossLogitsAndGradientsMatchTorch(); }

// Llama: RMSNorm, rotary positions, grouped-query attention (4 heads, 2
// key/value heads), SwiGLU, no biases; untied and tied heads.
class LlamaCrossCheckTest : public CrossCheckTest {
 protected:
  absl::StatusOr<ModelConfig> Config() const override {
    // layers, heads, kv_heads, dim, ffn_dim, context, vocab, rope_theta, norm_eps, tied
    return model::MakeLlamaConfig({2, 4, 2, 64, 96, 32, 100, 10000, 1e-5, tied_});
  }
  bool tied_ = false;
};

TEST_F(LlamaCrossCheckTest, LossLogitsAndGradientsMatchTorch) {
  ExpectLossLogitsAndGradientsMatchTorch();
}

class TiedLlamaCrossCheckTest : public LlamaCrossCheckTest {
 protected:
  void SetUp() override {
    tied_ = true;
    LlamaCrossCheckTest::SetUp();
  }
};

TEST_F(TiedLlamaCrossCheckTest, LossLogitsAndGradientsMatchTorch) {
  ExpectLossLogitsAndGradientsMatchTorch();
}

// Qwen3's recipe: heads of 32 on a width of 64 (q is 128 wide, the output
// projection 64 × 128) and an RMSNorm over each head of q and k before
// rotary; tied head.
class Qwen3CrossCheckTest : public CrossCheckTest {
 protected:
  absl::StatusOr<ModelConfig> Config() const override {
    return model::MakeLlamaConfig({2, 4, 2, 64, 96, 32, 100, 10000, 1e-6, true, {}, 32, true});
  }
};

TEST_F(Qwen3CrossCheckTest, LossLogitsAndGradientsMatchTorch) {
  ExpectLossLogitsAndGradientsMatchTorch();
}

// Mixtral's MoE MLP on the Llama block: 4 SwiGLU experts of 48, top 2 with
// renormalised gates, the Switch loss and a z-loss.
class MixtralCrossCheckTest : public CrossCheckTest {
 protected:
  absl::StatusOr<ModelConfig> Config() const override {
    model::LlamaShape shape{2, 4, 2, 64, 96, 32, 100, 10000, 1e-5, false};
    shape.moe = {/*experts=*/4, /*top_k=*/2, /*expert_ffn_dim=*/48};
    return model::MakeLlamaConfig(shape);
  }
  ModelEngineOptions Options() const override {
    ModelEngineOptions o;
    o.moe.aux_loss_coef = 0.01;
    o.moe.z_loss_coef = 0.001;
    return o;
  }
};

TEST_F(MixtralCrossCheckTest, LossLogitsAndGradientsMatchTorch) {
  ExpectLossLogitsAndGradientsMatchTorch();
}

// GPT-2's block with GELU experts and biases, DeepSeek-style sigmoid
// scoring without renormalised gates, a shared expert and a dense first
// layer (3 layers: dense, MoE, MoE).
class GptMoeCrossCheckTest : public CrossCheckTest {
 protected:
  absl::StatusOr<ModelConfig> Config() const override {
    absl::StatusOr<ModelConfig> c = MakeGptConfig(3, 4, 64, 32, 100);
    if (!c.ok()) return c;
    c->moe = {/*experts=*/6,
              /*top_k=*/3,
              /*expert_ffn_dim=*/32,
              /*shared_experts=*/1,
              model::RouterScoring::kSigmoid,
              /*norm_topk_prob=*/false,
              /*first_dense_layers=*/1};
    if (absl::Status s = model::ValidateModelConfig(*c); !s.ok()) return s;
    return c;
  }
  ModelEngineOptions Options() const override {
    ModelEngineOptions o;
    o.moe.aux_loss_coef = 0.02;
    return o;
  }
};

TEST_F(GptMoeCrossCheckTest, LossLogitsAndGradientsMatchTorch) {
  ExpectLossLogitsAndGradientsMatchTorch();
}

TEST_F(CrossCheckTest, AdamWMatchesTorchAndShardsMatchWhole) {
  constexpr int kSteps = 10;
  optim::AdamWOptions opt;
  opt.beta1 = 0.9f;
  opt.beta2 = 0.95f;
  opt.eps = 1e-8f;
  opt.weight_decay = 0.1f;
  const size_t n = model_->params().f32().size();
  std::string extra = "steps " + std::to_string(kSteps) + "\nbeta1 0.9\nbeta2 0.95\n" +
                      "eps 1e-8\nweight_decay 0.1\n";
  OptimizerSpec schedule;  // warmup 3 steps to 1e-2, cosine to 1e-3
  schedule.lr = 1e-2;
  schedule.min_lr = 1e-3;
  schedule.warmup_steps = 3;
  std::vector<float> lrs;
  for (int s = 0; s < kSteps; ++s) {
    lrs.push_back(static_cast<float>(optim::LearningRate(schedule, s, kSteps)));
    char buf[64];
    std::snprintf(buf, sizeof buf, "lr_%d %.9g\n", s, lrs.back());
    extra += buf;
  }
  WriteCommon(extra);

  // Whole-buffer optimizer, and the same buffer stepped as two shards split
  // inside a tensor (ZeRO-1 style): must be bitwise equal.
  std::vector<float> whole(model_->params().f32().begin(), model_->params().f32().end());
  std::vector<float> sharded = whole;
  auto full = optim::AdamW::Create(model_->layout(), 0, n, opt);
  ASSERT_TRUE(full.ok()) << full.status();
  const size_t split = model_->layout().tensors()[3].offset + 17;
  auto s0 = optim::AdamW::Create(model_->layout(), 0, split, opt);
  auto s1 = optim::AdamW::Create(model_->layout(), split, n - split, opt);
  ASSERT_TRUE(s0.ok() && s1.ok());
  EXPECT_FALSE(optim::AdamW::Create(model_->layout(), split, n, opt).ok());

  std::mt19937 rng(99);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::vector<float> g(n);
  for (int s = 0; s < kSteps; ++s) {
    for (float& x : g) x = normal(rng);
    WriteBin(dir_ / ("grads_" + std::to_string(s) + ".bin"), g.data(), n);
    full->Step(absl::MakeSpan(whole), absl::MakeConstSpan(g), lrs[s], model_->pool());
    s0->Step(absl::MakeSpan(sharded.data(), split), absl::MakeConstSpan(g.data(), split), lrs[s],
             model_->pool());
    // The second shard uses the fused step-and-zero variant.
    std::vector<float> g1(g.begin() + split, g.end());
    s1->StepAndZeroGrads(absl::MakeSpan(sharded.data() + split, n - split), absl::MakeSpan(g1),
                         lrs[s], nullptr);
    ASSERT_TRUE(std::all_of(g1.begin(), g1.end(), [](float x) { return x == 0.0f; }));
  }
  ASSERT_EQ(whole, sharded) << "sharded AdamW differs from whole-buffer AdamW";
  ASSERT_EQ(RunTorch("adamw"), 0);
  const std::vector<float> ref = ReadFloats(dir_ / "adamw_params.bin", n);
  double worst = 0;
  for (const TensorInfo& t : model_->layout().tensors()) {
    const double rel = RelDiff(whole.data() + t.offset, ref.data() + t.offset, t.numel);
    EXPECT_LT(rel, kTol) << "AdamW params of " << t.name;
    worst = std::max(worst, rel);
  }
  std::printf("[torch] AdamW %d steps: params max rel diff %.3e\n", kSteps, worst);
}

}  // namespace
}  // namespace shardtrain::engine::cpu
