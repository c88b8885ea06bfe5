// Checkpoint commits at the coordinator: the record (RecordCommit, pure),
// and the three calls ranks make (ReportCheckpoint, WaitCheckpointShards,
// CommitCheckpoint) against a fake clock, including the failures the design
// must survive: a rank 0 that dies before committing, a coordinator restart
// between the reports and the commit, stale generations, retries.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <thread>

#include "common/metrics.h"
#include "coordinator/checkpoint_record.h"
#include "coordinator/coordinator.h"
#include "coordinator/service.h"
#include "coordinator/spec_validator.h"
#include "tests/unit/coordinator/fenced.h"

namespace shardtrain::coordinator {
namespace {

// ---------------------------------------------------------------- the record

v1::CheckpointInfo Info(int64_t step, int64_t generation = 1) {
  v1::CheckpointInfo c;
  c.set_step(step);
  c.set_generation(generation);
  c.set_dir("ckpt/step-" + std::to_string(step));
  return c;
}

std::vector<int64_t> StepsOf(const CheckpointRecord& record) {
  std::vector<int64_t> out;
  for (const v1::CheckpointInfo& c : record) out.push_back(c.step());
  return out;
}
std::vector<int64_t> StepsOf(const std::vector<v1::CheckpointInfo>& infos) {
  std::vector<int64_t> out;
  for (const v1::CheckpointInfo& c : infos) out.push_back(c.step());
  return out;
}

TEST(CheckpointRecordTest, KeepsTheNewestAndPrunesTheOldestBeyondKeep) {
  CheckpointRecord record;
  std::vector<std::vector<int64_t>> pruned;
  std::vector<int64_t> keep_from;
  for (int64_t step : {10, 20, 30, 40}) {
    const RecordedCommit r = RecordCommit(&record, Info(step), /*keep=*/2);
    pruned.push_back(StepsOf(r.pruned));
    keep_from.push_back(r.keep_from_step);
    EXPECT_TRUE(r.superseded.empty());
  }
  EXPECT_EQ(StepsOf(record), (std::vector<int64_t>{30, 40}));
  EXPECT_EQ(pruned, (std::vector<std::vector<int64_t>>{{}, {}, {10}, {20}}));
  EXPECT_EQ(keep_from, (std::vector<int64_t>{10, 10, 20, 30}));
}

TEST(CheckpointRecordTest, CommitOfAnOlderStepSupersedesTheNewerOnesAndIsNeverPruned) {
  CheckpointRecord record;
  for (int64_t step : {10, 20, 30}) RecordCommit(&record, Info(step), /*keep=*/3);
  // The job resumed from 10 (20 and 30 failed their checksums) and commits 20
  // again: 20 is replaced and 30 is off the record, not pruned (its directory
  // is being rewritten), and the newest entry is the new commit.
  const RecordedCommit r = RecordCommit(&record, Info(20, /*generation=*/2), /*keep=*/1);
  EXPECT_EQ(StepsOf(record), (std::vector<int64_t>{20}));
  EXPECT_EQ(record.Get(0).generation(), 2);
  EXPECT_EQ(StepsOf(r.superseded), (std::vector<int64_t>{20, 30}));
  EXPECT_EQ(StepsOf(r.pruned), (std::vector<int64_t>{10}));
  EXPECT_EQ(r.keep_from_step, 20);
}

TEST(CheckpointRecordTest, FindCommitMatchesStepAndGeneration) {
  CheckpointRecord record;
  RecordCommit(&record, Info(10, 3), 3);
  ASSERT_NE(FindCommit(record, 10, 3), nullptr);
  EXPECT_EQ(FindCommit(record, 10, 3)->dir(), "ckpt/step-10");
  EXPECT_EQ(FindCommit(record, 10, 2), nullptr);
  EXPECT_EQ(FindCommit(record, 20, 3), nullptr);
}

// ---------------------------------------------------------------- the calls

// A job of `dp` ranks with checkpoint.keep `keep`, the checkpoint fields
// `extra` (", on_failure: fail") and one restart allowed.
std::string Spec(int dp, int keep, const std::string& extra = "") {
  return "name: t\nmodel: {layers: 2, heads: 2, dim: 16, context: 16, vocab: 256}\n"
         "data: {train: data/x.txt}\nbatch: {global: " +
         std::to_string(2 * dp) + ", micro: 2, seq_len: 8}\nparallel: {dp: " + std::to_string(dp) +
         "}\nsteps: 100\nmax_restarts: 1\ncheckpoint: {every: 10, dir: ckpt/t, keep: " +
         std::to_string(keep) + extra + "}\n";
}

class CheckpointCommitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/st-ckpt-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    Open();
  }
  void TearDown() override {
    core_.reset();
    std::filesystem::remove_all(dir_);
  }

