#include "coordinator/scheduler.h"

#include <gtest/gtest.h>

namespace shardtrain::coordinator {
namespace {

std::vector<FreeWorker> Cpus(int n, int first = 1) {
  std::vector<FreeWorker> out;
  for (int i = first; i < first + n; ++i) out.push_back({"w-" + std::to_string(i), "cpu", {}});
  return out;
}

// Placements of one pass in which every free worker is also all the
// cluster's capacity, strict FIFO for jobs that can fit.
std::vector<Placement> Gangs(const std::vector<PendingJob>& fifo,
                             const std::vector<FreeWorker>& free) {
  return RunSchedulePass(fifo, free, free, /*reserve_after=*/0).placements;
}

TEST(SchedulerTest, GangNeedsAllWorkersAtOnce) {
  EXPECT_TRUE(RunSchedulePass({{"j1", 5, "cpu"}}, Cpus(4), Cpus(5), 0).placements.empty());
  auto p = Gangs({{"j1", 5, "cpu"}}, Cpus(5));
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].workers, (std::vector<std::string>{"w-1", "w-2", "w-3", "w-4", "w-5"}));
}

TEST(SchedulerTest, FifoAndRanksInWorkerOrder) {
  auto p = Gangs({{"j1", 2, "cpu"}, {"j2", 2, "cpu"}, {"j3", 2, "cpu"}}, Cpus(4));
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].job_id, "j1");
  EXPECT_EQ(p[0].workers, (std::vector<std::string>{"w-1", "w-2"}));
  EXPECT_EQ(p[1].job_id, "j2");
  EXPECT_EQ(p[1].workers, (std::vector<std::string>{"w-3", "w-4"}));
}

TEST(SchedulerTest, ReservingHeadBlocksSameDeviceOnly) {
  // j1 needs 8 of the 8 alive cpu workers, 4 free; it has been passed over
  // enough, so it reserves the cpu workers: j2 waits, the cuda job runs.
  std::vector<FreeWorker> free = Cpus(4);
  free.push_back({"w-9", "cuda", {}});
  std::vector<FreeWorker> alive = Cpus(8);
  alive.push_back({"w-9", "cuda", {}});
  PendingJob head{"j1", 8, "cpu"};
  head.passed_over = 2;
  auto pass = RunSchedulePass({head, {"j2", 1, "cpu"}, {"j3", 1, "cuda"}}, free, alive, 2);
  ASSERT_EQ(pass.placements.size(), 1u);
  EXPECT_EQ(pass.placements[0].job_id, "j3");
  EXPECT_EQ(pass.placements[0].workers, std::vector<std::string>{"w-9"});
  EXPECT_EQ(pass.waiting.at("j1"),
            "waiting for 8 cpu workers, 4 free; reserving the free cpu workers (passed over 2 "
            "times)");
  EXPECT_EQ(pass.waiting.at("j2"),
            "queued behind j1, which reserves the free cpu workers until it starts");
  EXPECT_TRUE(pass.passed_over.empty());
}

TEST(SchedulerTest, SmallJobBackfillsPastAHeadThatCannotFitYet) {
  // Same cluster, but j1 has been passed over only once: j2 backfills, and
  // j1 is counted as passed over.
  PendingJob head{"j1", 8, "cpu"};
  head.passed_over = 1;
  auto pass = RunSchedulePass({head, {"j2", 1, "cpu"}}, Cpus(4), Cpus(8), 2);
  ASSERT_EQ(pass.placements.size(), 1u);
  EXPECT_EQ(pass.placements[0].job_id, "j2");
  EXPECT_EQ(pass.waiting.at("j1"), "waiting for 8 cpu workers, 4 free");
  EXPECT_EQ(pass.passed_over, std::vector<std::string>{"j1"});
}

TEST(SchedulerTest, HeadLargerThanTheClusterNeverReservesAndNeverBlocks) {
  // One alive worker: a world-2 head can never fit, however often passed.
  PendingJob head{"j1", 2, "cpu"};
  head.passed_over = 100;
  auto pass = RunSchedulePass({head, {"j2", 1, "cpu"}}, Cpus(1), Cpus(1), 0);
  ASSERT_EQ(pass.placements.size(), 1u);
  EXPECT_EQ(pass.placements[0].job_id, "j2");
  EXPECT_EQ(pass.waiting.at("j1"), "waiting for 2 cpu workers, 1 free; only 1 alive can run it");
}

