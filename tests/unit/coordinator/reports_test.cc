// AggregateStep: the job's step report from every rank's, field by field by
// the ranks' places in the mesh. Here val_loss (present only on the steps
// that evaluated) beside loss, whose rule it shares.
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

}  // namespace
}  // namespace shardtrain::coordinator
