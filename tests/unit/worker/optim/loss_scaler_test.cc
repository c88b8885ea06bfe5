// fp16 dynamic loss scaling, PyTorch's GradScaler rule: 2^16 at first,
// halved and the step skipped on overflow, doubled after 2000 clean steps in
// a row, never below the floor, never grown to inf; the state restores.
#include "worker/optim/loss_scaler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace shardtrain::optim {
namespace {

TEST(LossScalerTest, DefaultsAreGradScalers) {
  const LossScalerOptions o;
  EXPECT_EQ(o.initial_scale, 65536.0f);
  EXPECT_EQ(o.growth_factor, 2.0f);
  EXPECT_EQ(o.backoff_factor, 0.5f);
  EXPECT_EQ(o.growth_interval, 2000);
  EXPECT_EQ(o.min_scale, 1.0f);
  EXPECT_TRUE(CheckLossScalerOptions(o).ok());
  LossScaler s;
  EXPECT_EQ(s.scale(), 65536.0f);
  EXPECT_EQ(s.growth_tracker(), 0);
}

TEST(LossScalerTest, DoublesAfter2000CleanStepsAndAgainAfter2000More) {
  LossScaler s;
  for (int i = 0; i < 1999; ++i) ASSERT_FALSE(s.Update(false)) << "step " << i;
  EXPECT_EQ(s.scale(), 65536.0f);
  EXPECT_EQ(s.growth_tracker(), 1999);
  EXPECT_FALSE(s.Update(false));  // the 2000th
  EXPECT_EQ(s.scale(), 131072.0f);
  EXPECT_EQ(s.growth_tracker(), 0);
  for (int i = 0; i < 1999; ++i) s.Update(false);
  EXPECT_EQ(s.scale(), 131072.0f);
  s.Update(false);
  EXPECT_EQ(s.scale(), 262144.0f);
}

TEST(LossScalerTest, OverflowSkipsHalvesAndRestartsTheCount) {
  LossScaler s;
  for (int i = 0; i < 1500; ++i) s.Update(false);
  EXPECT_TRUE(s.Update(true));
  EXPECT_EQ(s.scale(), 32768.0f);
  EXPECT_EQ(s.growth_tracker(), 0);
  // 2000 more clean steps are needed, not the 500 left before the overflow.
  for (int i = 0; i < 1999; ++i) s.Update(false);
  EXPECT_EQ(s.scale(), 32768.0f);
  s.Update(false);
  EXPECT_EQ(s.scale(), 65536.0f);
}

TEST(LossScalerTest, ConsecutiveOverflowsHalveEachTime) {
  LossScaler s;
  std::vector<float> seen;
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(s.Update(true));
    seen.push_back(s.scale());
  }
  EXPECT_EQ(seen, (std::vector<float>{32768, 16384, 8192, 4096, 2048}));
}

// The scale over a sequence of steps against GradScaler's update rule
// written out directly (torch/_amp_update_scale: halve on inf, else count
// and double at growth_interval), with a short interval.
TEST(LossScalerTest, FollowsGradScalersRuleOverAMixedSequence) {
  LossScalerOptions o;
  o.growth_interval = 3;
  LossScaler s(o);
  double want = 65536;
  int tracker = 0;
  const bool infs[] = {false, false, true,  false, false, false, false,
                       true,  true,  false, false, false, false, false};
  for (size_t i = 0; i < sizeof(infs); ++i) {
    const bool skipped = s.Update(infs[i]);
    if (infs[i]) {
      want *= 0.5;
      tracker = 0;
    } else if (++tracker == 3) {
      want *= 2;
      tracker = 0;
    }
    EXPECT_EQ(skipped, infs[i]) << "step " << i;
    EXPECT_EQ(s.scale(), want) << "step " << i;
    EXPECT_EQ(s.growth_tracker(), tracker) << "step " << i;
  }
}

TEST(LossScalerTest, NeverBelowTheFloor) {
  LossScalerOptions o;
  o.initial_scale = 4;
  o.min_scale = 1;
  LossScaler s(o);
  for (float want : {2.0f, 1.0f, 1.0f, 1.0f}) {
    EXPECT_TRUE(s.Update(true));  // still skipped at the floor
    EXPECT_EQ(s.scale(), want);
  }
  // A floor that is not a power of the backoff: clamped to it exactly.
  o.initial_scale = 10;
  o.min_scale = 3;
  LossScaler t(o);
  t.Update(true);
  EXPECT_EQ(t.scale(), 5.0f);
  t.Update(true);
  EXPECT_EQ(t.scale(), 3.0f);
}

