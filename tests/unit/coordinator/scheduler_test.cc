#include "coordinator/scheduler.h"

#include <gtest/gtest.h>

namespace shardtrain::coordinator {
namespace {

std::vector<FreeWorker> Cpus(int n, int first = 1) {
  std::vector<FreeWorker> out;
  for (int i = first; i < first + n; ++i) out.push_back({"w-" + std::to_string(i), "cpu"});
  return out;
}

TEST(SchedulerTest, GangNeedsAllWorkersAtOnce) {
  EXPECT_TRUE(ScheduleGangs({{"j1", 5, "cpu"}}, Cpus(4)).empty());
  auto p = ScheduleGangs({{"j1", 5, "cpu"}}, Cpus(5));
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].workers, (std::vector<std::string>{"w-1", "w-2", "w-3", "w-4", "w-5"}));
}

TEST(SchedulerTest, FifoAndRanksInWorkerOrder) {
  auto p = ScheduleGangs({{"j1", 2, "cpu"}, {"j2", 2, "cpu"}, {"j3", 2, "cpu"}}, Cpus(4));
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].job_id, "j1");
  EXPECT_EQ(p[0].workers, (std::vector<std::string>{"w-1", "w-2"}));
  EXPECT_EQ(p[1].job_id, "j2");
  EXPECT_EQ(p[1].workers, (std::vector<std::string>{"w-3", "w-4"}));
}

TEST(SchedulerTest, HeadOfLineBlocksSameDeviceOnly) {
  // j1 needs 8 and blocks the smaller cpu job behind it (no starvation of j1),
  // but a cuda job is independent.
  std::vector<FreeWorker> free = Cpus(4);
  free.push_back({"w-9", "cuda"});
  auto p = ScheduleGangs({{"j1", 8, "cpu"}, {"j2", 1, "cpu"}, {"j3", 1, "cuda"}}, free);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].job_id, "j3");
  EXPECT_EQ(p[0].workers, std::vector<std::string>{"w-9"});
}

TEST(SchedulerTest, IgnoresOtherDevicesAndZeroWorld) {
  EXPECT_TRUE(ScheduleGangs({{"j1", 1, "cuda"}}, Cpus(3)).empty());
  EXPECT_TRUE(ScheduleGangs({{"j1", 0, "cpu"}}, Cpus(3)).empty());
}

TEST(SchedulerTest, ElasticJobTakesTheFirstFallbackSizeThatFits) {
  // 3 free: the full world 4 does not fit, 3 is not acceptable, 2 is.
  auto p = ScheduleGangs({{"j1", 4, "cpu", {2, 1}}, {"j2", 1, "cpu", {}}}, Cpus(3));
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].workers, (std::vector<std::string>{"w-1", "w-2"}));
  EXPECT_EQ(p[1].workers, std::vector<std::string>{"w-3"});
  // With enough workers the full world wins.
  EXPECT_EQ(ScheduleGangs({{"j1", 4, "cpu", {2}}}, Cpus(5))[0].workers.size(), 4u);
}

TEST(SchedulerTest, WorkerIdOrderIsNumeric) {
  EXPECT_TRUE(WorkerIdLess("w-2", "w-10"));
  EXPECT_FALSE(WorkerIdLess("w-10", "w-2"));
  EXPECT_TRUE(WorkerIdLess("w-0009", "w-0010"));
}

}  // namespace
}  // namespace shardtrain::coordinator