  // (Re)opens the coordinator on the SQLite state in dir_: a restart.
  void Open() {
    core_.reset();
    CoordinatorOptions o = TestOptions();
    o.lease_ms = 1000;
    auto store = OpenSqliteStateStore(dir_);
    ASSERT_TRUE(store.ok()) << store.status();
    auto c = Coordinator::Create(o, *std::move(store), ValidateSpec, &clock_);
    ASSERT_TRUE(c.ok()) << c.status();
    core_ = *std::move(c);
  }

  // `world` workers and a job of that many ranks, every rank started.
  void StartJob(int world, int keep, const std::string& checkpoint_extra = "") {
    for (int i = 0; i < world; ++i) Register();
    v1::SubmitJobRequest s;
    s.set_spec_yaml(Spec(world, keep, checkpoint_extra));
    auto job = core_->SubmitJob(s);
    ASSERT_TRUE(job.ok()) << job.status();
    job_ = job->job_id();
    StartAll();
  }

  void Register() {
    v1::RegisterWorkerRequest r;
    r.set_collective_address("127.0.0.1");
    r.add_devices()->set_kind("cpu");
    ASSERT_TRUE(core_->RegisterWorker(Fenced(r)).ok());
  }

  // Each rank of the current generation acknowledges it, as daemons do.
  void StartAll() {
    const v1::Job job = Job();
    for (const v1::RankAssignment& r : job.ranks()) {
      v1::HeartbeatRequest hb;
      hb.set_worker_id(r.worker_id());
      ASSERT_TRUE(core_->Heartbeat(Fenced(hb)).ok());
      hb.set_job_id(job_);
      hb.set_generation(job.generation());
      ASSERT_TRUE(core_->Heartbeat(Fenced(hb)).ok());
    }
  }

  v1::Job Job() { return *core_->GetJob(job_); }
  std::string WorkerOf(int rank) { return Job().ranks(rank).worker_id(); }

  // Rank `rank` of the current generation reports its shard of `step`
  // (1000·(rank+1) bytes); returns whether that completed the set.
  absl::StatusOr<bool> Report(int rank, int64_t step) {
    const v1::Job job = Job();
    v1::ReportCheckpointRequest r;
    r.set_worker_id(job.ranks(rank).worker_id());
    v1::CheckpointShard* s = r.mutable_shard();
    s->set_job_id(job_);
    s->set_generation(job.generation());
    s->set_rank(rank);
    s->set_step(step);
    s->set_bytes(1000 * (rank + 1));
    return core_->ReportCheckpoint(Fenced(r));
  }
  void ReportAll(int64_t step) {
    for (int rank = 0; rank < Job().world(); ++rank) ASSERT_TRUE(Report(rank, step).ok());
  }

  // Rank `rank` could not write its shard of `step`: `cause` about
  // <volume>/ck/step-<step>, of kind `reason`.
  absl::StatusOr<v1::ReportCheckpointFailureResponse> ReportFailure(
      int rank, int64_t step, const std::string& cause = "No space left on device",
      const std::string& reason = "no_space") {
    const v1::Job job = Job();
    v1::ReportCheckpointFailureRequest r;
    r.set_job_id(job_);
    r.set_generation(job.generation());
    r.set_worker_id(job.ranks(rank).worker_id());
    v1::CheckpointFailure* f = r.mutable_failure();
    f->set_rank(rank);
    f->set_step(step);
    f->set_cause(cause);
    f->set_path("/v/ck/step-" + std::to_string(step));
    f->set_reason(reason);
    return core_->ReportCheckpointFailure(Fenced(r));
  }

