// Optimizer helpers: the learning-rate schedule and gradient clipping.
#include "worker/optim/adamw.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/model/config.h"
#include "common/model/param_layout.h"
#include "common/shard_range.h"
#include "worker/optim/lr_schedule.h"

namespace shardtrain::optim {
namespace {

using engine::ThreadPool;

// The schedule's three shapes after a warmup of 10 steps to lr 1, floor 0.1,
// over 100 steps; the values by hand.
TEST(LrScheduleTest, WarmupThenCosineLinearOrConstant) {
  OptimizerSpec o;
  o.lr = 1.0;
  o.min_lr = 0.1;
  o.warmup_steps = 10;
  for (LrSchedule kind : {LrSchedule::kCosine, LrSchedule::kLinear, LrSchedule::kConstant}) {
    o.schedule = kind;
    SCOPED_TRACE(std::string(EnumName(kind)));
    EXPECT_DOUBLE_EQ(LearningRate(o, 0, 100), 0.1);  // warmup: (s + 1) / 10
    EXPECT_DOUBLE_EQ(LearningRate(o, 4, 100), 0.5);
    EXPECT_DOUBLE_EQ(LearningRate(o, 9, 100), 1.0);
    EXPECT_DOUBLE_EQ(LearningRate(o, 10, 100), 1.0);  // r = 0: the peak
  }
  o.schedule = LrSchedule::kCosine;  // r = 0.5: halfway between peak and floor
  EXPECT_NEAR(LearningRate(o, 55, 100), 0.55, 1e-12);
  EXPECT_NEAR(LearningRate(o, 85, 100), 0.1 + 0.5 * (1 + std::cos(M_PI * 75 / 90)) * 0.9, 1e-12);
  EXPECT_DOUBLE_EQ(LearningRate(o, 100, 100), 0.1);  // at and after the end: the floor
  EXPECT_DOUBLE_EQ(LearningRate(o, 1000, 100), 0.1);
  o.schedule = LrSchedule::kLinear;
  EXPECT_NEAR(LearningRate(o, 55, 100), 0.55, 1e-12);
  EXPECT_NEAR(LearningRate(o, 85, 100), 0.1 + (1 - 75.0 / 90) * 0.9, 1e-12);
  EXPECT_DOUBLE_EQ(LearningRate(o, 100, 100), 0.1);
  o.schedule = LrSchedule::kConstant;
  EXPECT_DOUBLE_EQ(LearningRate(o, 55, 100), 1.0);
  EXPECT_DOUBLE_EQ(LearningRate(o, 1000, 100), 1.0);
  // No room after the warmup: the floor.
  o.schedule = LrSchedule::kCosine;
  EXPECT_DOUBLE_EQ(LearningRate(o, 10, 10), 0.1);
}

TEST(OptimTest, ClipScale) {
  EXPECT_EQ(ClipScale(5.0f, 10.0f), 1.0f);  // below max: untouched
  EXPECT_EQ(ClipScale(5.0f, 0.0f), 1.0f);   // 0: clipping off
  EXPECT_FLOAT_EQ(ClipScale(5.0f, 1.0f), 1.0f / (5.0f + 1e-6f));
}

TEST(OptimTest, ClipGradNorm) {
  ThreadPool pool(2);
  std::vector<float> g(200000, 0.0f);
  g[0] = 3;
  g[199999] = 4;
  EXPECT_FLOAT_EQ(ClipGradNorm(absl::MakeSpan(g), 10.0f, &pool), 5.0f);
  EXPECT_EQ(g[0], 3.0f);  // below max: untouched
  EXPECT_FLOAT_EQ(ClipGradNorm(absl::MakeSpan(g), 1.0f, &pool), 5.0f);
  EXPECT_NEAR(g[0], 0.6f, 1e-6);
  EXPECT_NEAR(g[199999], 0.8f, 1e-6);
}

// The clip factor inside AdamW's pass (Step's grad_scale) against scaling
// the gradients first: the same parameters, m and v bit for bit over three
// steps of a model's whole range (decayed and undecayed tensors), and the
// gradients themselves untouched.
TEST(OptimTest, GradScaleInTheStepEqualsScalingFirst) {
  auto config = model::MakeGptConfig(/*layers=*/2, /*heads=*/2, /*dim=*/16, /*context=*/8,
                                     /*vocab=*/61);
  ASSERT_TRUE(config.ok()) << config.status();
  const model::ParamLayout layout(*config);
  const size_t n = layout.num_params();
  AdamWOptions options;
  options.weight_decay = 0.1f;
  auto fused = AdamW::Create(layout, 0, n, options);
  auto apart = AdamW::Create(layout, 0, n, options);
  ASSERT_TRUE(fused.ok() && apart.ok());
  std::vector<float> p_fused(n), p_apart(n), grads(n);
  for (size_t i = 0; i < n; ++i) {
    p_fused[i] = p_apart[i] = std::sin(0.37f * i);
  }
  for (int step = 1; step <= 3; ++step) {
    for (size_t i = 0; i < n; ++i) grads[i] = std::cos(0.11f * i * step);
    const float clip = 0.3f + 0.1f * step;
    std::vector<float> g = grads, scaled = grads;
    for (float& x : scaled) x *= clip;
    fused->Step(p_fused.data(), g.data(), 1e-2f, /*zero_grads=*/false, clip);
    apart->Step(p_apart.data(), scaled.data(), 1e-2f, /*zero_grads=*/false);
    EXPECT_EQ(g, grads) << "the step changed the gradients";
  }
  EXPECT_EQ(p_fused, p_apart);
  EXPECT_EQ(fused->CopyM(0, n), apart->CopyM(0, n));
  EXPECT_EQ(fused->CopyV(0, n), apart->CopyV(0, n));
}

// 8-bit state (AdamWOptions::int8_state): optimizers over ZeRO's shards of
// whole blocks of each unit (UnitShardRange with align 2048, dp 3) step
// exactly as one optimizer over the whole model on the same gradients —
// parameters and m, v bit for bit; their state bytes are 2 per element and
// 8 per block; and the state written out (CopyM/CopyV: dequantized) and
// set again (SetState) steps on bit for bit, also for a block whose
// largest m is negative (the signed map's lowest entry is -0.99296875).
TEST(OptimTest, Int8StateShardsOfWholeBlocksStepAsOneOptimizer) {
  auto config = model::MakeGptConfig(/*layers=*/2, /*heads=*/4, /*dim=*/64, /*context=*/16,
                                     /*vocab=*/300);
  ASSERT_TRUE(config.ok()) << config.status();
  const model::ParamLayout layout(*config);
  const size_t n = layout.num_params();
  AdamWOptions options;
  options.weight_decay = 0.1f;
  options.int8_state = true;
  auto whole = AdamW::Create(layout, 0, n, options);
  ASSERT_TRUE(whole.ok()) << whole.status();
  constexpr int kDp = 3;
  std::vector<AdamW> shards;
  int64_t shard_bytes = 0;
  for (const model::UnitInfo& u : layout.units()) {
    for (int r = 0; r < kDp; ++r) {
      const parallel::ShardRange own = parallel::UnitShardRange(u.numel, kDp, r, 2048);
      if (r < kDp - 1) EXPECT_EQ(own.size() % 2048, 0u) << u.name;
      auto a = AdamW::Create(layout, u.offset + own.begin, own.size(), options);
      ASSERT_TRUE(a.ok()) << a.status();
      shard_bytes += a->state_bytes();
      shards.push_back(*std::move(a));
    }
  }
  EXPECT_GT(shard_bytes, 2 * int64_t(n));
  EXPECT_LT(shard_bytes, 2 * int64_t(n) + 8 * int64_t(n / 2048 + 3 * layout.units().size()));
  std::vector<float> p_whole(n), p_shards(n), grads(n);
  for (size_t i = 0; i < n; ++i) p_whole[i] = p_shards[i] = 0.2f * std::sin(0.37f * i);
  auto step_all = [&](int step) {
    for (size_t i = 0; i < n; ++i) grads[i] = std::cos(0.11f * i * step) - 0.3f;
    whole->Step(p_whole.data(), grads.data(), 1e-2f, /*zero_grads=*/false);
    for (AdamW& a : shards) {
      a.Step(absl::MakeSpan(p_shards).subspan(a.offset(), a.count()),
             absl::MakeConstSpan(grads).subspan(a.offset(), a.count()), 1e-2f, nullptr);
    }
  };
  for (int step = 1; step <= 3; ++step) step_all(step);
  EXPECT_EQ(p_whole, p_shards);
  std::vector<float> m, v;
  for (const AdamW& a : shards) {
    const std::vector<float> ms = a.CopyM(0, a.count()), vs = a.CopyV(0, a.count());
    m.insert(m.end(), ms.begin(), ms.end());
    v.insert(v.end(), vs.begin(), vs.end());
  }
  EXPECT_EQ(m, whole->CopyM(0, n));
  EXPECT_EQ(v, whole->CopyV(0, n));
  bool negative_max = false;  // some block's largest |m| is negative: the hard case
  for (size_t b = 0; b + 2048 <= n && !negative_max; b += 2048) {
    const auto [lo, hi] = std::minmax_element(m.begin() + b, m.begin() + b + 2048);
    negative_max = -*lo > *hi;
  }
  EXPECT_TRUE(negative_max);
  // Out and back in (a checkpoint), then two more steps: the same bits.
  auto again = AdamW::Create(layout, 0, n, options);
  ASSERT_TRUE(again.ok());
  again->SetState(m, v);
  again->set_step(whole->step());
  std::vector<float> p_again = p_whole;
  for (int step = 4; step <= 5; ++step) {
    for (size_t i = 0; i < n; ++i) grads[i] = std::cos(0.11f * i * step) - 0.3f;
    whole->Step(p_whole.data(), grads.data(), 1e-2f, false);
    again->Step(p_again.data(), grads.data(), 1e-2f, false);
  }
  EXPECT_EQ(p_whole, p_again);
  EXPECT_EQ(whole->CopyM(0, n), again->CopyM(0, n));
}

}  // namespace
}  // namespace shardtrain::optim
