// Context parallelism (parallel.cp): each sequence split over cp ranks,
// two chunks each (model::ContextChunkPositions), attention a ring of
// key/value blocks merged by logsumexp, gradients summed over dp × cp.
// Through the same real parts as model_parallel_test.cc (CPU engine, DDP /
// ZeRO, the pipeline executor, Gloo over 127.0.0.1 between thread ranks):
// every layout trains like one rank on the same global batch, step by step
// within 1e-5 relative loss over 20 steps (fp32), with the same validation
// loss, for GPT-2 (learned positions follow the chunks) and Llama (rotary
// positions, grouped-query attention); a checkpoint of a cp job resumes
// without cp, and the reverse.
#include <cmath>
#include <cstdio>
#include <string>

#include "gtest/gtest.h"
#include "tests/unit/worker/model_parallel_util.h"

namespace shardtrain::worker {
namespace {
using namespace mp_test;  // NOLINT: the shared harness of this test family

class ContextParallelTest : public ::testing::TestWithParam<Layout> {};

TEST_P(ContextParallelTest, EqualsOneRankStepByStep) {
  const Layout l = GetParam();
  const Losses& ref = Reference(l.llama);
  ExpectSameLosses(l, Train(TheCorpus().Spec(l)), ref, "1 rank", 1e-5);
}

// Layout{dp, tp, pp, zero, schedule, micro, recompute, recompute_layers, sp}
// with Cp(·, cp). seq_len 32: cp 4 holds chunks of 4 tokens.
// clang-format off
INSTANTIATE_TEST_SUITE_P(
    Sweep, ContextParallelTest,
    ::testing::Values(
        // GPT-2: learned positions follow the chunks.
        Cp(Layout{1, 1, 1}, 2),
        Cp(Layout{1, 2, 1}, 2),                          // cp × tp
        Cp(Layout{2, 1, 1, 3, "1f1b", 2}, 2),            // dp × cp, ZeRO-3 over 4 ranks
        Cp(Layout{1, 1, 2, 0, "1f1b", 2}, 2),            // cp × pp
        Cp(Layout{1, 1, 1, 0, "1f1b", 4, "full"}, 2),    // the refill runs the ring again
        // Llama: rotary angles follow the chunks; grouped-query blocks.
        Cp(Llama(Layout{1, 1, 1}), 4),
        Cp(Llama(Layout{1, 2, 1, 0, "1f1b", 4, "none", -1, true}), 2),  // + sequence parallelism
        Cp(Llama(Layout{2, 1, 1, 3, "1f1b", 2}), 2),
        Cp(Llama(Layout{1, 1, 2, 0, "1f1b", 2}), 2),
        Cp(Llama(Layout{1, 1, 1, 0, "1f1b", 4, "selective"}), 2)),
    [](const ::testing::TestParamInfo<Layout>& info) { return Name(info.param); });
// clang-format on

// Saved with cp, resumed without (and on another cp layout); saved without,
// resumed with: steps 11-20 as the uninterrupted run of the saving layout.
TEST(ContextParallelResumeTest, CheckpointsMoveBetweenCpAndNoCp) {
  const Corpus& corpus = TheCorpus();
  struct Case {
    Layout saved;
    std::vector<Layout> resumed;
  };
  const Case cases[] = {
      {Cp(Llama(Layout{2, 1, 1, 1, "1f1b", 2}), 2),
       {Llama(Layout{1, 1, 1}), Llama(Layout{2, 1, 1, 2, "1f1b", 2}),
        Cp(Llama(Layout{1, 2, 1}), 2)}},
      {Llama(Layout{2, 1, 1, 1, "1f1b", 2}), {Cp(Llama(Layout{1, 1, 1}), 4)}},
  };
  int index = 0;
  for (const Case& c : cases) {
    const std::string ckpt = (corpus.dir() / ("cp_ckpt" + std::to_string(index++))).string();
    const Losses whole = Train(corpus.Spec(c.saved, ckpt), 1, "", /*save=*/true);
    const std::string step10 = checkpoint::StepDir(ckpt, 10);
    for (const Layout& l : c.resumed) {
      const Losses resumed = Train(corpus.Spec(l), 11, step10);
      const double worst = Worst(resumed.loss, whole.loss, 11);
      std::printf(
          "saved on %s, resumed on %s: steps 11-20 max rel loss diff %.3g vs uninterrupted\n",
          Name(c.saved).c_str(), Name(l).c_str(), worst);
      EXPECT_LE(worst, 1e-5) << Name(l);
    }
  }
}

}  // namespace
}  // namespace shardtrain::worker