  v1::WaitCheckpointShardsRequest WaitRequest(int64_t step, int64_t wait_ms) {
    const v1::Job job = Job();
    v1::WaitCheckpointShardsRequest w;
    w.set_job_id(job_);
    w.set_generation(job.generation());
    w.set_rank(0);
    w.set_worker_id(job.ranks(0).worker_id());
    w.set_step(step);
    w.set_wait_ms(wait_ms);
    return Fenced(w);
  }

  // `rank` (0 unless a test says) commits `step` for the current generation.
  absl::StatusOr<v1::CommitCheckpointResponse> Commit(int64_t step, int rank = 0) {
    const v1::Job job = Job();
    v1::CommitCheckpointRequest c;
    c.set_job_id(job_);
    c.set_generation(job.generation());
    c.set_rank(rank);
    c.set_worker_id(job.ranks(rank).worker_id());
    c.set_step(step);
    c.set_dir("ckpt/t/step-" + std::to_string(step));
    c.set_manifest_path(c.dir() + "/manifest.txt");
    return core_->CommitCheckpoint(Fenced(c));
  }

  std::vector<int64_t> Listed() {  // newest first, as `shardtrain checkpoints`
    absl::StatusOr<v1::ListCheckpointsResponse> list = core_->ListCheckpoints(job_);
    EXPECT_TRUE(list.ok()) << list.status();
    std::vector<int64_t> out;
    if (list.ok()) {
      for (const v1::CheckpointInfo& c : list->checkpoints()) out.push_back(c.step());
    }
    return out;
  }

  // Rank 1 reports a failure: the job recovers, and once its two workers
  // have heartbeaten after the failure (a worker of a failed generation may
  // be the dead one) it re-gangs on them as the next generation; returns
  // the run command rank 1 then receives.
  v1::RunAssignment FailRank1AndRecover() {
    const v1::Job job = Job();
    v1::ReportFailureRequest f;
    f.set_job_id(job_);
    f.set_generation(job.generation());
    f.set_rank(1);
    f.set_worker_id(job.ranks(1).worker_id());
    f.set_reason("killed");
    EXPECT_TRUE(core_->ReportFailure(Fenced(f)).ok());
    core_->Tick();
    EXPECT_EQ(Job().state(), v1::JOB_STATE_RECOVERING) << "ganged before a heartbeat";
    for (const v1::RankAssignment& r : job.ranks()) {
      v1::HeartbeatRequest beat;
      beat.set_worker_id(r.worker_id());
      EXPECT_TRUE(core_->Heartbeat(Fenced(beat)).ok());
    }
    core_->Tick();
    const v1::Job again = Job();
    EXPECT_EQ(again.state(), v1::JOB_STATE_SCHEDULED);
    EXPECT_EQ(again.generation(), job.generation() + 1);
    v1::HeartbeatRequest hb;
    hb.set_worker_id(again.ranks(1).worker_id());
    auto resp = core_->Heartbeat(Fenced(hb));
    EXPECT_TRUE(resp.ok() && resp->commands_size() == 1 && resp->commands(0).has_run());
    StartAll();
    return resp.ok() && resp->commands_size() == 1 ? resp->commands(0).run() : v1::RunAssignment();
  }

  FakeClock clock_;
  std::string dir_;
  std::unique_ptr<Coordinator> core_;
  std::string job_;
};

