// ShardedOptimizer (ZeRO-1/2) against a single-rank reference: for dp 1..4
// and both stages, 10 steps over real Gloo (thread ranks, 127.0.0.1) must give
// the params, grad norms and AdamW state of averaging the dp ranks' gradients
// on one rank, optim::ClipGradNorm and optim::AdamW over the whole buffer.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/comm/test_util.h"
#include "worker/model/config.h"
#include "worker/model/param_layout.h"
#include "worker/model/thread_pool.h"
#include "worker/optim/adamw.h"
#include "worker/parallel/sharded_optimizer.h"

namespace shardtrain::parallel {
namespace {

constexpr int kSteps = 10;
constexpr float kMaxNorm = 5.0f;
constexpr double kRelTol = 1e-6;

// L=2, NH=2, C=10, context 9, vocab 50 (Vp 64): N = 3410, which leaves a
// remainder over 3 and over 4 ranks (the tail path runs; asserted below).
model::ParamLayout TestLayout() {
  auto config = model::MakeGptConfig(2, 2, 10, 9, 50);
  EXPECT_TRUE(config.ok()) << config.status();
  return model::ParamLayout(*config);
}

optim::AdamWOptions TestOptions() {
  optim::AdamWOptions o;
  o.beta1 = 0.9f;
  o.beta2 = 0.95f;
  o.eps = 1e-8f;
  o.weight_decay = 0.1f;
  return o;
}

uint64_t Mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

float InitParam(size_t i) {
  return static_cast<float>(static_cast<int>(Mix(i) % 2001) - 1000) / 10000.0f;
}

// Multiples of 2^-18 of magnitude <= 2^-1: sums over <= 4 ranks are exact in
// fp32 in any order, so the reference and every collective algorithm agree on
// the summed gradient bit for bit. Every third step is 64x smaller, so the
// clip is inactive there and active on the other steps.
float Grad(int rank, int step, size_t i) {
  const int k =
      static_cast<int>(Mix(Mix(i) ^ (uint64_t(rank) << 40) ^ (uint64_t(step) << 50)) % 4097) - 2048;
  const float scale = step % 3 == 2 ? 1.0f / 64 : 1.0f;
  return static_cast<float>(k) / 4096.0f * scale;
}

float Lr(int step) { return 1e-3f * static_cast<float>(1 + step % 4); }

struct Trajectory {
  std::vector<std::vector<float>> params;  // after each step
  std::vector<double> norms;
  std::vector<float> m, v;  // final AdamW state (the shard's, for a rank)
  size_t shard_begin = 0, shard_end = 0;
  int64_t optimizer_bytes = 0;
  int64_t adamw_step = 0;
};

// One rank doing the whole global batch: mean of the dp ranks' gradients,
// ClipGradNorm, AdamW over [0, N).
Trajectory Reference(const model::ParamLayout& layout, int dp, int* clipped_steps) {
  const size_t n = layout.num_params();
  std::vector<float> params(n), avg(n);
  for (size_t i = 0; i < n; ++i) params[i] = InitParam(i);
  auto adamw = optim::AdamW::Create(layout, 0, n, TestOptions());
  EXPECT_TRUE(adamw.ok()) << adamw.status();
  Trajectory t;
  *clipped_steps = 0;
  for (int step = 0; step < kSteps; ++step) {
    for (size_t i = 0; i < n; ++i) {
      float sum = 0;
      for (int r = 0; r < dp; ++r) sum += Grad(r, step, i);
      avg[i] = sum * (1.0f / static_cast<float>(dp));
    }
    const float norm = optim::ClipGradNorm(absl::MakeSpan(avg), kMaxNorm, nullptr);
    if (norm > kMaxNorm) ++*clipped_steps;
    adamw->Step(absl::MakeSpan(params), avg, Lr(step), nullptr);
    t.params.push_back(params);
    t.norms.push_back(norm);
  }
  t.m.assign(adamw->m().begin(), adamw->m().end());
  t.v.assign(adamw->v().begin(), adamw->v().end());
  t.adamw_step = adamw->step();
  return t;
}

// Max |got - want| / max(|want|, 1e-6) over got[i] vs want[offset + i];
// counts elements outside kRelTol in *bad.
double MaxRelDiff(const std::vector<float>& got, const std::vector<float>& want, size_t offset,
                  size_t* bad) {
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double w = want[offset + i];
    const double rel = std::fabs(double{got[i]} - w) / std::max(std::fabs(w), 1e-6);
    worst = std::max(worst, rel);
    if (rel > kRelTol) ++*bad;
  }
  return worst;
}

struct Param {
  int dp;
  int stage;
};

class ZeroTest : public ::testing::TestWithParam<Param> {};

TEST_P(ZeroTest, MatchesSingleRankReference) {
  const auto [dp, stage] = GetParam();
  const model::ParamLayout layout = TestLayout();
  const size_t n = layout.num_params();
  ASSERT_NE(n % 3, 0u);
  ASSERT_NE(n % 4, 0u);
  int clipped = 0;
  const Trajectory ref = Reference(layout, dp, &clipped);
  ASSERT_GT(clipped, 0) << "test data never exercises clipping";
  ASSERT_LT(clipped, kSteps) << "test data always clips";

  std::vector<Trajectory> ranks(dp);
  comm::testing::RunRanks(dp, [&](comm::Communicator& comm) {
    Trajectory& t = ranks[comm.rank()];
    model::ThreadPool pool(1);
    auto opt = ShardedOptimizer::Create(stage, layout, TestOptions(), &comm, &pool);
    ASSERT_TRUE(opt.ok()) << opt.status();
    std::vector<float> params(n), grads(n);
    for (size_t i = 0; i < n; ++i) params[i] = InitParam(i);
    for (int step = 0; step < kSteps; ++step) {
      for (size_t i = 0; i < n; ++i) grads[i] = Grad(comm.rank(), step, i);
      auto norm = (*opt)->Step(absl::MakeSpan(params), absl::MakeSpan(grads), Lr(step), kMaxNorm);
      ASSERT_TRUE(norm.ok()) << norm.status();
      t.params.push_back(params);
      t.norms.push_back(*norm);
    }
    optim::AdamW& adamw = (*opt)->adamw();
    t.m.assign(adamw.m().begin(), adamw.m().end());
    t.v.assign(adamw.v().begin(), adamw.v().end());
    t.adamw_step = adamw.step();
    t.shard_begin = (*opt)->shard_begin();
    t.shard_end = (*opt)->shard_end();
    t.optimizer_bytes = (*opt)->optimizer_bytes();
  });
  if (HasFailure()) return;

  // The shards tile [0, N) in rank order, nearly evenly, and each rank holds
  // exactly its shard's m and v.
  size_t expect_begin = 0;
  for (int r = 0; r < dp; ++r) {
    const Trajectory& t = ranks[r];
    EXPECT_EQ(t.shard_begin, expect_begin) << "rank " << r;
    const size_t size = t.shard_end - t.shard_begin;
    EXPECT_LT(size - n / dp, size_t(dp)) << "rank " << r;
    EXPECT_EQ(t.optimizer_bytes, int64_t(8 * size)) << "rank " << r;
    EXPECT_EQ(t.m.size(), size);
    EXPECT_EQ(t.adamw_step, ref.adamw_step);
    expect_begin = t.shard_end;
  }
  EXPECT_EQ(expect_begin, n);

  double worst_params = 0, worst_norm = 0, worst_state = 0;
  for (int step = 0; step < kSteps; ++step) {
    for (int r = 0; r < dp; ++r) {
      EXPECT_EQ(ranks[r].params[step], ranks[0].params[step])
          << "rank " << r << " params differ from rank 0 after step " << step;
      EXPECT_EQ(ranks[r].norms[step], ranks[0].norms[step]) << "rank " << r << " step " << step;
    }
    size_t bad = 0;
    const double d = MaxRelDiff(ranks[0].params[step], ref.params[step], 0, &bad);
    worst_params = std::max(worst_params, d);
    EXPECT_EQ(bad, 0u) << "step " << step << ": " << bad << " params off; max rel diff " << d;
    const double nd = std::fabs(ranks[0].norms[step] - ref.norms[step]) / ref.norms[step];
    worst_norm = std::max(worst_norm, nd);
    EXPECT_LE(nd, kRelTol) << "step " << step << ": norm " << ranks[0].norms[step] << " vs "
                           << ref.norms[step];
  }
  for (int r = 0; r < dp; ++r) {
    size_t bad = 0;
    const double dm = MaxRelDiff(ranks[r].m, ref.m, ranks[r].shard_begin, &bad);
    const double dv = MaxRelDiff(ranks[r].v, ref.v, ranks[r].shard_begin, &bad);
    worst_state = std::max({worst_state, dm, dv});
    EXPECT_EQ(bad, 0u) << "rank " << r << " m/v: max rel diff " << std::max(dm, dv);
  }
  std::printf("dp=%d stage=%d N=%zu: max rel diff params %.3g, grad norm %.3g, m/v %.3g\n", dp,
              stage, n, worst_params, worst_norm, worst_state);
}

INSTANTIATE_TEST_SUITE_P(DpAndStage, ZeroTest,
                         ::testing::Values(Param{1, 1}, Param{2, 1}, Param{3, 1}, Param{4, 1},
                                           Param{1, 2}, Param{2, 2}, Param{3, 2}, Param{4, 2}),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return absl::StrCat("dp", info.param.dp, "_zero", info.param.stage);
                         });

