// Optimizer helpers: the learning-rate schedule and gradient clipping.
#include "worker/optim/adamw.h"

#include <gtest/gtest.h>

#include <vector>

namespace shardtrain::optim {
namespace {

using engine::ThreadPool;

TEST(OptimTest, LearningRateSchedule) {
  EXPECT_FLOAT_EQ(LearningRate(0, 1.0f, 0.1f, 10, 100), 0.1f);
  EXPECT_FLOAT_EQ(LearningRate(9, 1.0f, 0.1f, 10, 100), 1.0f);
  EXPECT_FLOAT_EQ(LearningRate(10, 1.0f, 0.1f, 10, 100), 1.0f);
  EXPECT_NEAR(LearningRate(55, 1.0f, 0.1f, 10, 100), 0.55f, 1e-6);
  EXPECT_FLOAT_EQ(LearningRate(100, 1.0f, 0.1f, 10, 100), 0.1f);
  EXPECT_FLOAT_EQ(LearningRate(1000, 1.0f, 0.1f, 10, 100), 0.1f);
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
