// Tensor and pipeline parallelism through real parts (CPU engine slices,
// DDP / ZeRO, the pipeline executor, Gloo over 127.0.0.1 between thread
// ranks): every layout of the sweep trains like one rank on the same global
// batch, step by step within 1e-5 relative loss over 20 steps (fp32), with
// the same validation loss; and a checkpoint saved on tp2×pp2 resumes on
// other layouts like an uninterrupted run.
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>

#include "gtest/gtest.h"
#include "tests/unit/worker/model_parallel_util.h"

namespace shardtrain::worker {
namespace {
using namespace mp_test;  // NOLINT: the shared harness of this test family

class ModelParallelTest : public ::testing::TestWithParam<Layout> {};

TEST_P(ModelParallelTest, EqualsOneRankStepByStep) {
  const Layout l = GetParam();
  const Losses& ref = Reference();
  ExpectSameLosses(l, Train(TheCorpus().Spec(l)), ref, "1 rank", 1e-5);
}

// clang-format off
INSTANTIATE_TEST_SUITE_P(
    Sweep, ModelParallelTest,
    ::testing::Values(
        Layout{1, 2, 1}, Layout{1, 4, 1},
        Layout{1, 1, 2, 0, "gpipe", 4}, Layout{1, 1, 2, 0, "gpipe", 2},
        Layout{1, 1, 2, 0, "1f1b", 4}, Layout{1, 1, 2, 0, "1f1b", 2},
        Layout{1, 1, 4, 0, "gpipe", 4}, Layout{1, 1, 4, 0, "gpipe", 2},
        Layout{1, 1, 4, 0, "1f1b", 4}, Layout{1, 1, 4, 0, "1f1b", 2},
        Layout{2, 2, 1, 0, "1f1b", 2}, Layout{2, 1, 2, 0, "1f1b", 2},
        Layout{1, 2, 2, 0, "1f1b", 4}, Layout{2, 2, 2, 0, "1f1b", 2},
        Layout{2, 2, 1, 1, "1f1b", 2}, Layout{2, 2, 1, 2, "1f1b", 2},
        Layout{2, 1, 2, 2, "gpipe", 2},
        // Interleaved 1F1B: two model chunks per stage (layers 0, 2 | 1, 3).
        Interleaved(Layout{1, 1, 2, 0, "1f1b", 4}, 2),
        Interleaved(Layout{1, 1, 2, 0, "1f1b", 2}, 2),
        Interleaved(Layout{2, 1, 2, 0, "1f1b", 2}, 2),
        Interleaved(Layout{2, 1, 2, 1, "1f1b", 2}, 2),
        Interleaved(Layout{1, 2, 2, 0, "1f1b", 4}, 2),
        Interleaved(Cp(Layout{1, 1, 2, 0, "1f1b", 4}, 2), 2)),
    [](const ::testing::TestParamInfo<Layout>& info) { return Name(info.param); });
// clang-format on

TEST(ModelParallelResumeTest, Tp2Pp2CheckpointResumesOnDp4AndOneRank) {
  const Corpus& corpus = TheCorpus();
  const std::string ckpt = (corpus.dir() / "ckpt").string();
  const Layout saved{1, 2, 2, 0, "1f1b", 4};
  const Losses whole = Train(corpus.Spec(saved, ckpt), 1, "", /*save=*/true);
  const std::string step10 = checkpoint::StepDir(ckpt, 10);
  for (const Layout& l : {Layout{4, 1, 1, 0, "1f1b", 1}, Layout{1, 1, 1}, saved}) {
    const Losses resumed = Train(corpus.Spec(l), 11, step10);
    const double worst = Worst(resumed.loss, whole.loss, 11);
    std::printf("saved on %s, resumed on %s: steps 11-20 max rel loss diff %.3g vs uninterrupted\n",
                Name(saved).c_str(), Name(l).c_str(), worst);
    EXPECT_LE(worst, 1e-6) << Name(l);
  }
}

// Checkpoints are in the whole model's coordinates: an interleaved run's
// resumes on one rank, and one rank's on an interleaved layout.
TEST(ModelParallelResumeTest, InterleavedCheckpointResumesOnOneRankAndTheReverse) {
  const Corpus& corpus = TheCorpus();
  const Layout interleaved = Interleaved(Layout{1, 1, 2, 0, "1f1b", 4}, 2), one{1, 1, 1};
  for (const auto& [from, to] : {std::pair<Layout, Layout>{interleaved, one}, {one, interleaved}}) {
    const std::string ckpt = (corpus.dir() / ("ckpt_" + Name(from))).string();
    const Losses whole = Train(corpus.Spec(from, ckpt), 1, "", /*save=*/true);
    const Losses resumed = Train(corpus.Spec(to), 11, checkpoint::StepDir(ckpt, 10));
    const double worst = Worst(resumed.loss, whole.loss, 11);
    std::printf("saved on %s, resumed on %s: steps 11-20 max rel loss diff %.3g vs uninterrupted\n",
                Name(from).c_str(), Name(to).c_str(), worst);
    EXPECT_LE(worst, 1e-5) << Name(from) << " -> " << Name(to);
  }
}

}  // namespace
}  // namespace shardtrain::worker