TEST_F(CheckpointCommitTest, CommitNeedsEveryRanksReportAndIsRecordedWithItsSize) {
  StartJob(2, /*keep=*/3);
  EXPECT_EQ(*Report(0, 10), false);
  absl::StatusOr<v1::CommitCheckpointResponse> early = Commit(10);
  EXPECT_TRUE(absl::IsFailedPrecondition(early.status())) << early.status();
  EXPECT_NE(early.status().message().find("1 of 2"), std::string::npos) << early.status();
  EXPECT_TRUE(Listed().empty());
  EXPECT_EQ(*Report(1, 10), true);
  absl::StatusOr<v1::CommitCheckpointResponse> done = Commit(10);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->checkpoint().step(), 10);
  EXPECT_EQ(done->checkpoint().dir(), "ckpt/t/step-10");
  EXPECT_EQ(done->checkpoint().manifest_path(), "ckpt/t/step-10/manifest.txt");
  EXPECT_EQ(done->checkpoint().bytes(), 3000);  // 1000 + 2000
  EXPECT_EQ(done->checkpoint().world(), 2);
  EXPECT_EQ(done->checkpoint().generation(), 1);
  EXPECT_EQ(done->keep_from_step(), 10);
  EXPECT_TRUE(done->pruned().empty());
  EXPECT_EQ(Listed(), (std::vector<int64_t>{10}));
  EXPECT_EQ(Job().progress().last_committed_checkpoint_step(), 10);
}

TEST_F(CheckpointCommitTest, OnlyRank0Commits) {
  StartJob(2, 3);
  ReportAll(10);
  EXPECT_TRUE(absl::IsInvalidArgument(Commit(10, /*rank=*/1).status()));
  EXPECT_TRUE(Listed().empty());
}

TEST_F(CheckpointCommitTest, RetriedCommitIsAnsweredAgainAndRecordedOnce) {
  StartJob(2, 3);
  ReportAll(10);
  absl::StatusOr<v1::CommitCheckpointResponse> first = Commit(10);
  ASSERT_TRUE(first.ok()) << first.status();
  clock_.AdvanceMs(5);
  absl::StatusOr<v1::CommitCheckpointResponse> again = Commit(10);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->checkpoint().committed_ms(), first->checkpoint().committed_ms());
  EXPECT_EQ(again->keep_from_step(), 10);
  EXPECT_EQ(Listed(), (std::vector<int64_t>{10}));
}

TEST_F(CheckpointCommitTest, KeepPrunesTheOldestAndAnswersWhereRank0MayDeleteBelow) {
  StartJob(1, /*keep=*/2);
  std::vector<int64_t> keep_from, pruned;
  for (int64_t step : {10, 20, 30, 40}) {
    ReportAll(step);
    absl::StatusOr<v1::CommitCheckpointResponse> r = Commit(step);
    ASSERT_TRUE(r.ok()) << r.status();
    keep_from.push_back(r->keep_from_step());
    for (const auto& p : r->pruned()) pruned.push_back(p.step());
  }
  EXPECT_EQ(keep_from, (std::vector<int64_t>{10, 10, 20, 30}));
  EXPECT_EQ(pruned, (std::vector<int64_t>{10, 20}));
  EXPECT_EQ(Listed(), (std::vector<int64_t>{40, 30}));
}

