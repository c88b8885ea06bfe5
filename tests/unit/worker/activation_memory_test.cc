// Activation memory options through real parts (CPU engine slices, DDP /
// ZeRO, the pipeline executor, Gloo over 127.0.0.1 between thread ranks):
// recomputation (model.recompute selective or full, and full on the first
// block of each stage only) trains exactly like keeping every activation,
// step by step over 20 steps on one rank, tp2, pp2 1F1B, dp2×tp2×pp2
// with ZeRO-1, and dp2 with ZeRO-2 and ZeRO-3 (the refill gathers the
// block's parameters inside its backward's scope); a checkpoint saved
// without recomputation resumes with it (and with sequence parallelism).
// Sequence parallelism (parallel.sequence_parallel) trains like tensor
// parallelism without it within 1e-5, alone and with pipelines, ZeRO and
// recomputation.
#include <cmath>
#include <cstdio>
#include <string>

#include "gtest/gtest.h"
#include "tests/unit/worker/model_parallel_util.h"

namespace shardtrain::worker {
namespace {
using namespace mp_test;  // NOLINT: the shared harness of this test family

// The same layout keeping every activation.
Layout WithoutRecompute(Layout l) {
  l.recompute = "none";
  l.recompute_layers = -1;
  return l;
}

class RecomputeTest : public ::testing::TestWithParam<Layout> {};

TEST_P(RecomputeTest, EqualsKeepingEveryActivationStepByStep) {
  const Layout l = GetParam();
  ExpectSameLosses(l, Train(TheCorpus().Spec(l)), Train(TheCorpus().Spec(WithoutRecompute(l))),
                   "none", 1e-6);
}

// clang-format off
INSTANTIATE_TEST_SUITE_P(
    Sweep, RecomputeTest,
    ::testing::Values(
        Layout{1, 1, 1, 0, "1f1b", 4, "selective"}, Layout{1, 1, 1, 0, "1f1b", 4, "full"},
        Layout{1, 2, 1, 0, "1f1b", 4, "selective"}, Layout{1, 2, 1, 0, "1f1b", 4, "full"},
        Layout{1, 1, 2, 0, "1f1b", 2, "selective"}, Layout{1, 1, 2, 0, "1f1b", 2, "full"},
        Layout{1, 1, 2, 0, "gpipe", 2, "full", 1},
        Layout{2, 2, 2, 1, "1f1b", 2, "selective"}, Layout{2, 2, 2, 1, "1f1b", 2, "full"},
        Layout{2, 1, 1, 2, "1f1b", 4, "selective"}, Layout{2, 1, 1, 3, "1f1b", 4, "full"}),
    [](const ::testing::TestParamInfo<Layout>& info) { return Name(info.param); });
// clang-format on

// The same layout without sequence parallelism.
Layout WithoutSequenceParallel(Layout l) {
  l.sp = false;
  return l;
}

class SequenceParallelTest : public ::testing::TestWithParam<Layout> {};

TEST_P(SequenceParallelTest, EqualsTensorParallelWithoutIt) {
  const Layout l = GetParam();
  ExpectSameLosses(l, Train(TheCorpus().Spec(l)),
                   Train(TheCorpus().Spec(WithoutSequenceParallel(l))), "without sp", 1e-5);
}

// clang-format off
INSTANTIATE_TEST_SUITE_P(
    Sweep, SequenceParallelTest,
    ::testing::Values(
        Layout{1, 2, 1, 0, "1f1b", 4, "none", -1, true},
        Layout{1, 4, 1, 0, "1f1b", 4, "none", -1, true},
        Layout{1, 2, 2, 0, "1f1b", 4, "none", -1, true},
        Layout{2, 2, 1, 2, "1f1b", 2, "none", -1, true},
        Layout{2, 2, 1, 3, "1f1b", 2, "none", -1, true},
        Layout{1, 2, 1, 0, "1f1b", 4, "full", -1, true},
        Layout{2, 2, 2, 1, "1f1b", 2, "selective", -1, true}),
    [](const ::testing::TestParamInfo<Layout>& info) { return Name(info.param); });
// clang-format on

TEST(ActivationMemoryResumeTest, CheckpointWithoutEitherResumesWithEach) {
  const Corpus& corpus = TheCorpus();
  const std::string ckpt = (corpus.dir() / "ckpt_recompute").string();
  const Layout saved{1, 2, 1, 0, "1f1b", 4};
  const Losses whole = Train(corpus.Spec(saved, ckpt), 1, "", /*save=*/true);
  const std::string step10 = checkpoint::StepDir(ckpt, 10);
  Layout full = saved, selective = saved, sp = saved;
  full.recompute = "full";
  selective.recompute = "selective";
  sp.sp = true;
  for (const Layout& l : {full, selective, sp}) {
    const Losses resumed = Train(corpus.Spec(l), 11, step10);
    const double worst = Worst(resumed.loss, whole.loss, 11);
    std::printf("saved on %s, resumed on %s: steps 11-20 max rel loss diff %.3g\n",
                Name(saved).c_str(), Name(l).c_str(), worst);
    EXPECT_LE(worst, l.sp ? 1e-5 : 1e-6) << Name(l);
  }
}

}  // namespace
}  // namespace shardtrain::worker
