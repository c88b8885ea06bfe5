// LoRA fine-tuning through the real parts (CPU engine slices, DDP / ZeRO,
// the pipeline executor, Gloo over 127.0.0.1 between thread ranks): only
// the adapters train — the frozen model stays bit for bit, the optimizer
// and the reductions see the adapters alone — and every layout trains like
// one rank step by step within 1e-5 (losses, gradient norms, the merged
// whole model), a checkpoint of the adapters resumes the run, and bad
// adapters are refused naming the field.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "common/job_spec.h"
#include "common/model/lora.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/model_parallel_util.h"
#include "worker/checkpoint/hf_peft.h"

namespace shardtrain::worker {
namespace {
using namespace mp_test;  // NOLINT: the shared harness of this test family

// The Llama job of model_parallel_util.h with rank-4 adapters on every
// projection.
JobSpec Adapted(const Layout& l, const std::string& ckpt = "",
                const std::string& targets = "[q, k, v, o, gate, up, down]") {
  absl::StatusOr<JobSpec> spec =
      ParseJobSpec(JobSpecToYaml(TheCorpus().Spec(l, ckpt)),
                   {"finetune.lora={rank: 4, alpha: 32, targets: " + targets + "}"});
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

const Losses& OneRank() {
  static const Losses* run = new Losses(Train(Adapted(Llama(Layout{}))));
  return *run;
}

TEST(LoraTrainerTest, OnlyTheAdaptersTrain) {
  const JobSpec spec = Adapted(Llama(Layout{}));
  auto trainer = Trainer::Create(spec, 0, /*threads=*/1, nullptr);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  engine::Engine& e = (*trainer)->engine();
  ASSERT_TRUE(e.has_frozen());
  std::vector<float> frozen(e.frozen_layout().num_params()), after(frozen.size());
  e.GetFrozen(frozen.data());
  const std::vector<float> adapters(e.params().f32().begin(), e.params().f32().end());
  std::printf("[lora] trained %zu of %zu parameters (%.2f%%); frozen model %zu\n", adapters.size(),
              adapters.size() + frozen.size(),
              100.0 * adapters.size() / (adapters.size() + frozen.size()), frozen.size());
  EXPECT_EQ(int64_t(adapters.size()), model::LoraParams(*spec.TrainedConfig()));
  for (int step = 1; step <= 3; ++step) ASSERT_TRUE((*trainer)->Step(step).ok());
  e.GetFrozen(after.data());
  EXPECT_EQ(frozen, after) << "the frozen model changed";
  EXPECT_FALSE(std::equal(adapters.begin(), adapters.end(), e.params().f32().begin()))
      << "the adapters did not train";
  EXPECT_LT((*trainer)->memory().optimizer, int64_t(8 * adapters.size() + 1024));
}

class LoraParallelTest : public ::testing::TestWithParam<Layout> {};

TEST_P(LoraParallelTest, EqualsOneRankStepByStep) {
  const Layout l = GetParam();
  const Losses got = Train(Adapted(l)), &want = OneRank();
  const double loss = Worst(got.loss, want.loss), val = Worst(got.val, want.val),
               norm = Worst(got.grad_norm, want.grad_norm);
  const WholeDiff d = WholeModelDiff(got, want);  // the merged models
  std::printf(
      "%-30s loss step 1 %.6f step 20 %.6f (1 rank %.6f); max rel diff: loss %.3g, val "
      "%.3g, grad norm %.3g; merged model max abs diff %.3g (largest weight %.3g)\n",
      Name(l).c_str(), got.loss[1], got.loss[kSteps], want.loss[kSteps], loss, val, norm, d.max_abs,
      d.scale);
  EXPECT_LE(loss, 1e-5);
  EXPECT_LE(val, 1e-5);
  EXPECT_LE(norm, 1e-5);
  EXPECT_LE(d.max_abs, 1e-4 * d.scale);
  // Rank-4 adapters on a random model learn slower than the model itself
  // (model_parallel_test's runs fall by more than 0.5).
  EXPECT_LT(want.loss[kSteps], want.loss[1] - 0.3) << "the adapters do not learn";
}

// clang-format off
INSTANTIATE_TEST_SUITE_P(
    Sweep, LoraParallelTest,
    ::testing::Values(
        Llama(Layout{2, 1, 1, 0, "1f1b", 2}),                  // DDP over the adapters
        Llama(Layout{2, 1, 1, 1, "1f1b", 2}),                  // ZeRO-1
        Llama(Layout{2, 1, 1, 2, "1f1b", 1}),                  // ZeRO-2, accumulation 2
        Llama(Layout{2, 1, 1, 3, "1f1b", 2}),                  // ZeRO-3: adapters sharded
        Llama(Layout{2, 2, 1, 0, "1f1b", 2}),                  // dp 2 × tp 2: A or B split
        Llama(Layout{2, 2, 1, 1, "1f1b", 2, "none", -1, true}), // tp 2 + sp, ZeRO-1
        Llama(Layout{1, 1, 2, 0, "1f1b", 2}),                  // pp 1F1B
        Llama(Layout{2, 1, 2, 0, "gpipe", 2}),                 // dp 2 × pp 2 GPipe
        Llama(Layout{1, 1, 1, 0, "1f1b", 4, "full"}),          // full recompute
        Llama(Layout{1, 1, 1, 0, "1f1b", 4, "selective"}),     // selective
        Cp(Llama(Layout{1, 1, 1, 0, "1f1b", 4}), 2)),          // cp 2
    [](const ::testing::TestParamInfo<Layout>& info) { return Name(info.param); });
// clang-format on

TEST(LoraTrainerTest, TheAdaptersCheckpointResumesTheRun) {
  const std::string dir = (TheCorpus().dir() / "lora_ckpt").string();
  // Saved from dp 2 × tp 2 (A or B split by tp, as the base weight).
  const Layout l = Llama(Layout{2, 2, 1, 1, "1f1b", 2});
  const Losses whole = Train(Adapted(l, dir), 1, "", /*save=*/true);
  // Resumed on another layout: one rank.
  const Losses resumed = Train(Adapted(Llama(Layout{}), dir), 11, checkpoint::StepDir(dir, 10));
  const double worst = Worst(resumed.loss, whole.loss, 11);
  std::printf(
      "[lora] dp 2 × tp 2 ZeRO-1 saved at step 10, resumed on 1 rank: step 20 %.6f vs %.6f, max "
      "rel diff %.3g\n",
      resumed.loss[kSteps], whole.loss[kSteps], worst);
  EXPECT_LE(worst, 1e-5);
}

// QLoRA: a Hugging Face Llama checkpoint PyTorch wrote (hf_llama_logits.py,
// bf16 safetensors) fine-tuned on two CPU ranks (DDP) with its linear layers
// frozen in NF4 (double-quantized absmax) and int8: the loss falls as on the
// full-precision base, and the frozen model each rank holds is the
// checkpoint's within the format's error.
TEST(LoraTrainerTest, QloraFineTunesAPyTorchWrittenLlamaCheckpoint) {
  const std::string python = "/usr/bin/python3";
  if (std::system((python + " -c 'import torch' >/dev/null 2>&1").c_str()) != 0) {
    GTEST_SKIP() << python << " cannot import torch (scripts/setup installs python3-torch)";
  }
  const std::string dir = (TheCorpus().dir() / "hf_llama").string();
  std::filesystem::create_directories(dir);
  const JobSpec plain = Adapted(Llama(Layout{2, 1, 1, 0, "1f1b", 2}));
  const model::ModelConfig c = *plain.model.Config();
  {
    std::ofstream s(dir + "/shape.txt");
    s << "layers " << c.layers << "\nheads " << c.heads << "\nkv_heads " << c.kv_heads << "\ndim "
      << c.dim << "\nffn_dim " << c.ffn_dim << "\nvocab " << c.vocab << "\nrope_theta "
      << c.rope_theta << "\nnorm_eps " << c.norm_eps << "\ntie 0\nbatch 1\nseq_len 4\n";
  }
  const std::string cmd = python + " " + SHARDTRAIN_HF_LLAMA_LOGITS_SCRIPT + " " + dir;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::vector<float> loaded;  // the bf16 base as the engine holds it
  std::map<std::string, Losses> runs;
  for (const char* base : {"bf16", "int8", "nf4"}) {
    absl::StatusOr<JobSpec> spec = ParseJobSpec(
        JobSpecToYaml(plain), {"model.init=" + dir, std::string("finetune.base_dtype=") + base});
    ASSERT_TRUE(spec.ok()) << spec.status();
    // What one rank holds (every rank holds the whole frozen model).
    JobSpec one = *spec;
    one.parallel.dp = 1;
    auto t = Trainer::Create(one, 0, 1, nullptr);
    ASSERT_TRUE(t.ok()) << t.status();
    engine::Engine& e = (*t)->engine();
    std::vector<float> held(e.frozen_layout().num_params());
    e.GetFrozen(held.data());
    if (loaded.empty()) loaded = held;
    double err = 0, norm = 0;
    for (size_t i = 0; i < held.size(); ++i) {
      err += double(held[i] - loaded[i]) * (held[i] - loaded[i]);
      norm += double(loaded[i]) * loaded[i];
    }
    runs[base] = Train(*spec);
    const Losses& r = runs[base];
    std::printf(
        "[qlora] HF Llama checkpoint (PyTorch), base %-4s: frozen %lld bytes, rel L2 error vs "
        "the bf16 checkpoint %.4f; loss step 1 %.4f, step 10 %.4f, step 20 %.4f (val %.4f)\n",
        base, static_cast<long long>(e.frozen_bytes()), std::sqrt(err / norm), r.loss[1],
        r.loss[10], r.loss[kSteps], r.val[kSteps]);
    EXPECT_LT(std::sqrt(err / norm), std::string(base) == "nf4" ? 0.12 : 0.01) << base;
    EXPECT_LT(r.loss[kSteps], r.loss[1] - 0.3) << base << ": the adapters do not learn";
    EXPECT_LT(std::abs(r.loss[kSteps] - runs["bf16"].loss[kSteps]), 0.05 * r.loss[kSteps])
        << base << " ends far from the full-precision base";
  }
}

// model.adapter: a PEFT adapter written by export --adapter starts a job
// with those adapters bit for bit (fp32), on any layout; one whose
// adapter_config.json disagrees with the spec is refused naming both values.
TEST(LoraTrainerTest, APeftAdapterLoadsBackAndAMismatchIsRefused) {
  const std::string dir = (TheCorpus().dir() / "peft").string();
  std::filesystem::create_directories(dir);
  const JobSpec spec = Adapted(Llama(Layout{}));
  auto trained = Trainer::Create(spec, 0, 1, nullptr);
  ASSERT_TRUE(trained.ok()) << trained.status();
  for (int step = 1; step <= 3; ++step) ASSERT_TRUE((*trained)->Step(step).ok());
  const absl::Span<const float> want = (*trained)->engine().params().f32();
  ASSERT_TRUE(
      checkpoint::ExportPeftAdapter(*spec.TrainedConfig(), want, dir, DataType::kFloat32).ok());
  JobSpec from = spec;
  from.model.adapter = dir;
  auto loaded = Trainer::Create(from, 0, 1, nullptr);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const absl::Span<const float> got = (*loaded)->engine().params().f32();
  ASSERT_EQ(got.size(), want.size());
  EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin()));
  // Under ZeRO-3 on two ranks each holds its shard of them: the merged
  // model gathered from them is the one rank's.
  absl::StatusOr<absl::Span<const float>> merged = (*loaded)->WholeModel();
  ASSERT_TRUE(merged.ok()) << merged.status();
  const std::vector<float> one(merged->begin(), merged->end());
  JobSpec sharded = Adapted(Llama(Layout{2, 1, 1, 3, "1f1b", 2}));
  sharded.model.adapter = dir;
  comm::testing::RunRanks(2, [&](comm::Communicator& comm) {
    auto t = Trainer::Create(sharded, comm.rank(), 1, &comm);
    ASSERT_TRUE(t.ok()) << t.status();
    absl::StatusOr<absl::Span<const float>> whole = (*t)->WholeModel();
    ASSERT_TRUE(whole.ok()) << whole.status();
    if (comm.rank() == 0) EXPECT_TRUE(std::equal(one.begin(), one.end(), whole->begin()));
  });
  JobSpec other = from;
  other.finetune.lora.rank = 2;
  auto refused = Trainer::Create(other, 0, 1, nullptr);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().message(),
            "model.adapter: " + dir + "/adapter_config.json: r 4, the spec's finetune.lora.rank 2");
  other = from;
  other.finetune.lora.targets = {"q", "v"};
  refused = Trainer::Create(other, 0, 1, nullptr);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().message(),
            "model.adapter: " + dir +
                "/adapter_config.json: target_modules [q_proj, k_proj, v_proj, o_proj, gate_proj, "
                "up_proj, down_proj], the spec's finetune.lora.targets [q, v]");
  EXPECT_FALSE(
      ParseJobSpec(JobSpecToYaml(TheCorpus().Spec(Llama(Layout{}))), {"model.adapter=" + dir})
          .ok());
}

