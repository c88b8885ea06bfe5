// AnalyzeWhy (`shardtrain why`): a rank missing from a stuck collective, a
// rank stopped inside one, the slowest rank when nothing is stuck, and a job
// that is not running; and the text and JSON it prints.
#include "client/why.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace shardtrain::client {
namespace {

constexpr int64_t kNow = 1'700'000'100'000;

v1::CollectiveRecord Record(int64_t seq, const std::string& state, int64_t start_ms,
                            int64_t end_ms = 0) {
  v1::CollectiveRecord r;
  r.set_seq(seq);
  r.set_op("allreduce");
  r.set_group("dp.0");
  r.set_bytes(1'300'000);
  r.set_dtype("fp32");
  r.set_state(state);
  r.set_start_ms(start_ms);
  r.set_end_ms(end_ms);
  return r;
}

v1::RankDiagnostics* AddRank(v1::JobDiagnostics* d, int rank, int64_t since_heartbeat_ms) {
  v1::RankDiagnostics* r = d->add_ranks();
  r->set_rank(rank);
  r->set_worker_id("w-000" + std::to_string(rank + 1));
  r->set_worker_state(v1::WORKER_STATE_ALIVE);
  r->set_since_heartbeat_ms(since_heartbeat_ms);
  return r;
}

v1::JobDiagnostics Running() {
  v1::JobDiagnostics d;
  d.set_job_id("j-000007");
  d.set_state(v1::JOB_STATE_RUNNING);
  d.set_generation(1);
  d.set_now_ms(kNow);
  return d;
}

// Ranks 0, 1, 3 have waited 12 s in #57; rank 2's last heartbeat (14.2 s ago)
// saw it finish #56.
v1::JobDiagnostics StuckAt57() {
  v1::JobDiagnostics d = Running();
  for (int rank = 0; rank < 4; ++rank) {
    v1::RankDiagnostics* r = AddRank(&d, rank, rank == 2 ? 14'200 : 300);
    *r->add_recent_collectives() = Record(56, "done", kNow - 14'300, kNow - 14'250);
    if (rank != 2) *r->add_recent_collectives() = Record(57, "running", kNow - 12'000);
  }
  return d;
}

TEST(CliWhyTest, NamesTheRankMissingFromTheStuckCollective) {
  const v1::JobDiagnostics d = StuckAt57();
  WhyVerdict v = AnalyzeWhy(d);
  ASSERT_EQ(v.kind, WhyKind::kMissing) << v.summary;
  EXPECT_EQ(v.collective.seq(), 57);
  EXPECT_EQ(v.missing, std::vector<int>({2}));
  EXPECT_EQ(v.waiting, std::vector<int>({0, 1, 3}));
  EXPECT_DOUBLE_EQ(v.waited_s, 12.0);
  EXPECT_EQ(v.summary,
            "rank 2 (worker w-0003, last heartbeat 14.2 s ago, last seen at #56 done) is missing "
            "from collective #57 allreduce on dp.0 (1.3 MB); ranks 0, 1, 3 have waited 12.0 s in "
            "it");
  const std::string json = WhyJson(d, v);
  EXPECT_NE(json.find("\"verdict\": \"missing\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"missing_ranks\": [2], \"waiting_ranks\": [0, 1, 3]"), std::string::npos)
      << json;
  const std::string text = WhyText(d, v);
  EXPECT_NE(text.find("#56 done"), std::string::npos) << text;
  EXPECT_NE(text.find("RANK"), std::string::npos) << text;
}

TEST(CliWhyTest, ARankStoppedInsideTheCollectiveIsMissingByItsStaleHeartbeat) {
  // Every rank entered #57; rank 1 then stopped heartbeating (its worker hangs).
  v1::JobDiagnostics d = Running();
  for (int rank = 0; rank < 3; ++rank) {
    v1::RankDiagnostics* r = AddRank(&d, rank, rank == 1 ? 9'000 : 500);
    *r->add_recent_collectives() = Record(57, "running", kNow - 9'500);
  }
  WhyVerdict v = AnalyzeWhy(d);
  ASSERT_EQ(v.kind, WhyKind::kMissing) << v.summary;
  EXPECT_EQ(v.missing, std::vector<int>({1}));
  EXPECT_EQ(v.waiting, std::vector<int>({0, 2}));
  EXPECT_NE(v.summary.find("stopped inside it"), std::string::npos) << v.summary;
}

TEST(CliWhyTest, AStaleRanksOldRunningRecordIsNotTakenForTheStuckCollective) {
  // Rank 2's last heartbeat saw #56 running (since then it finished it and
  // stopped); the others wait in #57, which started later.
  v1::JobDiagnostics d = Running();
  for (int rank = 0; rank < 4; ++rank) {
    v1::RankDiagnostics* r = AddRank(&d, rank, rank == 2 ? 20'000 : 200);
    if (rank == 2) {
      *r->add_recent_collectives() = Record(56, "running", kNow - 20'100);
    } else {
      *r->add_recent_collectives() = Record(56, "done", kNow - 20'100, kNow - 19'900);
      *r->add_recent_collectives() = Record(57, "running", kNow - 19'800);
    }
  }
  WhyVerdict v = AnalyzeWhy(d);
  ASSERT_EQ(v.kind, WhyKind::kMissing) << v.summary;
  EXPECT_EQ(v.collective.seq(), 57);
  EXPECT_EQ(v.missing, std::vector<int>({2}));
}

TEST(CliWhyTest, ShortRunningCollectivesAreNotStuckAndTheSlowestRankWaitedLeast) {
  // Rank 1 arrives last at every collective, so it waits least in them.
  v1::JobDiagnostics d = Running();
  const int64_t waits[] = {40, 2, 38};
  for (int rank = 0; rank < 3; ++rank) {
    v1::RankDiagnostics* r = AddRank(&d, rank, 100);
    for (int64_t seq = 10; seq < 14; ++seq) {
      const int64_t end = kNow - 1'000 + seq * 50;
      *r->add_recent_collectives() = Record(seq, "done", end - waits[rank], end);
    }
    *r->add_recent_collectives() = Record(14, "running", kNow - 30);  // in progress, not stuck
  }
  WhyVerdict v = AnalyzeWhy(d);
  ASSERT_EQ(v.kind, WhyKind::kSlowest) << v.summary;
  EXPECT_EQ(v.slowest, 1);
  EXPECT_DOUBLE_EQ(v.ranks[1].mean_wait_ms, 2.0);
  EXPECT_DOUBLE_EQ(v.ranks[0].mean_wait_ms, 40.0);
  EXPECT_EQ(v.summary,
            "no collective is stuck; rank 1 (worker w-0002) is the slowest: it waited 2.0 ms on "
            "average in its recent collectives, the others waited for it (0: 40.0 ms, 2: 38.0 ms)");
  EXPECT_NE(WhyJson(d, v).find("\"slowest_rank\": 1"), std::string::npos);
}

TEST(CliWhyTest, AJobThatIsNotRunningSaysItsStateAndReason) {
  v1::JobDiagnostics d = StuckAt57();
  d.set_state(v1::JOB_STATE_RECOVERING);
  d.set_failure_reason("rank 2 on w-0003: lease expired");
  WhyVerdict v = AnalyzeWhy(d);
  EXPECT_EQ(v.kind, WhyKind::kNotRunning);
  EXPECT_EQ(v.summary, "job j-000007 is RECOVERING, not RUNNING: rank 2 on w-0003: lease expired");
  EXPECT_NE(WhyJson(d, v).find("\"verdict\": \"not_running\""), std::string::npos);
}

TEST(CliWhyTest, APendingJobSaysWhatItWaitsFor) {
  v1::JobDiagnostics d;
  d.set_job_id("j-000008");
  d.set_state(v1::JOB_STATE_PENDING);
  d.set_pending_reason(
      "waiting for 1 cuda (bf16) workers, 0 free; no alive worker can run cuda (bf16)");
  WhyVerdict v = AnalyzeWhy(d);
  EXPECT_EQ(v.kind, WhyKind::kNotRunning);
  EXPECT_EQ(v.summary,
            "job j-000008 is PENDING, not RUNNING: waiting for 1 cuda (bf16) workers, 0 free; no "
            "alive worker can run cuda (bf16)");
  EXPECT_NE(WhyJson(d, v).find("\"pending_reason\": \"waiting for 1 cuda (bf16) workers"),
            std::string::npos)
      << WhyJson(d, v);
  // Recovering and waiting for workers: the failure first, then the wait.
  d.set_state(v1::JOB_STATE_RECOVERING);
  d.set_failure_reason("rank 1 failed");
  d.set_pending_reason("waiting for 2 cpu workers, 1 free");
  EXPECT_EQ(AnalyzeWhy(d).summary,
            "job j-000008 is RECOVERING, not RUNNING: rank 1 failed; waiting for 2 cpu workers, 1 "
            "free");
}

TEST(CliWhyTest, NoRecordsYet) {
  v1::JobDiagnostics d = Running();
  AddRank(&d, 0, 100);
  WhyVerdict v = AnalyzeWhy(d);
  EXPECT_EQ(v.kind, WhyKind::kNoRecords) << v.summary;
}

TEST(CliWhyTest, HumanBytes) {
  EXPECT_EQ(HumanBytes(512), "512 B");
  EXPECT_EQ(HumanBytes(1'300'000), "1.3 MB");
  EXPECT_EQ(HumanBytes(4'000), "4.0 kB");
}

}  // namespace
}  // namespace shardtrain::client
