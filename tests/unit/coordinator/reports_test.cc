// AggregateStep: the job's step report from every rank's, field by field by
// the ranks' places in the mesh. Here val_loss (present only on the steps
// that evaluated) beside loss, whose rule it shares, and fp16's skipped and
// loss_scale.
#include "coordinator/reports.h"

#include <map>

#include "gtest/gtest.h"

namespace shardtrain::coordinator {
namespace {

// Rank r reports loss r + 1 and, with `val`, val_loss 10·(r + 1).
std::map<int, v1::StepReport> Reports(int world, bool val) {
  std::map<int, v1::StepReport> by_rank;
  for (int r = 0; r < world; ++r) {
    v1::StepReport s;
    s.set_rank(r);
    s.set_step(3);
    s.set_loss(r + 1);
    if (val) s.set_val_loss(10.0 * (r + 1));
    by_rank[r] = s;
  }
  return by_rank;
}

// dp 2 × tp 2 × pp 2: rank = (pp·2 + dp)·2 + tp, so the replicas' last
// stage, tp 0, is ranks 4 (dp 0) and 6 (dp 1); only they speak for a replica.
TEST(AggregateStepTest, ValLossIsTheMeanOverTheRanksThatSpeakForAReplica) {
  auto dims = ParallelDims::Create(2, 2, 2);
  ASSERT_TRUE(dims.ok()) << dims.status();
  for (int r = 0; r < 8; ++r) EXPECT_EQ(dims->SpeaksForReplica(r), r == 4 || r == 6) << r;
  const v1::StepReport agg = AggregateStep(*dims, Reports(8, /*val=*/true));
  ASSERT_TRUE(agg.has_val_loss());
  EXPECT_DOUBLE_EQ(agg.val_loss(), (50.0 + 70.0) / 2);  // ranks 4 and 6 only
  EXPECT_DOUBLE_EQ(agg.loss(), (5.0 + 7.0) / 2);        // the same rule as loss
  EXPECT_EQ(agg.rank(), 0);
  EXPECT_EQ(agg.step(), 3);
}

TEST(AggregateStepTest, ValLossIsAbsentOnStepsThatDidNotEvaluate) {
  auto dims = ParallelDims::Create(2, 2, 2);
  ASSERT_TRUE(dims.ok());
  const v1::StepReport none = AggregateStep(*dims, Reports(8, /*val=*/false));
  EXPECT_FALSE(none.has_val_loss());
  EXPECT_DOUBLE_EQ(none.loss(), 6.0);
  // Rank 0's report is the starting point of the aggregate, but rank 0 does
  // not speak for a replica here: its val_loss must not leak through.
  std::map<int, v1::StepReport> only_rank0 = Reports(8, false);
  only_rank0[0].set_val_loss(1.5);
  EXPECT_FALSE(AggregateStep(*dims, only_rank0).has_val_loss());
}

TEST(AggregateStepTest, DpOnlyValLossIsTheMeanOverEveryRank) {
  auto dims = ParallelDims::Create(4, 1, 1);
  ASSERT_TRUE(dims.ok());
  const v1::StepReport agg = AggregateStep(*dims, Reports(4, /*val=*/true));
  ASSERT_TRUE(agg.has_val_loss());
  EXPECT_DOUBLE_EQ(agg.val_loss(), (10.0 + 20 + 30 + 40) / 4);
  EXPECT_DOUBLE_EQ(agg.loss(), (1.0 + 2 + 3 + 4) / 4);
}

// A step is skipped when any rank skipped it (they all see the same global
// gradients; a disagreement must not hide); the loss scale is rank 0's.
TEST(AggregateStepTest, SkippedWhenAnyRankSkippedAndLossScaleIsRank0s) {
  auto dims = ParallelDims::Create(2, 2, 2);
  ASSERT_TRUE(dims.ok());
  std::map<int, v1::StepReport> by_rank = Reports(8, false);
  for (auto& [r, s] : by_rank) s.set_loss_scale(r == 0 ? 32768 : 1);
  v1::StepReport clean = AggregateStep(*dims, by_rank);
  EXPECT_FALSE(clean.skipped());
  EXPECT_DOUBLE_EQ(clean.loss_scale(), 32768);
  for (int r : {0, 5, 7}) {  // rank 0, a rank that speaks for no replica, the last
    std::map<int, v1::StepReport> one = by_rank;
    one[r].set_skipped(true);
    const v1::StepReport agg = AggregateStep(*dims, one);
    EXPECT_TRUE(agg.skipped()) << "rank " << r;
    EXPECT_DOUBLE_EQ(agg.loss_scale(), 32768) << "rank " << r;
  }
}

}  // namespace
}  // namespace shardtrain::coordinator