TEST_F(CheckpointCommitTest, WaitAnswersTheCompleteSetOrRunsOutNamingHowManyReported) {
  StartJob(2, 3);
  ASSERT_TRUE(Report(1, 10).ok());
  absl::StatusOr<v1::WaitCheckpointShardsResponse> partial =
      core_->WaitCheckpointShards(WaitRequest(10, /*wait_ms=*/20));
  EXPECT_TRUE(absl::IsDeadlineExceeded(partial.status())) << partial.status();
  EXPECT_NE(partial.status().message().find("1 of 2 ranks"), std::string::npos);
  // The last report wakes a waiting rank 0.
  std::thread last([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ASSERT_TRUE(Report(0, 10).ok());
  });
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<v1::WaitCheckpointShardsResponse> all =
      core_->WaitCheckpointShards(WaitRequest(10, /*wait_ms=*/10'000));
  last.join();
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  ASSERT_EQ(all->shards_size(), 2);
  EXPECT_EQ(all->shards(0).rank(), 0);
  EXPECT_EQ(all->shards(1).rank(), 1);
  EXPECT_EQ(all->shards(1).bytes(), 2000);
}

// Rank 1 misses its lease while rank 0 waits for its report: the job goes
// RECOVERING (no healthy spare to re-gang on), which ends the wait, and the
// failed generation can neither report nor commit any more.
TEST_F(CheckpointCommitTest, FailedGenerationEndsTheWaitAndCommitsNothing) {
  StartJob(2, 3);
  ASSERT_TRUE(Report(0, 10).ok());
  const v1::WaitCheckpointShardsRequest wait = WaitRequest(10, 10'000);
  std::thread lease([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    clock_.AdvanceMs(600);
    v1::HeartbeatRequest hb;  // rank 0 beats; rank 1 is silent
    hb.set_worker_id(WorkerOf(0));
    hb.set_job_id(job_);
    hb.set_generation(1);
    ASSERT_TRUE(core_->Heartbeat(Fenced(hb)).ok());
    clock_.AdvanceMs(600);
    core_->Tick();
  });
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<v1::WaitCheckpointShardsResponse> r = core_->WaitCheckpointShards(Fenced(wait));
  lease.join();
  EXPECT_TRUE(absl::IsAborted(r.status())) << r.status();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  ASSERT_EQ(Job().state(), v1::JOB_STATE_RECOVERING);
  EXPECT_EQ(Job().generation(), 1);
  EXPECT_TRUE(absl::IsAborted(Report(1, 10).status()));
  EXPECT_TRUE(absl::IsAborted(Commit(10).status()));
  EXPECT_TRUE(Listed().empty());
}

// Rank 0 wrote the manifest of step 20 and died before committing: step 20
// is not committed, the next generation resumes from step 10, and its re-run
// commits step 20 again. The failed generation's commit, arriving late, is
// refused.
TEST_F(CheckpointCommitTest, Rank0DyingBeforeTheCommitResumesFromThePreviousOne) {
  StartJob(2, 3);
  ReportAll(10);
  ASSERT_TRUE(Commit(10).ok());
  ReportAll(20);
  v1::CommitCheckpointRequest stale;
  stale.set_job_id(job_);
  stale.set_generation(1);
  stale.set_rank(0);
  stale.set_worker_id(WorkerOf(0));
  stale.set_step(20);
  stale.set_dir("ckpt/t/step-20");
  const v1::RunAssignment run = FailRank1AndRecover();
  EXPECT_EQ(run.resume_from(), "ckpt/t/step-10");
  EXPECT_EQ(run.resume_step(), 10);
  EXPECT_TRUE(absl::IsAborted(core_->CommitCheckpoint(Fenced(stale)).status()));
  // Generation 2's reports of step 20 alone complete the set.
  EXPECT_EQ(*Report(0, 20), false);
  EXPECT_EQ(*Report(1, 20), true);
  absl::StatusOr<v1::CommitCheckpointResponse> again = Commit(20);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->checkpoint().generation(), 2);
  EXPECT_EQ(Listed(), (std::vector<int64_t>{20, 10}));
}

// The coordinator restarts between the shard reports and the commit: the
// reports are lost, so that step is not committed; what was committed before
// survives, and the next checkpoint commits normally.
TEST_F(CheckpointCommitTest, RestartLosesUncommittedReportsButKeepsTheRecord) {
  StartJob(2, 3);
  ReportAll(10);
  ASSERT_TRUE(Commit(10).ok());
  ReportAll(20);
  Open();
  absl::StatusOr<v1::CommitCheckpointResponse> lost = Commit(20);
  EXPECT_TRUE(absl::IsFailedPrecondition(lost.status())) << lost.status();
  EXPECT_NE(lost.status().message().find("0 of 2"), std::string::npos) << lost.status();
  EXPECT_TRUE(absl::IsDeadlineExceeded(core_->WaitCheckpointShards(WaitRequest(20, 0)).status()));
  EXPECT_EQ(Listed(), (std::vector<int64_t>{10}));
  EXPECT_EQ(Job().checkpoints(0).dir(), "ckpt/t/step-10");
  ReportAll(30);
  ASSERT_TRUE(Commit(30).ok());
  EXPECT_EQ(Listed(), (std::vector<int64_t>{30, 10}));
}

TEST_F(CheckpointCommitTest, ReportsOfAnotherRankOrGenerationAreRefused) {
  StartJob(2, 3);
  v1::ReportCheckpointRequest r;
  r.set_worker_id(WorkerOf(0));  // rank 1's report from rank 0's worker
  r.mutable_shard()->set_job_id(job_);
  r.mutable_shard()->set_generation(1);
  r.mutable_shard()->set_rank(1);
  r.mutable_shard()->set_step(10);
  EXPECT_TRUE(absl::IsAborted(core_->ReportCheckpoint(Fenced(r)).status()));
  r.set_worker_id(WorkerOf(1));
  r.mutable_shard()->set_generation(7);
  EXPECT_TRUE(absl::IsAborted(core_->ReportCheckpoint(Fenced(r)).status()));
  v1::WaitCheckpointShardsRequest w = WaitRequest(10, 0);
  w.set_generation(7);
  EXPECT_TRUE(absl::IsAborted(core_->WaitCheckpointShards(Fenced(w)).status()));
  EXPECT_EQ(*Report(0, 10), false);  // neither counted
}


// ---------------------------------------------------------------- failures

// A rank that could not write its shard: one warning per step, with the
// rank, the cause and the path, in the job's events, its warnings and its
// history; counted by reason; the step's wait ends with it and its commit
// is refused.
TEST_F(CheckpointCommitTest, FailedStepIsOneWarningCountedAndEndsTheWait) {
  StartJob(2, 3);
  MetricsRegistry registry;
  RegisterCoordinatorMetrics(core_.get(), &registry);
  ASSERT_TRUE(Report(0, 10).ok());
  absl::StatusOr<v1::ReportCheckpointFailureResponse> r = ReportFailure(1, 10);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->abort());
  const std::string warning =
      "checkpoint step 10 not committed: rank 1: No space left on device (/v/ck/step-10)";
  v1::Job job = Job();
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);  // training goes on (warn)
  ASSERT_EQ(job.warnings_size(), 1);
  EXPECT_EQ(job.warnings(0), warning);
  EXPECT_EQ(job.progress().checkpoint_failures_in_a_row(), 1);
  absl::StatusOr<v1::GetHistoryResponse> history = core_->GetHistory(job_);
  ASSERT_TRUE(history.ok() && history->warnings_size() == 1);
  EXPECT_EQ(history->warnings(0).kind(), v1::EVENT_KIND_WARNING);
  EXPECT_EQ(history->warnings(0).message(), warning);

  absl::StatusOr<v1::WaitCheckpointShardsResponse> wait =
      core_->WaitCheckpointShards(WaitRequest(10, 0));
  ASSERT_TRUE(wait.ok()) << wait.status();
  EXPECT_EQ(wait->shards_size(), 1);
  ASSERT_EQ(wait->failures_size(), 1);
  EXPECT_EQ(wait->failures(0).rank(), 1);
  absl::StatusOr<v1::CommitCheckpointResponse> commit = Commit(10);
  EXPECT_TRUE(absl::IsFailedPrecondition(commit.status())) << commit.status();
  EXPECT_TRUE(Listed().empty());

  // Rank 0's report of the same step (its commit could not happen) adds no
  // second warning and no count; an unknown reason counts as "other".
  ASSERT_TRUE(ReportFailure(0, 10, "rank 1 could not write its shard", "other").ok());
  ASSERT_TRUE(ReportFailure(0, 20, "odd", "made-up-reason").ok());
  EXPECT_EQ(Job().warnings_size(), 2);
  EXPECT_EQ(Job().progress().checkpoint_failures_in_a_row(), 2);
  const auto counts = core_->CheckpointFailuresByJob();
  EXPECT_EQ(counts.at(job_), (std::map<std::string, int64_t>{{"no_space", 1}, {"other", 1}}));
  const std::string metrics = registry.Serialize();
  EXPECT_NE(metrics.find("shardtrain_checkpoint_failures_total{job_id=\"" + job_ +
                         "\",reason=\"no_space\"} 1\n"),
            std::string::npos)
      << metrics;
  // The events and the job's warnings survive a restart.
  Open();
  EXPECT_EQ(Job().warnings(0), warning);
  EXPECT_EQ(core_->GetHistory(job_)->warnings_size(), 2);
}

