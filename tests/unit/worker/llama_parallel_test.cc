// The Llama family (RMSNorm, rotary positions, SwiGLU, grouped-query
// attention, untied head) under every parallelism, through the same real
// parts as model_parallel_test.cc (CPU engine slices, DDP / ZeRO, the
// pipeline executor, Gloo over 127.0.0.1 between thread ranks): each layout
// trains like one rank on the same global batch, step by step within 1e-5
// relative loss over 20 steps (fp32), with the same validation loss; a
// checkpoint saved on dp2×tp2 resumes on other layouts like an uninterrupted
// run.
#include <cmath>
#include <cstdio>
#include <string>

#include "gtest/gtest.h"
#include "tests/unit/worker/model_parallel_util.h"

namespace shardtrain::worker {
namespace {
using namespace mp_test;  // NOLINT: the shared harness of this test family

class LlamaParallelTest : public ::testing::TestWithParam<Layout> {};

TEST_P(LlamaParallelTest, EqualsOneRankStepByStep) {
  const Layout l = GetParam();
  const Losses& ref = Reference(/*llama=*/true);
  ExpectSameLosses(l, Train(TheCorpus().Spec(l)), ref, "1 rank", 1e-5);
}

// Layout{dp, tp, pp, zero, schedule, micro, recompute, recompute_layers, sp}.
// The pipelines put the embeddings (first stage) and the untied LM head
// (last stage) on different ranks.
// clang-format off
INSTANTIATE_TEST_SUITE_P(
    Sweep, LlamaParallelTest,
    ::testing::Values(
        Llama(Layout{2, 1, 1, 0, "1f1b", 2}),   // DDP
        Llama(Layout{2, 1, 1, 1, "1f1b", 2}),   // ZeRO-1
        Llama(Layout{2, 1, 1, 2, "1f1b", 2}),   // ZeRO-2
        Llama(Layout{2, 1, 1, 3, "1f1b", 2}),   // ZeRO-3
        Llama(Layout{1, 2, 1}),                 // tp: q/k/v and gate/up column-parallel
        Llama(Layout{1, 2, 1, 0, "1f1b", 4, "none", -1, true}),  // + sequence parallelism
        Llama(Layout{1, 1, 2, 0, "1f1b", 2}),
        Llama(Layout{1, 1, 2, 0, "gpipe", 2}),
        Llama(Layout{1, 1, 4, 0, "1f1b", 4}),
        Llama(Layout{1, 1, 1, 0, "1f1b", 4, "selective"}),
        Llama(Layout{1, 1, 1, 0, "1f1b", 4, "full"}),
        Llama(Layout{1, 2, 1, 0, "1f1b", 4, "full", -1, true}),
        Llama(Layout{2, 2, 1, 1, "1f1b", 2}),
        Llama(Layout{2, 2, 2, 0, "1f1b", 2}),
        Llama(Layout{2, 1, 2, 2, "gpipe", 2, "selective"})),
    [](const ::testing::TestParamInfo<Layout>& info) { return Name(info.param); });
// clang-format on

// Qwen3's recipe (heads of 16 on a width of 32, so q is 64 wide; q/k
// norms, whose weights' gradients tp ranks sum: each normalises its own
// heads) under the parallelisms that touch it.
class Qwen3ParallelTest : public ::testing::TestWithParam<Layout> {};

TEST_P(Qwen3ParallelTest, EqualsOneRankStepByStep) {
  const Layout l = GetParam();
  const Losses& ref = Reference(/*llama=*/true, /*qwen3=*/true);
  // The gradient norm too. Neither figure notices a tp rank's q/k norm
  // gradient missing the other ranks' heads here (those gradients are tiny
  // while attention is near uniform, and AdamW's steps near sign(g)):
  // gpt_parallel_test's QkNormGradientsAreTheSlicesPartialSums checks the
  // sum itself.
  ExpectSameLossesAndNorms(l, Train(TheCorpus().Spec(l)), ref, 1e-5);
}

// clang-format off
INSTANTIATE_TEST_SUITE_P(
    Sweep, Qwen3ParallelTest,
    ::testing::Values(
        Qwen3(Layout{1, 2, 1}),                                  // tp: the q/k norms' sums
        Qwen3(Layout{2, 2, 1, 3, "1f1b", 2, "full", -1, true}),  // ZeRO-3, sp, full recompute
        Qwen3(Layout{1, 1, 2, 0, "1f1b", 2, "selective"}),       // pp, selective recompute
        Cp(Qwen3(Layout{1, 1, 1, 0, "1f1b", 4}), 2)),            // the ring on 64-wide q
    [](const ::testing::TestParamInfo<Layout>& info) { return Name(info.param); });
// clang-format on

TEST(LlamaParallelResumeTest, Dp2Tp2CheckpointResumesOnPp2AndOneRank) {
  const Corpus& corpus = TheCorpus();
  const std::string ckpt = (corpus.dir() / "llama_ckpt").string();
  const Layout saved = Llama(Layout{2, 2, 1, 1, "1f1b", 2});
  const Losses whole = Train(corpus.Spec(saved, ckpt), 1, "", /*save=*/true);
  const std::string step10 = checkpoint::StepDir(ckpt, 10);
  for (const Layout& l : {Llama(Layout{1, 1, 2, 0, "1f1b", 2}), Llama(Layout{1, 1, 1}),
                          Llama(Layout{4, 1, 1, 3, "1f1b", 1}), saved}) {
    const Losses resumed = Train(corpus.Spec(l), 11, step10);
    const double worst = Worst(resumed.loss, whole.loss, 11);
    std::printf(
        "llama saved on %s, resumed on %s: steps 11-20 max rel loss diff %.3g vs "
        "uninterrupted\n",
        Name(saved).c_str(), Name(l).c_str(), worst);
    EXPECT_LE(worst, 1e-5) << Name(l);
  }
}

}  // namespace
}  // namespace shardtrain::worker
