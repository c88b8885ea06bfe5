// The coordinator core restarted over its stored state (SQLite): jobs,
// workers and their ids survive, each stored spec is validated once on load,
// and a stored spec the validator now refuses fails its job.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "coordinator/coordinator.h"
#include "coordinator/spec_validator.h"
#include "tests/unit/coordinator/core_test_spec.h"
#include "tests/unit/coordinator/fenced.h"

namespace shardtrain::coordinator {
namespace {

TEST(CoordinatorRestartTest, SqliteStateSurvivesAndWorkersRejoinWithTheirIds) {
  char tmpl[] = "/tmp/st-coord-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  FakeClock clock;
  CoordinatorOptions o = TestOptions();
  o.lease_ms = 1000;
  std::string w0, job_id;
  {
    auto core = *Coordinator::Create(o, *OpenSqliteStateStore(dir), ValidateSpec, &clock);
    v1::RegisterWorkerRequest r;
    r.set_collective_address("127.0.0.1");
    r.add_devices()->set_kind("cpu");
    w0 = core->RegisterWorker(Fenced(r))->worker_id();
    v1::SubmitJobRequest s;
    s.set_spec_yaml(CoreTestSpec(1));
    job_id = core->SubmitJob(s)->job_id();
    s.set_spec_yaml(CoreTestSpec(2));
    core->SubmitJob(s).IgnoreError();  // stays PENDING: one worker only
  }                                    // "crash": nothing else is flushed
  auto core = *Coordinator::Create(o, *OpenSqliteStateStore(dir), ValidateSpec, &clock);
  auto jobs = *core->ListJobs({});
  ASSERT_EQ(jobs.jobs_size(), 2);
  EXPECT_EQ(jobs.jobs(0).job_id(), job_id);
  EXPECT_EQ(jobs.jobs(0).state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(jobs.jobs(1).state(), v1::JOB_STATE_PENDING);
  // The known worker heartbeats straight away and gets its assignment back.
  v1::HeartbeatRequest hb;
  hb.set_worker_id(w0);
  auto resp = core->Heartbeat(Fenced(hb));
  ASSERT_TRUE(resp.ok()) << resp.status();
  ASSERT_EQ(resp->commands_size(), 1);
  EXPECT_EQ(resp->commands(0).run().job_id(), job_id);
  // New ids continue after the stored ones.
  v1::RegisterWorkerRequest r;
  r.set_collective_address("127.0.0.1");
  r.add_devices()->set_kind("cpu");
  EXPECT_EQ(core->RegisterWorker(Fenced(r))->worker_id(), "w-0002");
  v1::SubmitJobRequest s;
  s.set_spec_yaml(CoreTestSpec(1));
  EXPECT_EQ(core->SubmitJob(s)->job_id(), "j-000003");
  std::filesystem::remove_all(dir);
}

// A store holding three jobs, written by a coordinator that accepted their
// specs: one SCHEDULED on the one worker, one PENDING (world 2), one
// CANCELLED.
struct StoredJobs {
  std::string dir, worker, scheduled, pending, cancelled;
};
StoredJobs StoreThreeJobs(const Clock* clock) {
  char tmpl[] = "/tmp/st-coord-XXXXXX";
  EXPECT_NE(mkdtemp(tmpl), nullptr);
  StoredJobs out;
  out.dir = tmpl;
  auto core =
      *Coordinator::Create(TestOptions(), *OpenSqliteStateStore(out.dir), ValidateSpec, clock);
  v1::RegisterWorkerRequest r;
  r.set_collective_address("127.0.0.1");
  r.add_devices()->set_kind("cpu");
  out.worker = core->RegisterWorker(Fenced(r))->worker_id();
  v1::SubmitJobRequest s;
  s.set_spec_yaml(CoreTestSpec(1));
  out.scheduled = core->SubmitJob(s)->job_id();
  s.set_spec_yaml(CoreTestSpec(2));
  out.pending = core->SubmitJob(s)->job_id();
  s.set_spec_yaml(CoreTestSpec(1));
  out.cancelled = core->SubmitJob(s)->job_id();
  EXPECT_TRUE(core->CancelJob(out.cancelled, "").ok());
  EXPECT_EQ(core->GetJob(out.scheduled)->state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(core->GetJob(out.pending)->state(), v1::JOB_STATE_PENDING);
  return out;
}

TEST(CoordinatorRestartTest, LoadValidatesEachStoredSpecOnce) {
  FakeClock clock;
  const StoredJobs stored = StoreThreeJobs(&clock);
  int validations = 0;
  auto counting = [&](const std::string& yaml, const std::vector<std::string>& overrides) {
    ++validations;
    return ValidateSpec(yaml, overrides);
  };
  auto core =
      Coordinator::Create(TestOptions(), *OpenSqliteStateStore(stored.dir), counting, &clock);
  ASSERT_TRUE(core.ok()) << core.status();
  EXPECT_EQ(validations, 3);
  EXPECT_EQ((*core)->GetJob(stored.scheduled)->state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ((*core)->GetJob(stored.pending)->state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ((*core)->GetJob(stored.cancelled)->state(), v1::JOB_STATE_CANCELLED);
  // Handing the worker its job back parses nothing more.
  v1::HeartbeatRequest hb;
  hb.set_worker_id(stored.worker);
  auto resp = (*core)->Heartbeat(Fenced(hb));
  ASSERT_TRUE(resp.ok()) << resp.status();
  ASSERT_EQ(resp->commands_size(), 1);
  EXPECT_EQ(resp->commands(0).run().job_id(), stored.scheduled);
  EXPECT_EQ(validations, 3);
  core->reset();
  std::filesystem::remove_all(stored.dir);
}

TEST(CoordinatorRestartTest, StoredSpecTheValidatorNowRefusesFailsItsJob) {
  FakeClock clock;
  const StoredJobs stored = StoreThreeJobs(&clock);
  const std::string refusal = "model.attention: unknown key";
  auto refusing = [&](const std::string&,
                      const std::vector<std::string>&) -> absl::StatusOr<JobSpec> {
    return absl::InvalidArgumentError(refusal);
  };
  {
    auto core =
        Coordinator::Create(TestOptions(), *OpenSqliteStateStore(stored.dir), refusing, &clock);
    ASSERT_TRUE(core.ok()) << core.status();
    for (const std::string& id : {stored.scheduled, stored.pending}) {
      v1::Job job = *(*core)->GetJob(id);
      EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED) << id;
      EXPECT_NE(job.failure_reason().find(refusal), std::string::npos) << job.failure_reason();
      bool ended = false;
      auto events = (*core)->WaitEvents(id, 0, 0, &ended);
      ASSERT_TRUE(events.ok());
      EXPECT_TRUE(ended);
      EXPECT_NE(events->back().message().find(refusal), std::string::npos);
    }
    EXPECT_EQ((*core)->GetJob(stored.cancelled)->state(), v1::JOB_STATE_CANCELLED);
    // The worker is free: told to abort the failed job, given nothing to run.
    v1::HeartbeatRequest hb;
    hb.set_worker_id(stored.worker);
    hb.set_job_id(stored.scheduled);
    hb.set_generation(1);
    auto resp = (*core)->Heartbeat(Fenced(hb));
    ASSERT_TRUE(resp.ok()) << resp.status();
    ASSERT_EQ(resp->commands_size(), 1);
    EXPECT_TRUE(resp->commands(0).has_abort());
  }
  // The failures are durable.
  auto core =
      Coordinator::Create(TestOptions(), *OpenSqliteStateStore(stored.dir), ValidateSpec, &clock);
  ASSERT_TRUE(core.ok()) << core.status();
  EXPECT_EQ((*core)->GetJob(stored.scheduled)->state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ((*core)->GetJob(stored.pending)->state(), v1::JOB_STATE_FAILED);
  core->reset();
  std::filesystem::remove_all(stored.dir);
}

}  // namespace
}  // namespace shardtrain::coordinator

namespace shardtrain::coordinator {
namespace {

// What a rank needs to lose nothing to a restart (worker/report_outbox.h):
// the coordinator's instance id, the oldest step not every rank reported
// (the reports of it and later are held in memory only), and re-sent
// reports it already recorded taken once.
class RestartReportsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/st-coord-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    o_ = TestOptions();
    Start();
    for (int i = 0; i < 2; ++i) {
      v1::RegisterWorkerRequest r;
      r.set_collective_address("127.0.0.1");
      r.add_devices()->set_kind("cpu");
      core_->RegisterWorker(Fenced(r)).IgnoreError();
    }
    v1::SubmitJobRequest s;
    s.set_spec_yaml(CoreTestSpec(2, /*steps=*/5));
    job_ = core_->SubmitJob(s)->job_id();
    const v1::Job job = *core_->GetJob(job_);
    ASSERT_EQ(job.ranks_size(), 2);
    for (const auto& r : job.ranks()) workers_.push_back(r.worker_id());
  }
  void TearDown() override {
    core_.reset();
    std::filesystem::remove_all(dir_);
  }
  void Start() {
    core_.reset();  // the "crash": only what is stored remains
    core_ = *Coordinator::Create(o_, *OpenSqliteStateStore(dir_), ValidateSpec, &clock_);
  }
  absl::StatusOr<v1::ReportStepResponse> Report(int rank, int64_t step) {
    v1::ReportStepRequest r;
    r.set_worker_id(workers_[rank]);
    v1::StepReport* s = r.mutable_report();
    s->set_job_id(job_);
    s->set_generation(1);
    s->set_rank(rank);
    s->set_step(step);
    s->set_loss(step + 0.25 * rank);
    return core_->ReportStep(Fenced(r));
  }
  absl::StatusOr<bool> Shard(int rank, int64_t step) {
    v1::ReportCheckpointRequest r;
    r.set_worker_id(workers_[rank]);
    v1::CheckpointShard* s = r.mutable_shard();
    s->set_job_id(job_);
    s->set_generation(1);
    s->set_rank(rank);
    s->set_step(step);
    s->set_path("/tmp/ckpt-t/step-" + std::to_string(step) + "/shard-" + std::to_string(rank));
    return core_->ReportCheckpoint(Fenced(r));
  }
  int StepEvents() {
    bool ended = false;
    auto events = core_->WaitEvents(job_, 0, 0, &ended);
    int n = 0;
    for (const v1::JobEvent& e : *events) n += e.kind() == v1::EVENT_KIND_STEP;
    return n;
  }

  FakeClock clock_;
  CoordinatorOptions o_;
  std::string dir_, job_;
  std::vector<std::string> workers_;
  std::unique_ptr<Coordinator> core_;
};

TEST_F(RestartReportsTest, AnswersSayWhatARankMustKeepAndReSentReportsCountOnce) {
  auto r = Report(0, 1);
  ASSERT_TRUE(r.ok()) << r.status();
  const std::string first = r->coordinator_instance();
  EXPECT_EQ(first.size(), 16u);
  EXPECT_EQ(r->incomplete_from_step(), 1);  // rank 1 has not reported step 1
  ASSERT_TRUE(Report(1, 1).ok());
  r = Report(0, 2);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->incomplete_from_step(), 2);  // step 1 is whole (and stored)
  EXPECT_EQ(r->committed_step(), 0);
  // Both ranks' shards of step 1, committed.
  ASSERT_TRUE(Shard(0, 1).ok());
  ASSERT_TRUE(*Shard(1, 1));
  v1::CommitCheckpointRequest c;
  c.set_job_id(job_);
  c.set_generation(1);
  c.set_worker_id(workers_[0]);
  c.set_rank(0);
  c.set_step(1);
  c.set_dir("/tmp/ckpt-t/step-1");
  ASSERT_TRUE(core_->CommitCheckpoint(Fenced(c)).ok());

  Start();  // rank 0's report of step 2 was acknowledged, held in memory, and is gone
  EXPECT_EQ(core_->GetJob(job_)->progress().step(), 1);  // from the stored history
  r = Report(1, 2);
  ASSERT_TRUE(r.ok());
  EXPECT_NE(r->coordinator_instance(), first);  // rank 1 sees the restart...
  EXPECT_EQ(r->incomplete_from_step(), 2);
  EXPECT_EQ(r->committed_step(), 1);
  // ...and so does rank 0, which re-sends what it kept: step 2, and the
  // shard of step 1 (its answer arrived before the commit's news).
  ASSERT_TRUE(Report(0, 2).ok());
  auto resent = Shard(0, 1);
  ASSERT_TRUE(resent.ok()) << resent.status();
  EXPECT_TRUE(*resent);  // committed already: nothing to hold
  // ...and its commit, re-sent with it, is answered at once, not waited on.
  v1::WaitCheckpointShardsRequest w;
  w.set_job_id(job_);
  w.set_generation(1);
  w.set_worker_id(workers_[0]);
  w.set_rank(0);
  w.set_step(1);
  w.set_wait_ms(60'000);
  auto waited = core_->WaitCheckpointShards(Fenced(w));
  EXPECT_TRUE(absl::IsAlreadyExists(waited.status())) << waited.status();
  // A re-sent step 1 (whole before the restart) is not a second step 1.
  ASSERT_TRUE(Report(0, 1).ok());
  ASSERT_TRUE(Report(1, 1).ok());
  auto history = core_->GetHistory(job_);
  ASSERT_TRUE(history.ok());
  ASSERT_EQ(history->steps_size(), 2);
  EXPECT_EQ(history->steps(0).step(), 1);
  EXPECT_EQ(history->steps(1).step(), 2);
  EXPECT_DOUBLE_EQ(history->steps(1).loss(), 2.125);  // the mean over both ranks
  EXPECT_EQ(StepEvents(), 2);
  r = Report(0, 3);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->incomplete_from_step(), 3);
  EXPECT_EQ(core_->GetJob(job_)->progress().step(), 2);
}

}  // namespace
}  // namespace shardtrain::coordinator

namespace shardtrain::coordinator {
namespace {

// A submit whose answer was lost in a restart (or a failover) is retried
// with its idempotency key on the new process: it gets the job the first
// attempt made, not a second one.
TEST_F(RestartReportsTest, ASubmitRetriedAfterARestartReturnsTheJobItsKeyMade) {
  v1::SubmitJobRequest s;
  s.set_spec_yaml(CoreTestSpec(1));
  s.set_idempotency_key("3f9c0a1be2d54c6f8a7b9c0d1e2f3a4b");
  const std::string first = core_->SubmitJob(s)->job_id();
  Start();
  auto again = core_->SubmitJob(s);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->job_id(), first);
  EXPECT_EQ(core_->ListJobs({})->jobs_size(), 2);  // the fixture's job and this one
  s.set_idempotency_key("another-key-another-job-000000000");
  EXPECT_NE(core_->SubmitJob(s)->job_id(), first);
}

}  // namespace
}  // namespace shardtrain::coordinator
