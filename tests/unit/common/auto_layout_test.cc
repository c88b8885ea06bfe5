// AutoLayout (common/auto_layout.h): every candidate is a layout the model
// allows, planned as MakePlan plans the spec with the candidate's --set
// overrides; the budget splits fitting from too big; the ranking follows the
// stated cost model.
#include "common/auto_layout.h"

#include <climits>
#include <cstdio>
#include <set>
#include <tuple>

#include "common/model/lora.h"
#include "common/model/weight_quant.h"
#include "tests/unit/common/planner_test_util.h"

namespace shardtrain {
namespace {

JobSpec Gpt2() {
  absl::StatusOr<JobSpec> s = ParseJobSpec(ReadFile(kSourceDir + "/examples/gpt2-124m-zero3.yaml"));
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

constexpr int64_t kGiB = int64_t{1} << 30;

TEST(AutoLayoutTest, Gpt2On8RanksPlansEveryAllowedLayout) {
  const JobSpec spec = Gpt2();
  const std::string yaml = ReadFile(kSourceDir + "/examples/gpt2-124m-zero3.yaml");
  for (int64_t budget : {4 * kGiB, 80 * kGiB}) {
    SCOPED_TRACE(testing::Message() << "budget " << budget);
    AutoLayoutOptions opt;
    opt.ranks = 8;
    opt.memory_per_rank = budget;
    const AutoLayoutResult r = *AutoLayout(spec, opt);
    // tp in {1, 2, 4} (12 heads), pp | 8 / tp, zero 0..3 with pp = 1, 0..2 otherwise:
    // meshes with pp = 1: tp 1, 2, 4 (4 stages of ZeRO each); with pp > 1:
    // (1,2) (1,4) (1,8) (2,2) (2,4) (4,2), 3 each.
    std::set<std::tuple<int, int, int, int>> seen;
    for (const auto* list : {&r.fitting, &r.too_big}) {
      for (const LayoutCandidate& c : *list) {
        EXPECT_EQ(c.dp * c.tp * c.pp, 8);
        EXPECT_EQ(12 % c.tp, 0);
        EXPECT_TRUE(c.zero <= 2 || c.pp == 1);
        EXPECT_TRUE(seen.insert({c.dp, c.tp, c.pp, c.zero}).second);
        EXPECT_FALSE(c.micro_adjusted);  // 64 = 8 × 8 divides every dp
        EXPECT_EQ(list == &r.fitting, c.peak_memory <= budget);
        // The candidate is the plan of the spec with its overrides.
        absl::StatusOr<JobSpec> alt = ParseJobSpec(yaml, c.Overrides(spec));
        ASSERT_TRUE(alt.ok()) << alt.status();
        const v1::Plan p = *MakePlan(*alt, 8);
        EXPECT_EQ(p.memory_per_rank().total_bytes(), c.peak_memory);
        EXPECT_DOUBLE_EQ(c.bubble, p.bubble_fraction());
        const double compute = 6.0 * p.num_params() * 64 * 1024 / (8 * 100e12) / (1 - c.bubble) *
                               (1 + c.recompute_share);
        EXPECT_NEAR(c.compute_s, compute, 1e-12);
        EXPECT_NEAR(c.tp_s, p.tp_comm_bytes_per_step() / 300e9, 1e-12);
        EXPECT_NEAR(c.pp_s, p.pp_comm_bytes_per_step() / 25e9, 1e-12);
        EXPECT_NEAR(c.dp_s, p.dp_comm_bytes_per_step() / 25e9, 1e-12);
      }
    }
    EXPECT_EQ(seen.size(), 3u * 4 + 6u * 3);
    ASSERT_FALSE(r.fitting.empty());
    for (size_t i = 1; i < r.fitting.size(); ++i) {
      EXPECT_LE(r.fitting[i - 1].step_s(), r.fitting[i].step_s());
    }
    const std::string text = AutoLayoutText(spec, opt, r);
    EXPECT_NE(text.find("chosen: dp "), std::string::npos) << text;
    EXPECT_NE(text.find("--set parallel.dp="), std::string::npos) << text;
    EXPECT_NE(text.find("compute = 6 · params"), std::string::npos) << text;
  }
}

// An MoE model's search adds expert parallelism: every ep dividing dp · cp
// and the experts, with ZeRO 0, each planned as its overrides plan it (the
// all-to-all bytes counted over the link); the compute counts the
// parameters a token uses.
TEST(AutoLayoutTest, MoeModelsSearchExpertParallelism) {
  const std::string yaml = ReadFile(kSourceDir + "/examples/moe-fortunes.yaml");
  const JobSpec spec = *ParseJobSpec(yaml);
  AutoLayoutOptions opt;
  opt.ranks = 4;
  opt.memory_per_rank = 80 * kGiB;
  const AutoLayoutResult r = *AutoLayout(spec, opt);
  std::set<int> eps;
  for (const LayoutCandidate& c : r.fitting) {
    eps.insert(c.ep);
    EXPECT_EQ((c.dp * c.cp) % c.ep, 0);
    absl::StatusOr<JobSpec> alt = ParseJobSpec(yaml, c.Overrides(spec));
    ASSERT_TRUE(alt.ok()) << alt.status();
    EXPECT_EQ(alt->parallel.ep, c.ep);
    const v1::Plan p = *MakePlan(*alt, 4);
    EXPECT_EQ(p.memory_per_rank().total_bytes(), c.peak_memory);
    // An ep group inside a node (tp · ep <= 8 ranks) sends at the tp bandwidth.
    EXPECT_NEAR(c.ep_s, p.ep_comm_bytes_per_step() / (c.tp * c.ep <= 8 ? 300e9 : 25e9), 1e-12);
    EXPECT_NEAR(c.model_flops_per_rank * c.step_s() * 4,
                6.0 * double(r.num_params) * spec.batch.global * spec.batch.seq_len,
                1e-6 * c.model_flops_per_rank * c.step_s() * 4);
    EXPECT_EQ(c.ep > 1, p.ep_comm_bytes_per_step() > 0);
  }
  EXPECT_EQ(eps, (std::set<int>{1, 2, 4}));  // dp 4: ep 1, 2, 4 (4 experts)
  EXPECT_EQ(r.num_params, model::ActiveModelParams(*spec.model.Config()));
  EXPECT_NE(AutoLayoutText(spec, opt, r, /*top=*/100).find("  EP"), std::string::npos);
}

// The MoE examples plan with their models' published parameter counts
// (Mixtral 8x7B: 46.7B, 12.9B active; Qwen3-30B-A3B: 30.5B, 3.3B active),
// the ep groups and the all-to-all bytes of Qwen3's ep 8.
TEST(AutoLayoutTest, TheMoeExamplesPlanWithTheirPublishedCounts) {
  for (const char* name : {"mixtral-8x7b", "qwen3-30b-a3b"}) {
    const JobSpec spec = *ParseJobSpec(ReadFile(kSourceDir + "/examples/" + name + ".yaml"));
    const absl::StatusOr<v1::Plan> plan = MakePlan(spec, spec.World());
    ASSERT_TRUE(plan.ok()) << plan.status();
    const bool mixtral = std::string(name) == "mixtral-8x7b";
    EXPECT_EQ(plan->num_params(), mixtral ? 46702792704 : 30532122624) << name;
    EXPECT_EQ(model::ActiveModelParams(*spec.model.Config()), mixtral ? 12879925248 : 3353032704)
        << name;
    const std::string text = PlanText(spec, *plan);
    EXPECT_NE(text.find("active per token"), std::string::npos) << text;
    if (!mixtral) {
      EXPECT_EQ(plan->ep(), 8);
      EXPECT_GT(plan->ep_comm_bytes_per_step(), 0);
      EXPECT_NE(text.find("ep groups [0 2 4 6 8 10 12 14]"), std::string::npos) << text;
    }
  }
}

// A layout over the budget is planned again with more recomputation,
// cheapest first, and kept with the first that fits: the step below it on
// the ladder (none → selective → full K=1, 2, ... → full) does not fit.
TEST(AutoLayoutTest, RecomputationTurnedOnOnlyWhereItMustBe) {
  const JobSpec spec = Gpt2();
  const std::string yaml = ReadFile(kSourceDir + "/examples/gpt2-124m-zero3.yaml");
  AutoLayoutOptions opt;
  opt.ranks = 8;
  opt.memory_per_rank = 2 * kGiB;
  const AutoLayoutResult r = *AutoLayout(spec, opt);
  int turned_on = 0, full = 0;
  for (const LayoutCandidate& c : r.fitting) {
    SCOPED_TRACE(testing::Message() << c.dp << "x" << c.tp << "x" << c.pp << " zero " << c.zero);
    absl::StatusOr<JobSpec> alt = ParseJobSpec(yaml, c.Overrides(spec));
    ASSERT_TRUE(alt.ok()) << alt.status();
    EXPECT_EQ(MakePlan(*alt, 8)->memory_per_rank().total_bytes(), c.peak_memory);
    if (c.memory_without == 0) {
      EXPECT_EQ(c.recompute, Recompute::kNone);
      continue;
    }
    ++turned_on;
    EXPECT_GT(c.memory_without, opt.memory_per_rank);
    EXPECT_GT(c.recompute_share, 0);
    // One rung down the ladder does not fit.
    JobSpec less = *alt;
    if (c.recompute == Recompute::kSelective) {
      less.model.recompute = Recompute::kNone;
    } else if (c.recompute_layers > 1) {
      less.model.recompute_layers = c.recompute_layers - 1;
    } else {
      less.model.recompute = Recompute::kSelective;
      less.model.recompute_layers = -1;
    }
    if (c.recompute == Recompute::kFull) ++full;
    EXPECT_GT(MakePlan(less, 8)->memory_per_rank().total_bytes(), opt.memory_per_rank);
  }
  EXPECT_GT(turned_on, 0);
  std::printf("2 GiB on 8 ranks: %zu layouts fit, %d of them with recomputation (%d full)\n",
              r.fitting.size(), turned_on, full);
  const std::string text = AutoLayoutText(spec, opt, r);
  EXPECT_NE(text.find("recomputation turned on"), std::string::npos) << text;
}

TEST(AutoLayoutTest, SmallerBudgetFitsFewer) {
  AutoLayoutOptions opt;
  opt.ranks = 8;
  opt.memory_per_rank = 80 * kGiB;
  const AutoLayoutResult big = *AutoLayout(Gpt2(), opt);
  opt.memory_per_rank = kGiB;  // 4 GiB: all fit, some with recomputation
  const AutoLayoutResult small = *AutoLayout(Gpt2(), opt);
  EXPECT_LT(small.fitting.size(), big.fitting.size());
  EXPECT_FALSE(small.too_big.empty());
  EXPECT_EQ(small.fitting.size() + small.too_big.size(), big.fitting.size() + big.too_big.size());
}

TEST(AutoLayoutTest, NothingFits) {
  AutoLayoutOptions opt;
  opt.ranks = 8;
  opt.memory_per_rank = 1 << 20;
  const AutoLayoutResult r = *AutoLayout(Gpt2(), opt);
  EXPECT_TRUE(r.fitting.empty());
  ASSERT_FALSE(r.too_big.empty());
  for (size_t i = 1; i < r.too_big.size(); ++i) {
    EXPECT_LE(r.too_big[i - 1].peak_memory, r.too_big[i].peak_memory);
  }
  EXPECT_NE(AutoLayoutText(Gpt2(), opt, r).find("nothing fits"), std::string::npos);
}

TEST(AutoLayoutTest, MicroLoweredOnlyWhenItMustBe) {
  JobSpec s = SmallSpec(1, 1, 1);
  s.batch = {/*global=*/12, /*micro=*/4, /*seq_len=*/16};
  AutoLayoutOptions opt;
  opt.ranks = 4;
  opt.memory_per_rank = 80 * kGiB;
  const AutoLayoutResult r = *AutoLayout(s, opt);
  bool saw_dp4 = false, saw_dp1 = false;
  for (const LayoutCandidate& c : r.fitting) {
    EXPECT_EQ(12 % (c.micro * c.dp), 0);
    if (c.dp == 4) {
      saw_dp4 = true;
      EXPECT_EQ(c.micro, 3);  // 4 × 4 does not divide 12; 3 × 4 does
      EXPECT_TRUE(c.micro_adjusted);
      const std::vector<std::string> o = c.Overrides(s);
      EXPECT_NE(std::find(o.begin(), o.end(), "batch.micro=3"), o.end());
    }
    if (c.dp == 1) {
      saw_dp1 = true;
      EXPECT_EQ(c.micro, 4);
      EXPECT_FALSE(c.micro_adjusted);
    }
  }
  EXPECT_TRUE(saw_dp4);
  EXPECT_TRUE(saw_dp1);
}

TEST(AutoLayoutTest, BadOptions) {
  AutoLayoutOptions opt;
  opt.memory_per_rank = kGiB;
  EXPECT_EQ(AutoLayout(Gpt2(), opt).status().message(), "--ranks: must be >= 1, got 0");
  opt.ranks = 8;
  opt.memory_per_rank = 0;
  EXPECT_FALSE(AutoLayout(Gpt2(), opt).ok());
}

TEST(ParseByteSizeTest, Units) {
  EXPECT_EQ(*ParseByteSize("4GiB", "--memory-per-rank"), 4 * kGiB);
  EXPECT_EQ(*ParseByteSize("80 GiB", "x"), 80 * kGiB);
  EXPECT_EQ(*ParseByteSize("512MiB", "x"), 512 << 20);
  EXPECT_EQ(*ParseByteSize("1.5GB", "x"), 1500000000);
  EXPECT_EQ(*ParseByteSize("1000", "x"), 1000);
  EXPECT_EQ(ParseByteSize("4gib", "--memory-per-rank").status().message(),
            "--memory-per-rank: expected a size such as 4GiB, 512MiB or 80GB, got \"4gib\"");
  for (const char* bad : {"", "GiB", "-1GiB", "0", "inf", "4 GiBs"}) {
    EXPECT_FALSE(ParseByteSize(bad, "x").ok()) << bad;
  }
}

// A spec with context parallelism keeps its cp: the other factors share
// ranks / cp, each candidate's ring bytes are in its step time, and ranks
// that cp does not divide are refused naming both.
TEST(AutoLayoutTest, ContextParallelIsKeptAsTheSpecHasIt) {
  const std::string yaml = ReadFile(kSourceDir + "/examples/llama-long-cp.yaml");
  const JobSpec spec = *ParseJobSpec(yaml);
  ASSERT_EQ(spec.parallel.cp, 4);
  AutoLayoutOptions opt;
  opt.ranks = 8;
  opt.memory_per_rank = kGiB;
  const AutoLayoutResult r = *AutoLayout(spec, opt);
  ASSERT_FALSE(r.fitting.empty());
  for (const LayoutCandidate& c : r.fitting) {
    EXPECT_EQ(c.dp * c.tp * c.pp, 2);
    absl::StatusOr<JobSpec> alt = ParseJobSpec(yaml, c.Overrides(spec));
    ASSERT_TRUE(alt.ok()) << alt.status();
    const v1::Plan p = *MakePlan(*alt, 8);
    EXPECT_EQ(p.cp(), 4);
    EXPECT_GT(p.cp_comm_bytes_per_step(), 0);
    EXPECT_NEAR(c.cp_s, p.cp_comm_bytes_per_step() / 25e9, 1e-12);
  }
  opt.ranks = 6;
  const absl::Status odd = AutoLayout(spec, opt).status();
  EXPECT_NE(odd.message().find("--ranks: 6 is not a multiple of the spec's parallel.cp 4"),
            std::string::npos)
      << odd;
}

}  // namespace
// A long sequence on CPU ranks with no parallel.cp: the search also splits
// each sequence over cp = 2, 4, 8 ranks (2·cp divides seq_len 2048), whose
// activations shrink ∝ 1/cp; under a budget no cp = 1 layout meets even with
// full recomputation, what fits — and is chosen — splits the sequence, as
// MakePlan plans it from the candidate's overrides. A short sequence (or a
// GPU spec) is searched without cp.
TEST(AutoLayoutTest, LongSequencesOnCpuRanksTryContextParallelism) {
  const std::string yaml = ReadFile(kSourceDir + "/examples/llama-long-cp.yaml");
  const JobSpec spec = *ParseJobSpec(yaml, {"parallel.cp=1"});
  ASSERT_EQ(spec.parallel.cp, 1);
  ASSERT_EQ(spec.batch.seq_len, 2048);
  AutoLayoutOptions opt;
  opt.ranks = 8;
  opt.memory_per_rank = 1;  // nothing fits: too_big holds each layout's least need
  const AutoLayoutResult all = *AutoLayout(spec, opt);
  std::set<int> cps;
  int64_t least_cp1 = INT64_MAX, least_split = INT64_MAX;
  for (const LayoutCandidate& c : all.too_big) {
    cps.insert(c.cp);
    EXPECT_EQ(c.dp * c.cp * c.tp * c.pp, 8);
    (c.cp == 1 ? least_cp1 : least_split) =
        std::min(c.cp == 1 ? least_cp1 : least_split, c.peak_memory);
  }
  EXPECT_EQ(cps, (std::set<int>{1, 2, 4, 8}));
  ASSERT_LT(least_split, least_cp1);
  opt.memory_per_rank = least_split;
  const AutoLayoutResult r = *AutoLayout(spec, opt);
  ASSERT_FALSE(r.fitting.empty());
  for (const LayoutCandidate& c : r.fitting) {
    EXPECT_GT(c.cp, 1);
    absl::StatusOr<JobSpec> alt = ParseJobSpec(yaml, [&] {
      std::vector<std::string> sets = {"parallel.cp=1"};
      for (const std::string& o : c.Overrides(spec)) sets.push_back(o);
      return sets;
    }());
    ASSERT_TRUE(alt.ok()) << alt.status();
    const v1::Plan p = *MakePlan(*alt, 8);
    EXPECT_EQ(p.cp(), c.cp);
    EXPECT_EQ(p.memory_per_rank().total_bytes(), c.peak_memory);
    EXPECT_NEAR(c.cp_s, p.cp_comm_bytes_per_step() / 25e9, 1e-12);
  }
  const std::string text = AutoLayoutText(spec, opt, r);
  EXPECT_NE(text.find("parallel.cp 1, 2, 4, 8 tried: seq_len 2048 >= 2048 on CPU ranks"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find(absl::StrCat("chosen: dp ", r.fitting[0].dp, " · cp ", r.fitting[0].cp)),
            std::string::npos)
      << text;
  std::printf("%s", text.c_str());
  // GPT-2 on GPUs at 1024 tokens: no cp.
  opt.memory_per_rank = 80 * kGiB;
  const absl::StatusOr<AutoLayoutResult> gpt2 = AutoLayout(Gpt2(), opt);
  ASSERT_TRUE(gpt2.ok()) << gpt2.status();
  ASSERT_FALSE(gpt2->fitting.empty());
  for (const LayoutCandidate& c : gpt2->fitting) EXPECT_EQ(c.cp, 1);
}

}  // namespace shardtrain

namespace shardtrain {
namespace {

// QLoRA (issue 51): examples/llama3-8b-qlora.yaml fits one 24 GiB GPU —
// --auto on one rank finds layouts that fit, its frozen model is the NF4
// model's bytes — and the plan compares the ways to fine-tune it: each
// choice needs less than the one before, full training's model state is
// the ZeRO paper's 18 bytes per parameter (12 with 8-bit AdamW), and the
// cost model counts 4 FLOPs per frozen weight and 6 per adapter parameter.
// A fine-tune of an MoE model (model.init, no adapters): the comparison's
// LoRA rows say why they cannot run rather than failing the plan.
TEST(AutoLayoutTest, TheFinetuneComparisonOfAnMoeModelRefusesItsLoraRows) {
  const JobSpec spec = *ParseJobSpec(ReadFile(kSourceDir + "/examples/moe-fortunes.yaml"),
                                     {"model.init=/a/checkpoint"});
  const absl::StatusOr<v1::Plan> plan = MakePlan(spec, spec.World());
  ASSERT_TRUE(plan.ok()) << plan.status();
  const std::string text = FinetuneComparison(spec, *plan);
  EXPECT_NE(text.find("*full, AdamW fp32 state"), std::string::npos) << text;
  EXPECT_NE(text.find(" QLoRA (NF4 weights)           refused: finetune.lora: adapters on a "
                      "model with model.moe are not supported yet"),
            std::string::npos)
      << text;
}

TEST(AutoLayoutTest, QloraOnLlama3_8bFitsOne24GiBGpu) {
  const JobSpec spec = *ParseJobSpec(ReadFile(kSourceDir + "/examples/llama3-8b-qlora.yaml"));
  const absl::StatusOr<v1::Plan> plan = MakePlan(spec, 1);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const v1::MemoryEstimate& m = plan->memory_per_rank();
  const model::ModelConfig c = *spec.TrainedConfig();
  EXPECT_EQ(m.frozen_bytes(),
            model::FrozenModelBytes(model::ParamLayout(model::BaseConfig(c)), spec.FrozenFormat()));
  EXPECT_LT(m.total_bytes(), 24 * kGiB);
  EXPECT_EQ(plan->num_params(), model::LoraParams(c));
  AutoLayoutOptions opt;
  opt.ranks = 1;
  opt.memory_per_rank = 24 * kGiB;
  const absl::StatusOr<AutoLayoutResult> r = AutoLayout(spec, opt);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_FALSE(r->fitting.empty());
  const double tokens = double(spec.batch.global) * spec.batch.seq_len;
  const LayoutCandidate& best = r->fitting.front();
  EXPECT_NEAR(best.model_flops_per_rank * best.step_s(),
              (4.0 * double(r->num_params) + 6.0 * double(model::LoraParams(c))) * tokens,
              1e-6 * best.model_flops_per_rank * best.step_s());
  const std::string text = PlanText(spec, *plan);
  std::printf("%s", FinetuneComparison(spec, *plan).c_str());
  // Every choice planned, each needing less than the one before.
  double previous = 1e30;
  for (const char* row :
       {" full, AdamW fp32 state", " full, 8-bit AdamW", " LoRA on the bf16 model",
        " LoRA on int8 weights", "*QLoRA (NF4 weights)"}) {
    const size_t at = text.find(row);
    ASSERT_NE(at, std::string::npos) << row << "\n" << text;
    std::istringstream line(text.substr(at + 29, text.find('\n', at) - at - 29));
    std::string trained, unit, frozen, fu, state, su, acts, au, total, tu;
    line >> trained >> unit >> frozen >> fu >> state >> su >> acts >> au >> total >> tu;
    const double gib = std::stod(total) * (tu == "GiB" ? 1 : tu == "MiB" ? 1.0 / 1024 : 0);
    EXPECT_LT(gib, previous) << row;
    previous = gib;
  }
  EXPECT_NE(text.find(" full, AdamW fp32 state                8.03 B           0 B   134.62 GiB"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("*QLoRA (NF4 weights)                   41.9 M      5.31 GiB"),
            std::string::npos)
      << text;
}

}  // namespace
}  // namespace shardtrain