TEST(ZeroShardRangeTest, SplitsEvenlyWithTheRemainderOnTheLastRank) {
  EXPECT_EQ(ZeroShardRange(10, 3, 0).begin, 0u);
  EXPECT_EQ(ZeroShardRange(10, 3, 0).end, 3u);
  EXPECT_EQ(ZeroShardRange(10, 3, 1).begin, 3u);
  EXPECT_EQ(ZeroShardRange(10, 3, 1).end, 6u);
  EXPECT_EQ(ZeroShardRange(10, 3, 2).begin, 6u);
  EXPECT_EQ(ZeroShardRange(10, 3, 2).end, 10u);
  // Fewer elements than ranks: all on the last rank.
  EXPECT_EQ(ZeroShardRange(3, 4, 2).size(), 0u);
  EXPECT_EQ(ZeroShardRange(3, 4, 3).begin, 0u);
  EXPECT_EQ(ZeroShardRange(3, 4, 3).end, 3u);
}

TEST(ShardedOptimizerTest, NullCommunicatorIsOneRank) {
  const model::ParamLayout layout = TestLayout();
  const size_t n = layout.num_params();
  int clipped = 0;
  const Trajectory ref = Reference(layout, 1, &clipped);
  auto opt = ShardedOptimizer::Create(2, layout, TestOptions(), nullptr, nullptr);
  ASSERT_TRUE(opt.ok()) << opt.status();
  EXPECT_EQ((*opt)->shard_begin(), 0u);
  EXPECT_EQ((*opt)->shard_end(), n);
  EXPECT_EQ((*opt)->optimizer_bytes(), int64_t(8 * n));
  std::vector<float> params(n), grads(n);
  for (size_t i = 0; i < n; ++i) params[i] = InitParam(i);
  for (int step = 0; step < kSteps; ++step) {
    for (size_t i = 0; i < n; ++i) grads[i] = Grad(0, step, i);
    auto norm = (*opt)->Step(absl::MakeSpan(params), absl::MakeSpan(grads), Lr(step), kMaxNorm);
    ASSERT_TRUE(norm.ok()) << norm.status();
    EXPECT_EQ(*norm, ref.norms[step]) << "step " << step;
    EXPECT_EQ(params, ref.params[step]) << "step " << step;
  }
}

TEST(ShardedOptimizerTest, RejectsBadStageAndBufferSizes) {
  const model::ParamLayout layout = TestLayout();
  for (int stage : {0, 3, -1}) {
    auto opt = ShardedOptimizer::Create(stage, layout, TestOptions(), nullptr, nullptr);
    EXPECT_EQ(opt.status().code(), absl::StatusCode::kInvalidArgument) << "stage " << stage;
  }
  auto opt = ShardedOptimizer::Create(1, layout, TestOptions(), nullptr, nullptr);
  ASSERT_TRUE(opt.ok()) << opt.status();
  std::vector<float> params(layout.num_params()), grads(layout.num_params() - 1);
  auto norm = (*opt)->Step(absl::MakeSpan(params), absl::MakeSpan(grads), 1e-3f, 1.0f);
  EXPECT_EQ(norm.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*opt)->adamw().step(), 0);
}

}  // namespace
}  // namespace shardtrain::parallel