TEST(SchedulerTest, HeadStartsFirstOnceEnoughWorkersAttach) {
  // The head passed over many times; now two free: it takes them, the
  // world-1 job behind it waits.
  PendingJob head{"j1", 2, "cpu"};
  head.passed_over = 5;
  auto pass = RunSchedulePass({head, {"j2", 1, "cpu"}}, Cpus(2), Cpus(2), 3);
  ASSERT_EQ(pass.placements.size(), 1u);
  EXPECT_EQ(pass.placements[0].job_id, "j1");
  EXPECT_EQ(pass.waiting.at("j2"), "waiting for 1 cpu workers, 0 free");
}

TEST(SchedulerTest, PrecisionNeedsAWorkerThatSupportsIt) {
  PendingJob bf16{"j1", 1, "cpu"};
  bf16.precision = "bf16";
  auto pass = RunSchedulePass({bf16}, Cpus(2), Cpus(2), 0);
  EXPECT_TRUE(pass.placements.empty());
  EXPECT_EQ(pass.waiting.at("j1"),
            "waiting for 1 cpu (bf16) workers, 0 free; no alive worker can run cpu (bf16)");
  std::vector<FreeWorker> mixed = Cpus(1);
  mixed.push_back({"w-2", "cpu", {"fp32", "bf16"}});
  pass = RunSchedulePass({bf16}, mixed, mixed, 0);
  ASSERT_EQ(pass.placements.size(), 1u);
  EXPECT_EQ(pass.placements[0].workers, std::vector<std::string>{"w-2"});
}

TEST(SchedulerTest, AWorkerTakenForOnePrecisionIsNoLongerFreeForAnother) {
  // w-1 trains fp32 and bf16, w-2 fp32 only. j1 (bf16, 2) cannot fit; j2
  // (fp32) takes w-1, the first in order; then j3 (bf16) finds none free.
  std::vector<FreeWorker> free = {{"w-1", "cpu", {"fp32", "bf16"}}, {"w-2", "cpu", {}}};
  PendingJob j1{"j1", 2, "cpu"}, j2{"j2", 1, "cpu"}, j3{"j3", 1, "cpu"};
  j1.precision = j3.precision = "bf16";
  auto pass = RunSchedulePass({j1, j2, j3}, free, free, 5);
  ASSERT_EQ(pass.placements.size(), 1u);
  EXPECT_EQ(pass.placements[0].job_id, "j2");
  EXPECT_EQ(pass.placements[0].workers, std::vector<std::string>{"w-1"});
  EXPECT_EQ(pass.waiting.at("j1"),
            "waiting for 2 cpu (bf16) workers, 1 free; only 1 alive can run it");
  EXPECT_EQ(pass.waiting.at("j3"), "waiting for 1 cpu (bf16) workers, 0 free");
}

TEST(SchedulerTest, IgnoresOtherDevicesAndZeroWorld) {
  EXPECT_TRUE(Gangs({{"j1", 1, "cuda"}}, Cpus(3)).empty());
  EXPECT_TRUE(Gangs({{"j1", 0, "cpu"}}, Cpus(3)).empty());
}

TEST(SchedulerTest, ElasticJobTakesTheFirstFallbackSizeThatFits) {
  // 3 free: the full world 4 does not fit, 3 is not acceptable, 2 is.
  auto p = Gangs({{"j1", 4, "cpu", {2, 1}}, {"j2", 1, "cpu", {}}}, Cpus(3));
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].workers, (std::vector<std::string>{"w-1", "w-2"}));
  EXPECT_EQ(p[1].workers, std::vector<std::string>{"w-3"});
  // With enough workers the full world wins.
  EXPECT_EQ(Gangs({{"j1", 4, "cpu", {2}}}, Cpus(5))[0].workers.size(), 4u);
}

TEST(SchedulerTest, WorkerIdOrderIsNumeric) {
  EXPECT_TRUE(WorkerIdLess("w-2", "w-10"));
  EXPECT_FALSE(WorkerIdLess("w-10", "w-2"));
  EXPECT_TRUE(WorkerIdLess("w-0009", "w-0010"));
}

}  // namespace
}  // namespace shardtrain::coordinator
