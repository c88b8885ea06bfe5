// Optimizer helpers: the learning-rate schedule and gradient clipping.
#include "worker/optim/adamw.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

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

}  // namespace
}  // namespace shardtrain::optim
