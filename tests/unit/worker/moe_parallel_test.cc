// Mixture-of-Experts models under every parallelism that runs all experts
// on each rank (ep 1), through the same real parts as llama_parallel_test.cc
// (CPU engine slices, DDP / ZeRO, the pipeline executor, Gloo over
// 127.0.0.1 between thread ranks): each layout trains like one rank on the
// same global batch, step by step within 1e-5 relative loss over 20 steps
// (fp32), with the same gradient norm — the expert gradients' scale
// included (pytorch/pytorch#160285 was a 2× error there) — and the same
// validation loss. The balancing losses are per micro-batch, so the one rank
// groups the global batch as the layout does (its micro-batch size).
#include <cstdio>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/worker/model_parallel_util.h"

namespace shardtrain::worker {
namespace {
using namespace mp_test;  // NOLINT: the shared harness of this test family

class MoeParallelTest : public ::testing::TestWithParam<Layout> {};

TEST_P(MoeParallelTest, EqualsOneRankStepByStep) {
  const Layout l = GetParam();
  const Losses& ref = Reference(/*llama=*/true, /*qwen3=*/false, l.moe, l.micro);
  ExpectSameLossesAndNorms(l, Train(TheCorpus().Spec(l)), ref, 1e-5);
}

// Layout{dp, tp, pp, zero, schedule, micro, recompute, recompute_layers, sp}.
// tp splits every expert's hidden units (their outputs summed with the
// shared expert's before the reduction; the gates' gradient summed over tp
// first); cp sums the expert load over the ring for the balancing loss.
// clang-format off
INSTANTIATE_TEST_SUITE_P(
    Sweep, MoeParallelTest,
    ::testing::Values(
        Moe(Layout{2, 1, 1, 0, "1f1b", 2}),                          // DDP
        Moe(Layout{2, 1, 1, 3, "1f1b", 2}),                          // ZeRO-3
        Moe(Layout{1, 2, 1, 0, "1f1b", 4, "none", -1, true}),        // tp + sp
        Moe(Layout{1, 1, 2, 0, "1f1b", 2}),                          // pp 1F1B
        Moe(Layout{1, 1, 1, 0, "1f1b", 4, "full"}),                  // full recompute
        Cp(Moe(Layout{1, 1, 1, 0, "1f1b", 4}), 2),                   // cp: the load over the ring
        Moe(Layout{2, 2, 1, 1, "1f1b", 2}, 2),                       // DeepSeek's: dp × tp, ZeRO-1
        Moe(Layout{1, 2, 2, 0, "1f1b", 2, "selective", -1, true}, 2),  // tp + sp + pp
        // Expert parallelism: the experts split over ep ranks of the
        // replicas, every pair sent to its expert's rank and back.
        Ep(Moe(Layout{2, 1, 1, 0, "1f1b", 2}), 2),                   // ep 2
        Ep(Moe(Layout{4, 1, 1, 0, "1f1b", 1}), 4),                   // ep 4: one expert each
        Ep(Moe(Layout{4, 1, 1, 0, "1f1b", 2}), 2),                   // dp 2 × ep 2
        Ep(Moe(Layout{2, 2, 1, 0, "1f1b", 2, "none", -1, true}), 2),  // ep 2 × tp 2 + sp
        Ep(Moe(Layout{2, 1, 2, 0, "1f1b", 2}), 2),                   // ep 2 × pp 2 (1F1B)
        Ep(Cp(Moe(Layout{1, 1, 1, 0, "1f1b", 4}), 2), 2),            // ep 2 over the cp ranks
        Ep(Moe(Layout{2, 1, 1, 0, "1f1b", 2, "full"}), 2),           // ep 2, full recompute
        Ep(Moe(Layout{2, 1, 1, 0, "1f1b", 2, "selective"}), 2),      // ep 2, selective
        Ep(Moe(Layout{2, 2, 1, 0, "1f1b", 2}, 2), 2),                // DeepSeek's: 6 experts, 3 each
        // ZeRO under expert parallelism: the experts' state sharded over
        // the ranks holding the same experts, the rest over the replicas.
        Ep(Moe(Layout{4, 1, 1, 1, "1f1b", 2}), 2),                   // ep 2, ZeRO-1 (2 per group)
        Ep(Moe(Layout{4, 1, 1, 2, "1f1b", 1}), 2),                   // ep 2, ZeRO-2, accumulation 2
        Ep(Moe(Layout{4, 1, 1, 3, "1f1b", 2}), 2),                   // ep 2, ZeRO-3
        Ep(Moe(Layout{2, 1, 1, 3, "1f1b", 2}), 2),                   // ep 2 = dp: experts unsharded
        Ep(Moe(Layout{2, 2, 1, 1, "1f1b", 2}, 2), 2),                // ep 2 × tp 2, ZeRO-1
        // Aux-loss-free balancing: the biases move alike on every rank (the
        // step's loads summed over the replicas).
        Moe(Layout{2, 1, 1, 1, "1f1b", 2}, 3),                       // dp 2, ZeRO-1
        Ep(Moe(Layout{2, 2, 1, 0, "1f1b", 2}, 3), 2),                // ep 2 × tp 2
        Moe(Layout{1, 1, 2, 0, "1f1b", 2}, 3)),                      // pp 2
    [](const ::testing::TestParamInfo<Layout>& info) { return Name(info.param); });
// clang-format on

// The aux-loss-free bias updates change the training (a run without them,
// the same otherwise, differs): the equality above is not vacuous.
TEST(MoeAuxFreeTest, TheBiasUpdatesChangeTheRun) {
  const Losses &with = Reference(true, false, 3, 2), &without = Reference(true, false, 4, 2);
  const double differs = Worst(with.loss, without.loss);
  std::printf(
      "aux-loss-free bias updates: loss step 20 %.6f, without them %.6f (max rel diff "
      "%.3g)\n",
      with.loss[kSteps], without.loss[kSteps], differs);
  EXPECT_GT(differs, 1e-4);
}

// Checkpoints of an MoE model resume on other layouts like the
// uninterrupted run (micro-batches of 2 sequences in all: the balancing
// losses are per micro-batch): saved on dp 2 × tp 2 with ZeRO-1 (every
// expert's hidden units split over tp), on ep 2 × tp 2 (each rank half the
// experts), on one rank and on ep 2 with ZeRO-3 (each half of the experts
// sharded over 2 ranks); resumed on one rank, pp 2, ep 4 (with ZeRO-1) and
// ep 2.
TEST(MoeParallelResumeTest, CheckpointsResumeAcrossLayoutsAndExpertSplits) {
  const Corpus& corpus = TheCorpus();
  struct Case {
    Layout saved;
    std::vector<Layout> resumed;
  };
  const std::vector<Case> cases = {
      {Moe(Layout{2, 2, 1, 1, "1f1b", 2}),
       {Moe(Layout{1, 1, 1, 0, "1f1b", 2}), Moe(Layout{1, 1, 2, 0, "1f1b", 2})}},
      {Ep(Moe(Layout{2, 2, 1, 0, "1f1b", 2}), 2),
       {Moe(Layout{1, 1, 1, 0, "1f1b", 2}), Ep(Moe(Layout{4, 1, 1, 0, "1f1b", 2}), 4)}},
      {Moe(Layout{1, 1, 1, 0, "1f1b", 2}),
       {Ep(Moe(Layout{4, 1, 1, 0, "1f1b", 2}), 4), Ep(Moe(Layout{2, 1, 2, 0, "1f1b", 2}), 2)}},
      // ZeRO-3 shards of each ep group's experts over its 2 ranks.
      {Ep(Moe(Layout{4, 1, 1, 3, "1f1b", 2}), 2),
       {Moe(Layout{1, 1, 1, 0, "1f1b", 2}), Ep(Moe(Layout{4, 1, 1, 1, "1f1b", 2}), 4)}},
  };
  int k = 0;
  for (const Case& c : cases) {
    const std::string ckpt = (corpus.dir() / ("moe_ckpt" + std::to_string(k++))).string();
    const Losses whole = Train(corpus.Spec(c.saved, ckpt), 1, "", /*save=*/true);
    const std::string step10 = checkpoint::StepDir(ckpt, 10);
    for (const Layout& l : c.resumed) {
      const Losses resumed = Train(corpus.Spec(l), 11, step10);
      const double worst = Worst(resumed.loss, whole.loss, 11);
      std::printf("moe saved on %s, resumed on %s: steps 11-20 max rel loss diff %.3g\n",
                  Name(c.saved).c_str(), Name(l).c_str(), worst);
      EXPECT_LE(worst, 1e-5) << Name(c.saved) << " -> " << Name(l);
    }
  }
}

}  // namespace
}  // namespace shardtrain::worker
