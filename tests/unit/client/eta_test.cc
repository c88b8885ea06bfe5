// EtaEstimator: warm-up left out, the mean then the moving average, restarts,
// and what progress lines print with it.
#include "client/eta.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "client/output.h"

namespace shardtrain::client {
namespace {

TEST(CliEtaTest, UnknownDuringWarmupThenRemainingStepsTimesStepTime) {
  EtaEstimator eta;  // 2 warm-up steps
  eta.Add(1, 900);   // first steps: allocation, several times slower
  EXPECT_TRUE(std::isnan(eta.RemainingSeconds(1, 100)));
  eta.Add(2, 400);
  EXPECT_TRUE(std::isnan(eta.StepMs()));
  EXPECT_EQ(FormatDuration(eta.RemainingSeconds(2, 100)), "?");
  eta.Add(3, 200);
  EXPECT_DOUBLE_EQ(eta.StepMs(), 200);
  EXPECT_DOUBLE_EQ(eta.RemainingSeconds(3, 100), 97 * 0.2);
  EXPECT_EQ(eta.RemainingSeconds(100, 100), 0);
  EXPECT_EQ(eta.RemainingSeconds(101, 100), 0);
}

TEST(CliEtaTest, MeanOfTheFirstStepsThenMovingAverage) {
  EtaEstimator eta({/*warmup_steps=*/0, /*alpha=*/0.25});
  eta.Add(1, 100);
  eta.Add(2, 200);
  EXPECT_DOUBLE_EQ(eta.StepMs(), 150);  // plain mean while 1/n > alpha
  eta.Add(3, 300);
  eta.Add(4, 400);
  EXPECT_DOUBLE_EQ(eta.StepMs(), 250);  // n = 4: 1/n == alpha, still the mean
  eta.Add(5, 650);
  EXPECT_DOUBLE_EQ(eta.StepMs(), 250 + 0.25 * (650 - 250));  // alpha from here on
}

TEST(CliEtaTest, OneSlowStepMovesTheEtaByAlphaOfItsExcess) {
  EtaEstimator eta;  // alpha 0.1
  int64_t step = 0;
  for (; step < 50; ++step) eta.Add(step + 1, 200);
  const double before = eta.RemainingSeconds(step, 300);
  eta.Add(++step, 600);  // a checkpoint, a neighbour's build
  const double after = eta.RemainingSeconds(step, 300);
  EXPECT_NEAR(eta.StepMs(), 200 + 0.1 * 400, 1e-9);
  // Remaining-steps x last step time would have tripled the ETA.
  EXPECT_LT(after / before, 1.25) << before << " s -> " << after << " s";
}

TEST(CliEtaTest, NoisyStepsGiveASteadyEta) {
  // Alternating fast and slow steps (a shared machine): the raw estimate
  // jumps by 3x every line; the smoothed one moves by a few percent.
  EtaEstimator eta;
  double largest_change = 0, previous = NAN;
  for (int64_t step = 1; step <= 200; ++step) {
    eta.Add(step, step % 2 ? 150 : 450);
    const double now = eta.RemainingSeconds(step, 1000);
    if (step > 20) largest_change = std::max(largest_change, std::abs(now / previous - 1));
    previous = now;
  }
  EXPECT_NEAR(eta.StepMs(), 300, 20);
  EXPECT_LT(largest_change, 0.12) << "largest change between lines: " << largest_change;
}

TEST(CliEtaTest, ARestartStartsOver) {
  EtaEstimator eta;
  for (int64_t step = 1; step <= 20; ++step) eta.Add(step, 100);
  EXPECT_DOUBLE_EQ(eta.StepMs(), 100);
  // Resumed from the step-10 checkpoint on other workers, 4x slower.
  eta.Add(11, 1000);
  EXPECT_TRUE(std::isnan(eta.StepMs()));
  eta.Add(12, 400);
  eta.Add(13, 400);
  EXPECT_DOUBLE_EQ(eta.StepMs(), 400);
}

TEST(CliEtaTest, IgnoresStepTimesThatAreNotTimes) {
  EtaEstimator eta({0, 0.1});
  eta.Add(1, 100);
  eta.Add(2, NAN);
  eta.Add(3, -5);
  eta.Add(4, INFINITY);
  EXPECT_DOUBLE_EQ(eta.StepMs(), 100);
}

TEST(CliEtaTest, ProgressLinesShowTheSmoothedEta) {
  EtaEstimator eta;
  std::vector<std::string> etas;
  const double step_ms[] = {750, 230, 200, 400, 200};
  for (int i = 0; i < 5; ++i) {
    v1::JobEvent e;
    e.set_kind(v1::EVENT_KIND_STEP);
    e.mutable_step()->set_step(i + 1);
    e.mutable_step()->set_step_ms(step_ms[i]);
    const std::string line = EventLine(e, 300, &eta);
    etas.push_back(line.substr(line.find("ETA ") + 4));
  }
  // Steps 3..5: mean 200 (297 left: 59 s), mean 300 (296: 1m29s), mean 266.7 (295: 1m19s).
  EXPECT_EQ(etas, (std::vector<std::string>{"?", "?", "59s", "1m29s", "1m19s"}));
}

}  // namespace
}  // namespace shardtrain::client
