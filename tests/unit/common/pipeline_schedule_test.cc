// Pipeline schedules (common/pipeline_schedule.h): the exact action lists of
// small cases written out by hand, the invariants of every list (each
// micro-batch forwarded once, then backwarded once), the activation sets a
// stage must keep, and the discrete-event simulation: its idle fraction is
// the textbook bubble (pp - 1) / (m + pp - 1) for both schedules, and it
// reports a schedule that can never finish instead of looping.
#include "common/pipeline_schedule.h"

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace shardtrain::parallel {
namespace {

constexpr PipelineSchedule kSchedules[] = {PipelineSchedule::kGpipe, PipelineSchedule::k1F1B};

TEST(ScheduleTest, GpipeTwoStagesFourMicroBatches) {
  EXPECT_EQ(ActionsToString(GpipeActions(0, 2, 4)), "F0 F1 F2 F3 B0 B1 B2 B3");
  EXPECT_EQ(ActionsToString(GpipeActions(1, 2, 4)), "F0 F1 F2 F3 B0 B1 B2 B3");
}

TEST(ScheduleTest, OneFOneBTwoStagesFourMicroBatches) {
  // Stage 0 warms up with one forward; the last stage has no warm-up.
  EXPECT_EQ(ActionsToString(OneFOneBActions(0, 2, 4)), "F0 F1 B0 F2 B1 F3 B2 B3");
  EXPECT_EQ(ActionsToString(OneFOneBActions(1, 2, 4)), "F0 B0 F1 B1 F2 B2 F3 B3");
}

TEST(ScheduleTest, OneFOneBWarmupIsCappedByMicroBatches) {
  EXPECT_EQ(ActionsToString(OneFOneBActions(0, 4, 2)), "F0 F1 B0 B1");
  EXPECT_EQ(ActionsToString(OneFOneBActions(1, 4, 4)), "F0 F1 F2 B0 F3 B1 B2 B3");
  EXPECT_EQ(ActionsToString(OneFOneBActions(3, 4, 1)), "F0 B0");
}

TEST(ScheduleTest, OneStageAlternatesUnderBothSchedules) {
  for (PipelineSchedule schedule : kSchedules) {
    EXPECT_EQ(ActionsToString(PipelineActions(schedule, 0, 1, 3)), "F0 B0 F1 B1 F2 B2");
  }
  EXPECT_EQ(ActionsToString(PipelineActions(PipelineSchedule::kGpipe, 1, 2, 2)), "F0 F1 B0 B1");
  EXPECT_EQ(ActionsToString(PipelineActions(PipelineSchedule::k1F1B, 0, 2, 2)), "F0 F1 B0 B1");
}

TEST(ScheduleTest, EveryMicroBatchForwardedOnceThenBackwardedOnceInOrder) {
  for (PipelineSchedule schedule : kSchedules) {
    for (int stages : {1, 2, 3, 4, 8}) {
      for (int m : {1, 2, 3, 4, 8, 13}) {
        for (int s = 0; s < stages; ++s) {
          SCOPED_TRACE(testing::Message()
                       << EnumName(schedule) << " pp " << stages << " m " << m << " stage " << s);
          const std::vector<PipelineAction> actions = PipelineActions(schedule, s, stages, m);
          ASSERT_EQ(actions.size(), size_t(2 * m));
          std::vector<int> forwarded(m, 0), backwarded(m, 0);
          int next_fwd = 0, next_bwd = 0;
          for (const PipelineAction& a : actions) {
            ASSERT_GE(a.micro, 0);
            ASSERT_LT(a.micro, m);
            if (a.kind == StepKind::kForward) {
              EXPECT_EQ(a.micro, next_fwd++) << "forwards in micro order";
              ++forwarded[a.micro];
            } else {
              EXPECT_EQ(forwarded[a.micro], 1) << "B" << a.micro << " before its forward";
              EXPECT_EQ(a.micro, next_bwd++) << "backwards in micro order";
              ++backwarded[a.micro];
            }
          }
          EXPECT_EQ(forwarded, std::vector<int>(m, 1));
          EXPECT_EQ(backwarded, std::vector<int>(m, 1));
        }
      }
    }
  }
}

TEST(ScheduleTest, PeakInFlight) {
  for (int stages : {2, 4}) {
    for (int m : {1, 4, 8}) {
      for (int s = 0; s < stages; ++s) {
        SCOPED_TRACE(testing::Message() << "pp " << stages << " m " << m << " stage " << s);
        EXPECT_EQ(PeakInFlight(PipelineActions(PipelineSchedule::kGpipe, s, stages, m)), m);
        EXPECT_EQ(PeakInFlight(PipelineActions(PipelineSchedule::k1F1B, s, stages, m)),
                  std::min(m, stages - s));
      }
    }
  }
  // Spot values, not derived from the formula above.
  EXPECT_EQ(PeakInFlight(OneFOneBActions(0, 4, 8)), 4);
  EXPECT_EQ(PeakInFlight(OneFOneBActions(3, 4, 8)), 1);
  EXPECT_EQ(PeakInFlight(OneFOneBActions(1, 4, 2)), 2);
  EXPECT_EQ(PeakInFlight(PipelineActions(PipelineSchedule::kGpipe, 0, 1, 8)), 1);
}

// An interleaved stage's slots per chunk: each chunk's own peak. Stage 0 of
// pp 2, v 2, m 4 forwards F0.0 F1.0 F0.1 F1.1 F2.0 before B0.1: three of
// chunk 0's micro-batches at once, then F3.0 a fourth before B0.0.
TEST(ScheduleTest, PeakInFlightPerChunk) {
  const std::vector<PipelineAction> a = InterleavedActions(0, 2, 4, 2);
  EXPECT_EQ(ActionsToString(a), "F0 F1 F0.1 F1.1 F2 B0.1 F3 B1.1 F2.1 B0 F3.1 B1 B2.1 B3.1 B2 B3");
  EXPECT_EQ(PeakInFlightPerChunk(a, 2), (std::vector<int>{4, 2}));
  EXPECT_EQ(PeakInFlight(a, 1), 2);
  EXPECT_EQ(PipelineActions(PipelineSchedule::k1F1B, 0, 2, 4, 2), a);
  EXPECT_EQ(PeakInFlightPerChunk(OneFOneBActions(0, 2, 4), 1), (std::vector<int>{2}));
}

TEST(ScheduleTest, BubbleFraction) {
  EXPECT_DOUBLE_EQ(BubbleFraction(1, 4), 0.0);
  EXPECT_DOUBLE_EQ(BubbleFraction(2, 4), 1.0 / 5);
  EXPECT_DOUBLE_EQ(BubbleFraction(4, 8), 3.0 / 11);
}

TEST(ScheduleTest, SimulatedIdleIsTheBubble) {
  for (PipelineSchedule schedule : kSchedules) {
    for (double bwd : {1.0, 2.0}) {
      for (int stages : {1, 2, 3, 4, 8}) {
        for (int m : {1, 2, 4, 8, 16}) {
          SCOPED_TRACE(testing::Message()
                       << EnumName(schedule) << " pp " << stages << " m " << m << " bwd " << bwd);
          absl::StatusOr<SimulatedTimeline> t = SimulatePipeline(schedule, stages, m, 1.0, bwd);
          ASSERT_TRUE(t.ok()) << t.status();
          EXPECT_NEAR(t->makespan, (m + stages - 1) * (1.0 + bwd), 1e-9);
          EXPECT_NEAR(t->idle_fraction(), BubbleFraction(stages, m), 1e-9);
          ASSERT_EQ(t->busy.size(), size_t(stages));
          for (int s = 0; s < stages; ++s) {
            EXPECT_NEAR(t->busy[s], m * (1.0 + bwd), 1e-9);
            EXPECT_NEAR(t->idle[s], t->makespan - t->busy[s], 1e-9);
            ASSERT_EQ(t->actions[s].size(), size_t(2 * m));
          }
        }
      }
    }
  }
}

// Interleaved 1F1B (v chunks per stage): every micro-batch passes every
// chunk once each way, forwards through chunks in order and backwards in
// reverse; v = 1 is 1F1B; the order of Megatron-LM's schedule on a spot
// case; and the simulated idle time is the bubble (pp − 1)/(v·m + pp − 1),
// v times smaller in its m-dependence than 1F1B's.
TEST(ScheduleTest, InterleavedRunsEveryMicroThroughEveryChunk) {
  for (int stages : {2, 4}) {
    for (int v : {1, 2, 3}) {
      for (int m : {stages, 2 * stages, 4 * stages}) {
        for (int s = 0; s < stages; ++s) {
          SCOPED_TRACE(testing::Message()
                       << "pp " << stages << " v " << v << " m " << m << " s " << s);
          const std::vector<PipelineAction> a = InterleavedActions(s, stages, m, v);
          if (v == 1) {
            EXPECT_EQ(a, OneFOneBActions(s, stages, m));
          }
          ASSERT_EQ(a.size(), size_t(2 * m * v));
          std::map<std::pair<int, int>, int> f_at, b_at;
          for (size_t i = 0; i < a.size(); ++i) {
            auto& at = a[i].kind == StepKind::kForward ? f_at : b_at;
            EXPECT_TRUE(at.emplace(std::make_pair(a[i].micro, a[i].chunk), int(i)).second);
          }
          EXPECT_EQ(f_at.size(), size_t(m * v));
          EXPECT_EQ(b_at.size(), size_t(m * v));
          for (int micro = 0; micro < m; ++micro) {
            for (int c = 1; c < v; ++c) {
              const auto before = std::make_pair(micro, c - 1), at = std::make_pair(micro, c);
              EXPECT_LT(f_at[before], f_at[at]);
              EXPECT_GT(b_at[before], b_at[at]);
            }
          }
        }
      }
    }
  }
  // pp 2, v 2, m 2: stage 0 warms up with (2 − 0 − 1)·2 + (2 − 1)·2 = 4
  // forwards (chunk 0 of micro 0, 1, then chunk 1), stage 1 with 2.
  EXPECT_EQ(ActionsToString(InterleavedActions(0, 2, 2, 2)), "F0 F1 F0.1 F1.1 B0.1 B1.1 B0 B1");
  EXPECT_EQ(ActionsToString(InterleavedActions(1, 2, 2, 2)), "F0 F1 F0.1 B0.1 F1.1 B1.1 B0 B1");
  EXPECT_DOUBLE_EQ(BubbleFraction(4, 8, 2), 3.0 / 19);
}

TEST(ScheduleTest, InterleavedSimulatedIdleIsTheBubble) {
  for (int stages : {2, 4}) {
    for (int v : {1, 2, 4}) {
      for (int m : {stages, 2 * stages, 4 * stages}) {
        SCOPED_TRACE(testing::Message() << "pp " << stages << " v " << v << " m " << m);
        absl::StatusOr<SimulatedTimeline> t = SimulateInterleaved(stages, m, v, 1.0, 1.0);
        ASSERT_TRUE(t.ok()) << t.status();
        EXPECT_NEAR(t->idle_fraction(), BubbleFraction(stages, m, v), 1e-9);
        if (v > 1) {
          EXPECT_LT(t->idle_fraction(), BubbleFraction(stages, m));
        }
      }
    }
  }
  EXPECT_EQ(SimulateInterleaved(4, 6, 2, 1, 1).status().code(),
            absl::StatusCode::kInvalidArgument);  // m not a multiple of pp
}

TEST(ScheduleTest, SimulationRespectsDependencies) {
  absl::StatusOr<SimulatedTimeline> t = SimulatePipeline(PipelineSchedule::k1F1B, 2, 2, 1.0, 2.0);
  ASSERT_TRUE(t.ok()) << t.status();
  // Stage 0: F0 [0,1] F1 [1,2] B0 waits for stage 1's B0 [2,4] -> [4,6], B1
  // waits for stage 1's B1 [5,7] -> [7,9].
  ASSERT_EQ(t->actions[0].size(), 4u);
  EXPECT_DOUBLE_EQ(t->actions[0][2].start, 4.0);
  EXPECT_DOUBLE_EQ(t->actions[0][3].start, 7.0);
  EXPECT_DOUBLE_EQ(t->actions[1][1].start, 2.0);
  EXPECT_DOUBLE_EQ(t->makespan, 9.0);
}

TEST(ScheduleTest, DeadlockIsReported) {
  // Stage 0 wants B0 before F0, but B0 needs stage 1's B0, which needs F0.
  std::vector<std::vector<PipelineAction>> cycle = {
      {{StepKind::kBackward, 0}, {StepKind::kForward, 0}},
      {{StepKind::kForward, 0}, {StepKind::kBackward, 0}}};
  absl::StatusOr<SimulatedTimeline> t = SimulateActions(cycle, 1, 1);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(t.status().message().find("stage 0 waits at B0"), std::string::npos) << t.status();
  EXPECT_NE(t.status().message().find("stage 1 waits at F0"), std::string::npos) << t.status();

  // A forward that the previous stage never runs.
  std::vector<std::vector<PipelineAction>> missing = {
      {{StepKind::kForward, 0}, {StepKind::kBackward, 0}},
      {{StepKind::kForward, 0}, {StepKind::kForward, 1}, {StepKind::kBackward, 0}}};
  EXPECT_EQ(SimulateActions(missing, 1, 1).status().code(), absl::StatusCode::kFailedPrecondition);

  std::vector<std::vector<PipelineAction>> twice = {
      {{StepKind::kForward, 0}, {StepKind::kForward, 0}}};
  EXPECT_EQ(SimulateActions(twice, 1, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SimulateActions({}, 1, 1).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardtrain::parallel