TEST(LossScalerTest, NeverGrowsToInfinity) {
  LossScalerOptions o;
  o.growth_interval = 1;
  LossScaler s(o);
  const float big = std::numeric_limits<float>::max() / 1.5f;  // doubling overflows
  ASSERT_TRUE(s.Restore(big, 0).ok());
  EXPECT_FALSE(s.Update(false));
  EXPECT_EQ(s.scale(), big);
  EXPECT_TRUE(std::isfinite(s.scale()));
  EXPECT_EQ(s.growth_tracker(), 0);
}

TEST(LossScalerTest, RestoreCarriesTheState) {
  LossScalerOptions o;
  o.growth_interval = 3;
  LossScaler s(o);
  ASSERT_TRUE(s.Restore(1024.0f, 2).ok());
  EXPECT_EQ(s.scale(), 1024.0f);
  EXPECT_EQ(s.growth_tracker(), 2);
  EXPECT_FALSE(s.Update(false));  // the third clean step in a row
  EXPECT_EQ(s.scale(), 2048.0f);
  EXPECT_EQ(s.growth_tracker(), 0);

  // A run saved and restored continues as the uninterrupted one.
  LossScaler a(o), b(o);
  const bool infs[] = {false, true, false, false, false, false, true, false};
  for (int i = 0; i < 4; ++i) a.Update(infs[i]);
  ASSERT_TRUE(b.Restore(a.scale(), a.growth_tracker()).ok());
  for (int i = 4; i < 8; ++i) {
    EXPECT_EQ(a.Update(infs[i]), b.Update(infs[i]));
    EXPECT_EQ(a.scale(), b.scale()) << "step " << i;
    EXPECT_EQ(a.growth_tracker(), b.growth_tracker()) << "step " << i;
  }
}

TEST(LossScalerTest, RestoreRefusesBadStateAndRaisesToTheFloor) {
  LossScaler s;
  for (float bad : {0.0f, -2.0f, std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    absl::Status st = s.Restore(bad, 0);
    EXPECT_TRUE(absl::IsInvalidArgument(st)) << bad << ": " << st;
    EXPECT_EQ(s.scale(), 65536.0f);  // unchanged
  }
  EXPECT_TRUE(absl::IsInvalidArgument(s.Restore(8.0f, -1)));
  EXPECT_EQ(s.growth_tracker(), 0);
  ASSERT_TRUE(s.Restore(0.25f, 5).ok());
  EXPECT_EQ(s.scale(), 1.0f);  // min_scale
  EXPECT_EQ(s.growth_tracker(), 5);
}

TEST(LossScalerTest, OptionsOutsideTheirBoundsNameTheField) {
  struct Case {
    void (*set)(LossScalerOptions&);
    const char* field;
  };
  const Case cases[] = {
      {[](LossScalerOptions& o) { o.min_scale = 0; }, "min_scale"},
      {[](LossScalerOptions& o) { o.min_scale = -1; }, "min_scale"},
      {[](LossScalerOptions& o) { o.initial_scale = 0.5f; }, "initial_scale"},
      {[](LossScalerOptions& o) { o.initial_scale = std::numeric_limits<float>::infinity(); },
       "initial_scale"},
      {[](LossScalerOptions& o) { o.growth_factor = 1; }, "growth_factor"},
      {[](LossScalerOptions& o) { o.backoff_factor = 1; }, "backoff_factor"},
      {[](LossScalerOptions& o) { o.backoff_factor = 0; }, "backoff_factor"},
      {[](LossScalerOptions& o) { o.growth_interval = 0; }, "growth_interval"},
  };
  for (const Case& c : cases) {
    LossScalerOptions o;
    c.set(o);
    absl::Status s = CheckLossScalerOptions(o);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << c.field << ": " << s;
    EXPECT_NE(s.message().find(c.field), absl::string_view::npos) << s;
  }
}

}  // namespace
}  // namespace shardtrain::optim
