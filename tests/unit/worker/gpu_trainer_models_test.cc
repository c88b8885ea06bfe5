// The GPU engine through the whole trainer, by model family and kernel
// choice (label `gpu`; every test skips without a CUDA device): the Llama
// recipe against the CPU engine (fp32 step by step, bf16 within 2%, one
// step's gradients tensor by tensor, Qwen3's q/k norms and MoE layers
// among them), recomputation, and flash attention against the
// materialized kernels. The rest: gpu_trainer_test.cc.
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "common/job_spec.h"
#include "common/planner.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/gpu_trainer_fixture.h"
#include "tests/unit/worker/gpu_trainer_util.h"
#include "worker/engine/cpu/cpu_model.h"
#include "worker/engine/cuda/cuda_model.h"
#include "worker/trainer.h"

namespace shardtrain::worker {
namespace {
using gpu_testing::ExpectSameStateAsTheCpu;
using gpu_testing::GpuTrainerTest;
using gpu_testing::MakeTrainer;
using gpu_testing::MaxRelDiff;
using gpu_testing::Params;
using gpu_testing::RunSpec;
using gpu_testing::SpecOf;
using gpu_testing::Train;

// ---- the Llama recipe

// A small Llama (2 layers, 4 query heads over 2 kv heads of 16 channels,
// SwiGLU of 160, an untied LM head), as a job spec and as a config.
constexpr char kLlamaModel[] =
    "{arch: llama, layers: 2, heads: 4, kv_heads: 2, dim: 64, ffn_dim: 160, context: 32, "
    "vocab: 256, rope_theta: 10000, norm_eps: 1e-5, tie_embeddings: false}";
constexpr int kLlamaSeqLen = 31;  // <= context; not a multiple of 32: the kernels' tails run

model::LlamaShape LlamaTestShape() {
  model::LlamaShape shape;
  shape.layers = 2;
  shape.heads = 4;
  shape.kv_heads = 2;
  shape.dim = 64;
  shape.ffn_dim = 160;
  shape.context = 32;
  shape.vocab = 256;
  shape.rope_theta = 10000;
  shape.norm_eps = 1e-5;
  shape.tie_embeddings = false;
  return shape;
}

// model.recompute on the GPU engine (ModelEngine's refill, the CUDA layers):
// the same losses as keeping every activation, in fp32 and bf16, for GPT-2
// and for the Llama recipe (a refill rotates the recomputed q, k again).
TEST_F(GpuTrainerTest, RecomputationTrainsLikeKeepingEveryActivation) {
  SKIP_WITHOUT_GPU();
  for (const auto& [arch, precision] : {std::pair<const char*, const char*>{"gpt2", "fp32"},
                                        {"gpt2", "bf16"},
                                        {"llama", "fp32"},
                                        {"llama", "bf16"}}) {
    SCOPED_TRACE(absl::StrCat(arch, " ", precision));
    RunSpec r;
    r.device = "cuda";
    r.precision = precision;
    if (std::string(arch) == "llama") {
      r.model = kLlamaModel;
      r.seq_len = kLlamaSeqLen;
    }
    std::unique_ptr<Trainer> none = MakeTrainer(SpecOf(r));
    ASSERT_TRUE(none);
    const std::vector<double> want = Train(*none, 1, r.steps);
    for (const char* mode : {"selective", "full"}) {
      r.recompute = mode;
      std::unique_ptr<Trainer> t = MakeTrainer(SpecOf(r));
      ASSERT_TRUE(t);
      const std::vector<double> got = Train(*t, 1, r.steps);
      const double diff = MaxRelDiff(got, want);
      std::printf(
          "[gpu-trainer] %s %s recompute %s: step 1 %.6f step %d %.6f; max diff vs none "
          "%.3g; activations %s (none %s)\n",
          arch, precision, mode, got[1], r.steps, got[r.steps], diff,
          FormatPlanBytes(t->engine().activation_bytes()).c_str(),
          FormatPlanBytes(none->engine().activation_bytes()).c_str());
      EXPECT_LE(diff, 1e-6) << arch << " " << precision << " " << mode;
      EXPECT_LT(t->engine().activation_bytes(), none->engine().activation_bytes());
    }
  }
}

// model.attention: flash in a whole model (heads of 64 channels, bf16; T =
// 100 is not a multiple of its 64-row tiles), next to the materialized
// kernels on the same job, for GPT-2 and for a Llama with grouped-query
// heads: flash's losses stay as near fp32's as the materialized kernels'
// do (every step within 2% of fp32, or within 1.5 times the materialized
// bf16's largest step difference), and the activation table is smaller
// (att is the rows' logsumexp). 12 steps: at lr 3e-3 the runs part after
// ~13 (on an H200 every bf16 run agreed with fp32 within 2e-4 up to step 13;
// at step 15 the Llama's fp32, materialized and flash losses were 3.19,
// 3.18 and 3.05, and GPT-2's all spiked to 9.8 at step 17), rounding then
// deciding where each goes; the test below holds flash's gradients to the
// materialized kernels' instead. Full recomputation gives the same losses
// (1e-6); selective has nothing left to refill, so keeps what no
// recomputation keeps.
TEST_F(GpuTrainerTest, FlashAttentionTrainsLikeTheMaterializedKernels) {
  SKIP_WITHOUT_GPU();
  for (const auto& [arch, model] :
       {std::pair<const char*, std::string>{"gpt2",
                                            "{layers: 2, heads: 2, dim: 128, context: 128, "
                                            "vocab: 256"},
        {"llama",
         "{arch: llama, layers: 2, heads: 4, kv_heads: 2, dim: 256, "
         "ffn_dim: 512, context: 128, vocab: 256, tie_embeddings: "
         "false"}}) {
    SCOPED_TRACE(arch);
    RunSpec r;
    r.device = "cuda";
    r.precision = "bf16";
    r.model = model + ", attention: materialized}";
    r.seq_len = 100;
    r.steps = 12;
    std::unique_ptr<Trainer> plain = MakeTrainer(SpecOf(r));
    ASSERT_FALSE(SpecOf(r).Activations().flash_attention);
    r.precision = "fp32";
    std::unique_ptr<Trainer> fp32 = MakeTrainer(SpecOf(r));
    r.precision = "bf16";
    r.model = model + ", attention: flash}";
    const JobSpec spec = SpecOf(r);
    ASSERT_TRUE(spec.Activations().flash_attention);
    std::unique_ptr<Trainer> flash = MakeTrainer(spec);
    ASSERT_TRUE(plain && fp32 && flash);
    const model::ActivationTable& table = flash->engine().activations();
    EXPECT_EQ(table.at("block.0.att").dtype, DataType::kFloat32);
    EXPECT_EQ(table.at("block.0.att").numel,
              int64_t{r.micro} * flash->engine().layout().config().heads * r.seq_len);
    EXPECT_LT(flash->engine().activation_bytes(), plain->engine().activation_bytes());
    const std::vector<double> want = Train(*plain, 1, r.steps), got = Train(*flash, 1, r.steps);
    const std::vector<double> exact = Train(*fp32, 1, r.steps);
    for (int step = 1; step <= r.steps; ++step) {
      std::printf("[gpu-trainer] %s step %2d loss fp32 %.5f bf16 materialized %.5f flash %.5f\n",
                  arch, step, exact[step], want[step], got[step]);
    }
    const double flash_drift = MaxRelDiff(got, exact), plain_drift = MaxRelDiff(want, exact);
    std::printf(
        "[gpu-trainer] %s vs fp32, max rel diff: bf16 flash %.3g, bf16 materialized "
        "%.3g; flash vs materialized %.3g; activations %s (materialized %s)\n",
        arch, flash_drift, plain_drift, MaxRelDiff(got, want),
        FormatPlanBytes(flash->engine().activation_bytes()).c_str(),
        FormatPlanBytes(plain->engine().activation_bytes()).c_str());
    EXPECT_LE(flash_drift, std::max(0.02, 1.5 * plain_drift));
    for (const char* mode : {"selective", "full"}) {
      r.recompute = mode;
      std::unique_ptr<Trainer> t = MakeTrainer(SpecOf(r));
      ASSERT_TRUE(t);
      const std::vector<double> again = Train(*t, 1, r.steps);
      std::printf(
          "[gpu-trainer] %s bf16 flash recompute %s: max diff vs none %.3g; "
          "activations %s (none %s)\n",
          arch, mode, MaxRelDiff(again, got),
          FormatPlanBytes(t->engine().activation_bytes()).c_str(),
          FormatPlanBytes(flash->engine().activation_bytes()).c_str());
      EXPECT_LE(MaxRelDiff(again, got), 1e-6) << mode;
      if (std::string(mode) == "selective") {
        EXPECT_EQ(t->engine().activation_bytes(), flash->engine().activation_bytes());
      } else {
        EXPECT_LT(t->engine().activation_bytes(), flash->engine().activation_bytes());
      }
    }
  }
}

// One step, no training: the gradient of every tensor under bf16 flash
// attention is as near the fp32 engine's as the bf16 materialized kernels'
// (relative L2 error over the whole gradient, within 1.25 times theirs plus
// 1e-3), for GPT-2's heads and the Llama recipe's grouped-query heads — what
// the 20-step losses above cannot separate from bf16's drift at lr 3e-3.
TEST_F(GpuTrainerTest, FlashGradientsAreAsNearFp32AsTheMaterializedKernels) {
  SKIP_WITHOUT_GPU();
  for (const auto& [arch, model] :
       {std::pair<const char*, std::string>{"gpt2",
                                            "{layers: 2, heads: 2, dim: 128, context: 128, "
                                            "vocab: 256}"},
        {"llama",
         "{arch: llama, layers: 2, heads: 4, kv_heads: 2, dim: 256, ffn_dim: 512, context: 128, "
         "vocab: 256, tie_embeddings: false}"}}) {
    SCOPED_TRACE(arch);
    RunSpec r;
    r.device = "cuda";
    r.model = model;
    absl::StatusOr<model::ModelConfig> config = SpecOf(r).model.Config();
    ASSERT_TRUE(config.ok()) << config.status();
    const int B = 4, T = 100;
    std::vector<int> tokens(B * T), targets(B * T);
    for (int i = 0; i < B * T; ++i) {
      tokens[i] = (i * 37 + 11) % config->vocab;
      targets[i] = (i * 53 + 5) % config->vocab;
    }
    auto gradients = [&](DataType compute, bool flash) {
      engine::ModelEngineOptions o;
      o.activations.flash_attention = flash;
      auto e = engine::cuda::CudaModel::Create(*config, B, T, /*ordinal=*/0, compute, 1, o);
      EXPECT_TRUE(e.ok()) << e.status();
      if (!e.ok()) return std::vector<float>{};
      (*e)->InitParams(1337);
      (*e)->ZeroGrad();
      (*e)->Forward(tokens.data(), targets.data());
      (*e)->Backward();
      std::vector<float> g((*e)->layout().num_params());
      (*e)->math().CopyToHost(g.data(), (*e)->grad_buffer().as<float>(), g.size());
      return g;
    };
    const std::vector<float> exact = gradients(DataType::kFloat32, false);
    const std::vector<float> plain = gradients(DataType::kBFloat16, false);
    const std::vector<float> flash = gradients(DataType::kBFloat16, true);
    ASSERT_FALSE(exact.empty() || plain.empty() || flash.empty());
    auto rel_l2 = [&](const std::vector<float>& g) {
      double num = 0, den = 0;
      for (size_t i = 0; i < g.size(); ++i) {
        const double d = double{g[i]} - double{exact[i]};
        num += d * d;
        den += double{exact[i]} * exact[i];
      }
      return std::sqrt(num / den);
    };
    const double e_plain = rel_l2(plain), e_flash = rel_l2(flash);
    std::printf(
        "[gpu-trainer] %s gradients vs fp32, relative L2: bf16 materialized %.3g, bf16 flash "
        "%.3g\n",
        arch, e_plain, e_flash);
    EXPECT_LE(e_flash, 1.25 * e_plain + 1e-3);
  }
}

// As Fp32StepsAndParametersMatchTheCpuEngine for GPT-2, then bf16 on the
// GPU: every step's loss within 2% of fp32's (the 16-bit compute copy of
// every unit, the untied head's in the final unit included).
TEST_F(GpuTrainerTest, LlamaFp32MatchesTheCpuEngineAndBf16IsWithin2Percent) {
  SKIP_WITHOUT_GPU();
  RunSpec r;
  r.model = kLlamaModel;
  r.seq_len = kLlamaSeqLen;
  std::unique_ptr<Trainer> cpu = MakeTrainer(SpecOf(r));
  r.device = "cuda";
  std::unique_ptr<Trainer> gpu = MakeTrainer(SpecOf(r));
  r.precision = "bf16";
  std::unique_ptr<Trainer> bf16 = MakeTrainer(SpecOf(r));
  ASSERT_TRUE(cpu && gpu && bf16);
  // The recipe arrived: no wpe, a head of its own.
  const model::ParamLayout& layout = gpu->engine().layout();
  ASSERT_EQ(layout.config().arch, model::Arch::kLlama);
  EXPECT_EQ(layout.wpe(), -1);
  EXPECT_NE(layout.lm_head(), layout.wte());
  const std::vector<double> on_cpu = Train(*cpu, 1, r.steps), on_gpu = Train(*gpu, 1, r.steps);
  const std::vector<double> on_bf16 = Train(*bf16, 1, r.steps);
  for (int step = 1; step <= r.steps; ++step) {
    std::printf("[gpu-trainer] llama step %2d loss cpu %.7f gpu %.7f gpu bf16 %.7f\n", step,
                on_cpu[step], on_gpu[step], on_bf16[step]);
  }
  const double loss_diff = MaxRelDiff(on_gpu, on_cpu), bf16_diff = MaxRelDiff(on_bf16, on_gpu);
  std::printf("[gpu-trainer] llama losses: fp32 gpu vs cpu max diff %.3g, bf16 vs fp32 %.3g\n",
              loss_diff, bf16_diff);
  EXPECT_LE(loss_diff, 1e-5);
  EXPECT_LE(bf16_diff, 0.02);
  ExpectSameStateAsTheCpu(*cpu, *gpu, "llama", r.steps);
}

// One forward and backward of the engines themselves (no trainer, no job
// spec): the same loss (1e-5) and every parameter's gradient within 1e-4
// of the tensor's largest CPU gradient (fp32 GEMMs summing in other orders
// than OpenBLAS's), each tensor's difference printed: a wrong layer shows
// by name. For the Llama recipe and for Qwen3's (heads of 32 on a width of
// 64, so q is 128 wide; q/k norms: HeadRmsNorm's kernels in the model).
TEST_F(GpuTrainerTest, LlamaGradientsMatchTheCpuEngineTensorByTensor) {
  SKIP_WITHOUT_GPU();
  model::LlamaShape qwen3 = LlamaTestShape();
  qwen3.head_dim = 32;
  qwen3.qk_norm = true;
  // Mixtral's MoE layers (softmax, renormalised top 2 of 4), and
  // DeepSeek's (a dense first layer, a shared expert, sigmoid scores, top 2
  // of 6 not renormalised): the router, the permutation, the experts' GEMMs
  // and the combine (moe.cu, ModelEngine's experts), with the Switch loss.
  model::LlamaShape mixtral = LlamaTestShape();
  mixtral.moe = {/*experts=*/4, /*top_k=*/2, /*expert_ffn_dim=*/96};
  model::LlamaShape deepseek = LlamaTestShape();
  deepseek.moe = {6,
                  2,
                  64,
                  /*shared_experts=*/1,
                  model::RouterScoring::kSigmoid,
                  /*norm_topk_prob=*/false,
                  /*first_dense_layers=*/1};
  for (const auto& [name, shape] :
       {std::pair<const char*, model::LlamaShape>{"llama", LlamaTestShape()},
        {"qwen3", qwen3},
        {"mixtral", mixtral},
        {"deepseek-moe", deepseek}}) {
    SCOPED_TRACE(name);
    absl::StatusOr<model::ModelConfig> config = model::MakeLlamaConfig(shape);
    ASSERT_TRUE(config.ok()) << config.status();
    const int B = 4, T = kLlamaSeqLen;
    auto cpu = engine::cpu::CpuModel::Create(*config, B, T, /*threads=*/2);
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    auto gpu = engine::cuda::CudaModel::Create(*config, B, T, /*ordinal=*/0, DataType::kFloat32);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    std::vector<int> tokens(B * T), targets(B * T);
    for (int i = 0; i < B * T; ++i) {
      tokens[i] = (i * 37 + 11) % config->vocab;
      targets[i] = (i * 53 + 5) % config->vocab;
    }
    const size_t n = (*cpu)->layout().num_params();
    ASSERT_EQ((*gpu)->layout().num_params(), n);
    for (engine::Engine* e :
         {static_cast<engine::Engine*>(cpu->get()), static_cast<engine::Engine*>(gpu->get())}) {
      e->InitParams(1337);
      e->ZeroGrad();
    }
    const float loss_cpu = (*cpu)->Forward(tokens.data(), targets.data());
    const float loss_gpu = (*gpu)->Forward(tokens.data(), targets.data());
    (*cpu)->Backward();
    (*gpu)->Backward();
    std::printf("[gpu-trainer] %s engine loss cpu %.7f gpu %.7f\n", name, loss_cpu, loss_gpu);
    EXPECT_NEAR(loss_gpu, loss_cpu, 1e-5 * std::abs(loss_cpu));
    const float* g_cpu = (*cpu)->grad_buffer().as<float>();
    std::vector<float> g_gpu(n);
    (*gpu)->math().CopyToHost(g_gpu.data(), (*gpu)->grad_buffer().as<float>(), n);
    for (const model::TensorInfo& t : (*cpu)->layout().tensors()) {
      double max_ref = 0, max_diff = 0;
      for (size_t i = t.offset; i < t.offset + t.numel; ++i) {
        max_ref = std::max(max_ref, std::abs(double{g_cpu[i]}));
        const double d = std::abs(double{g_gpu[i]} - double{g_cpu[i]});
        if (!(d <= max_diff)) max_diff = d;  // NaN counts as the worst
      }
      const double rel = max_diff / (max_ref > 0 ? max_ref : 1.0);
      std::printf("[gpu-trainer] %s grad %-28s max |grad| %.3g, max diff %.3g (relative %.3g)\n",
                  name, t.name.c_str(), max_ref, max_diff, rel);
      EXPECT_LE(rel, 1e-4) << t.name;
      EXPECT_GT(max_ref, 0.0) << t.name << ": no gradient reached it";
    }
  }
}

}  // namespace
}  // namespace shardtrain::worker
