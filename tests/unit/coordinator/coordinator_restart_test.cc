// The coordinator core restarted over its stored state (SQLite): jobs,
// workers and their ids survive, each stored spec is validated once on load,
// and a stored spec the validator now refuses fails its job.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>

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
