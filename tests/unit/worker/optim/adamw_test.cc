// Optimizer helpers: the learning-rate schedule and gradient clipping.
#include "worker/optim/adamw.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/model/config.h"
#include "common/model/param_layout.h"
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

}  // namespace
}  // namespace shardtrain::optim