TEST_F(CheckpointCommitTest, CommitResetsTheFailuresInARow) {
  StartJob(1, 3);
  ASSERT_TRUE(ReportFailure(0, 10).ok());
  EXPECT_EQ(Job().progress().checkpoint_failures_in_a_row(), 1);
  ReportAll(20);
  ASSERT_TRUE(Commit(20).ok());
  EXPECT_EQ(Job().progress().checkpoint_failures_in_a_row(), 0);
  EXPECT_EQ(Job().progress().last_committed_checkpoint_step(), 20);
}

// on_failure: warn (the default) fails the job at
// max_consecutive_failures in a row, once: no restart retrains it.
TEST_F(CheckpointCommitTest, WarnFailsTheJobAtMaxConsecutiveFailuresWithoutARestart) {
  StartJob(2, 3, ", max_consecutive_failures: 2");
  absl::StatusOr<v1::ReportCheckpointFailureResponse> first = ReportFailure(1, 10);
  ASSERT_TRUE(first.ok());
  EXPECT_FALSE(first->abort());
  absl::StatusOr<v1::ReportCheckpointFailureResponse> second = ReportFailure(0, 20);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE(second->abort());
  const v1::Job job = Job();
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(job.restarts(), 0);
  EXPECT_EQ(job.failure_reason(),
            "checkpoint step 20 not committed: rank 0: No space left on device (/v/ck/step-20) "
            "(2 checkpoints in a row not committed: checkpoint.max_consecutive_failures 2); no "
            "checkpoint committed");
  // A later report of the ended job is told to stop.
  absl::StatusOr<v1::ReportCheckpointFailureResponse> late = ReportFailure(1, 20);
  ASSERT_TRUE(late.ok());
  EXPECT_TRUE(late->abort());
  // Its count is exported for a while after it ended.
  EXPECT_EQ(core_->CheckpointFailuresByJob().at(job_).at("no_space"), 2);
  clock_.AdvanceMs(Coordinator::kEndedJobMetricsMs + 1);
  EXPECT_TRUE(core_->CheckpointFailuresByJob().empty());
}