TEST(LoraSpecTest, BadAdaptersAreRefusedNamingTheField) {
  const std::string base = JobSpecToYaml(TheCorpus().Spec(Llama(Layout{})));
  auto refused = [&](const std::string& set) {
    absl::StatusOr<JobSpec> s = ParseJobSpec(base, {set});
    EXPECT_FALSE(s.ok()) << set;
    return std::string(s.status().message());
  };
  EXPECT_EQ(refused("finetune.lora={rank: 20, targets: [q, k]}"),
            "finetune.lora.rank: 20 is larger than target k's (16, 32) weight allows (at most "
            "16)");
  EXPECT_EQ(refused("finetune.lora={targets: [q, w]}"),
            "finetune.lora.targets[1]: unknown target \"w\" (known: q, k, v, o, gate, up, down)");
  EXPECT_EQ(refused("finetune.lora={targets: [q, q]}"),
            "finetune.lora.targets[1]: \"q\" is listed twice");
  EXPECT_EQ(refused("finetune.lora={rank: 0}"), "finetune.lora.rank: must be >= 1, got 0");
  EXPECT_EQ(refused("finetune.base_dtype=nf4"),
            "finetune.base_dtype: nf4 quantizes a frozen model: it needs finetune.lora");
  EXPECT_EQ(refused("finetune.lora={dropout: 0.1}"),
            "finetune.lora.dropout: only 0 is supported so far, got 0.1");
  const std::string gpt2 = JobSpecToYaml(TheCorpus().Spec(Layout{}));
  absl::StatusOr<JobSpec> g = ParseJobSpec(gpt2, {"finetune.lora={targets: [gate]}"});
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().message(),
            "finetune.lora.targets: gate is not a layer of model.arch gpt2 (its MLP has no gate; "
            "use up and down)");
  // The defaults are PEFT's, and the spec round-trips.
  absl::StatusOr<JobSpec> d = ParseJobSpec(base, {"finetune.lora={}"});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->finetune.lora.rank, 8);
  EXPECT_EQ(d->finetune.lora.alpha, 8);
  EXPECT_EQ(d->finetune.lora.targets, (std::vector<std::string>{"q", "v"}));
  EXPECT_EQ(*ParseJobSpec(JobSpecToYaml(*d)), *d);
  // QLoRA's base: NF4 without double quantization, round-tripped.
  absl::StatusOr<JobSpec> q = ParseJobSpec(
      base, {"finetune.lora={}", "finetune.base_dtype=nf4", "finetune.double_quant=false"});
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->FrozenFormat().quant, model::FrozenQuant::kNf4);
  EXPECT_FALSE(q->FrozenFormat().double_quant);
  EXPECT_EQ(*ParseJobSpec(JobSpecToYaml(*q)), *q);
  // The frozen model's element: fp32 on CPU workers whatever the
  // precision (their engine computes in fp32), the compute type on GPUs.
  for (const char* device : {"cpu", "cuda"}) {
    absl::StatusOr<JobSpec> b = ParseJobSpec(
        base, {"finetune.lora={}", "precision=bf16", std::string("resources.device=") + device});
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(b->FrozenFormat().compute_bytes, std::string(device) == "cpu" ? 4 : 2) << device;
  }
}

}  // namespace
}  // namespace shardtrain::worker
