#include "coordinator/plan_builder.h"

#include <gtest/gtest.h>

#include <set>

namespace shardtrain::coordinator {
namespace {

v1::Job JobOf(int world) {
  v1::Job job;
  job.set_job_id("j");
  for (int r = 0; r < world; ++r) {
    auto* a = job.add_ranks();
    a->set_rank(r);
    a->set_worker_id("w-" + std::to_string(r + 1));
  }
  return job;
}

TEST(PlanBuilderTest, MeshCoordinatesAndGroupsCoverEveryRankOnce) {
  for (int dp : {1, 2, 3}) {
    for (int tp : {1, 2}) {
      for (int pp : {1, 2, 4}) {
        SpecSummary s;
        s.dp = dp, s.tp = tp, s.pp = pp, s.world = dp * tp * pp;
        s.global_batch = 12 * dp, s.micro_batch = 3, s.seq_len = 8;
        auto plan = BuildPlan(s, JobOf(s.world));
        ASSERT_TRUE(plan.ok()) << plan.status();
        std::set<std::tuple<int, int, int>> coords;
        for (const auto& r : plan->ranks()) {
          coords.insert({r.dp(), r.tp(), r.pp()});
          EXPECT_EQ(r.rank(), (r.pp() * dp + r.dp()) * tp + r.tp());
          EXPECT_EQ(r.first_sample(), r.dp() * 12);
          EXPECT_EQ(r.num_samples(), 12);
        }
        EXPECT_EQ(coords.size(), size_t(s.world));
        for (const char* kind : {"dp", "tp", "pp"}) {
          std::multiset<int> seen;
          for (const auto& g : plan->groups()) {
            if (g.kind() == kind) seen.insert(g.ranks().begin(), g.ranks().end());
          }
          EXPECT_EQ(seen.size(), size_t(s.world)) << kind;
          EXPECT_EQ(std::set<int>(seen.begin(), seen.end()).size(), size_t(s.world)) << kind;
        }
        EXPECT_EQ(plan->grad_accum_steps(), 4);
        EXPECT_DOUBLE_EQ(plan->bubble_fraction(), pp > 1 ? double(pp - 1) / (4 + pp - 1) : 0.0);
      }
    }
  }
}

TEST(PlanBuilderTest, WorldMismatchNamesEveryFactor) {
  SpecSummary s;
  s.dp = 2, s.tp = 1, s.pp = 3;
  auto plan = BuildPlan(s, JobOf(4));
  ASSERT_TRUE(absl::IsInvalidArgument(plan.status()));
  EXPECT_EQ(plan.status().message(), "dp·tp·pp = 2·1·3 = 6 ≠ world 4");
}

}  // namespace
}  // namespace shardtrain::coordinator