TEST_F(CheckpointCommitTest, FailPolicyFailsTheJobAtTheFirstFailureNamingThePath) {
  StartJob(1, 3, ", on_failure: fail");
  ReportAll(10);
  ASSERT_TRUE(Commit(10).ok());
  absl::StatusOr<v1::ReportCheckpointFailureResponse> r =
      ReportFailure(0, 20, "Read-only file system", "read_only");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->abort());
  const v1::Job job = Job();
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(job.failure_reason(),
            "checkpoint step 20 not committed: rank 0: Read-only file system (/v/ck/step-20) "
            "(checkpoint.on_failure: fail); newest committed checkpoint: step 10");
  EXPECT_EQ(Listed(), (std::vector<int64_t>{10}));  // what it can resume from
}

TEST_F(CheckpointCommitTest, FailureReportsOfAnotherRankOrAStaleGenerationAreRefused) {
  StartJob(2, 3);
  v1::ReportCheckpointFailureRequest r;
  r.set_job_id(job_);
  r.set_generation(Job().generation());
  r.set_worker_id(WorkerOf(0));
  r.mutable_failure()->set_rank(1);  // not the caller's
  r.mutable_failure()->set_step(10);
  EXPECT_TRUE(absl::IsAborted(core_->ReportCheckpointFailure(Fenced(r)).status()));
  r.mutable_failure()->set_rank(0);
  r.set_generation(Job().generation() + 1);
  EXPECT_TRUE(absl::IsAborted(core_->ReportCheckpointFailure(Fenced(r)).status()));
  r.set_generation(Job().generation());
  r.mutable_failure()->set_step(0);
  EXPECT_TRUE(absl::IsInvalidArgument(core_->ReportCheckpointFailure(Fenced(r)).status()));
  EXPECT_EQ(Job().warnings_size(), 0);
}

}  // namespace
}  // namespace shardtrain::coordinator
