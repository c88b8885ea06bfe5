// The coordinator core against a fake clock: membership, gang scheduling,
// heartbeat reconciliation, reports, recovery (restarts from the stored
// state: coordinator_restart_test.cc).
#include "coordinator/coordinator.h"

#include <gtest/gtest.h>

#include "common/metrics.h"
#include "coordinator/service.h"
#include "coordinator/spec_validator.h"
#include "tests/unit/coordinator/core_test_spec.h"
#include "tests/unit/coordinator/fenced.h"

namespace shardtrain::coordinator {
namespace {

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override { Open(NewMemoryStateStore()); }

  // The core validates through ValidateSpec, counting the calls in
  // validations_.
  void Open(std::unique_ptr<StateStore> store) {
    CoordinatorOptions o = TestOptions();
    o.lease_ms = 1000;
    auto counting = [this](const std::string& yaml, const std::vector<std::string>& overrides) {
      ++validations_;
      return ValidateSpec(yaml, overrides);
    };
    auto c = Coordinator::Create(o, std::move(store), counting, &clock_);
    ASSERT_TRUE(c.ok()) << c.status();
    core_ = *std::move(c);
  }

  std::string Register(const std::string& previous = "") {
    v1::RegisterWorkerRequest r;
    r.set_host("h");
    r.set_collective_address("127.0.0.1");
    r.add_devices()->set_kind("cpu");
    r.set_previous_worker_id(previous);
    auto resp = core_->RegisterWorker(Fenced(r));
    EXPECT_TRUE(resp.ok()) << resp.status();
    return resp.ok() ? resp->worker_id() : "";
  }

  v1::Job Submit(int dp, int steps = 3, int max_restarts = 0,
                 const std::vector<std::string>& overrides = {}) {
    v1::SubmitJobRequest r;
    r.set_spec_yaml(CoreTestSpec(dp, steps, max_restarts));
    for (const std::string& o : overrides) r.add_overrides(o);
    auto job = core_->SubmitJob(r);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : v1::Job();
  }

  v1::HeartbeatResponse Beat(const std::string& w, const std::string& job = "", int64_t gen = 0) {
    v1::HeartbeatRequest r;
    r.set_worker_id(w);
    r.set_job_id(job);
    r.set_generation(gen);
    auto resp = core_->Heartbeat(Fenced(r));
    EXPECT_TRUE(resp.ok()) << resp.status();
    return resp.ok() ? *resp : v1::HeartbeatResponse();
  }

  v1::JobState State(const std::string& job) { return core_->GetJob(job)->state(); }

  // The job's history, which must hold exactly one step.
  v1::StepReport OnlyStep(const std::string& job) {
    auto history = core_->GetHistory(job);
    EXPECT_TRUE(history.ok()) << history.status();
    if (!history.ok() || history->steps_size() != 1) {
      ADD_FAILURE() << "want exactly one step in the history";
      return {};
    }
    return history->steps(0);
  }

  // Each worker acknowledges its assignment, as the daemon does.
  void StartAll(const v1::Job& job) {
    const v1::Job current = *core_->GetJob(job.job_id());
    for (const auto& r : current.ranks()) {
      auto resp = Beat(r.worker_id());
      ASSERT_EQ(resp.commands_size(), 1);
      ASSERT_TRUE(resp.commands(0).has_run());
      Beat(r.worker_id(), job.job_id(), resp.commands(0).run().generation());
    }
  }

  // Step `step` from every rank of the job's current generation, each rank
  // with its own values, so the aggregate shows which ranks each field came
  // from: rank r reports loss r+1, tokens/s 100·(r+1), lr 0.001·(r+1),
  // peak RSS 1000·(r+1); grad norm 0.5 except 9 on rank 1; step time 10+r
  // except 70 on rank 2.
  void ReportFromEveryRank(const std::string& job_id, int64_t step) {
    const v1::Job job = *core_->GetJob(job_id);
    for (const v1::RankAssignment& a : job.ranks()) {
      v1::ReportStepRequest r;
      r.set_worker_id(a.worker_id());
      v1::StepReport* s = r.mutable_report();
      s->set_job_id(job_id);
      s->set_generation(job.generation());
      s->set_rank(a.rank());
      s->set_step(step);
      const int k = a.rank() + 1;
      s->set_loss(k);
      s->set_tokens_per_s(100.0 * k);
      s->set_lr(0.001 * k);
      s->set_peak_rss_bytes(1000 * k);
      s->set_grad_norm(a.rank() == 1 ? 9.0 : 0.5);
      s->set_step_ms(a.rank() == 2 ? 70 : 10 + a.rank());
      auto resp = core_->ReportStep(Fenced(r));
      ASSERT_TRUE(resp.ok()) << resp.status();
    }
  }

  // Every rank of the job's current generation reports its shard of `step`
  // (the last one completing the set), then rank 0 commits it as
  // /tmp/ckpt-t/step-<step>; returns the commit's answer.
  v1::CommitCheckpointResponse CheckpointFromEveryRank(const std::string& job_id, int64_t step) {
    const v1::Job job = *core_->GetJob(job_id);
    for (const v1::RankAssignment& a : job.ranks()) {
      v1::ReportCheckpointRequest r;
      r.set_worker_id(a.worker_id());
      r.mutable_shard()->set_job_id(job_id);
      r.mutable_shard()->set_generation(job.generation());
      r.mutable_shard()->set_rank(a.rank());
      r.mutable_shard()->set_step(step);
      auto complete = core_->ReportCheckpoint(Fenced(r));
      EXPECT_TRUE(complete.ok()) << complete.status();
      EXPECT_EQ(complete.value_or(false), a.rank() == job.world() - 1) << "rank " << a.rank();
    }
    v1::CommitCheckpointRequest c;
    c.set_job_id(job_id);
    c.set_generation(job.generation());
    c.set_rank(0);
    c.set_worker_id(job.ranks(0).worker_id());
    c.set_step(step);
    c.set_dir("/tmp/ckpt-t/step-" + std::to_string(step));
    auto committed = core_->CommitCheckpoint(Fenced(c));
    EXPECT_TRUE(committed.ok()) << committed.status();
    return committed.value_or(v1::CommitCheckpointResponse());
  }

  FakeClock clock_;
  int validations_ = 0;  // calls of the injected validator
  std::unique_ptr<Coordinator> core_;
};

TEST_F(CoordinatorTest, BadSpecIsRefusedAndNothingStored) {
  v1::SubmitJobRequest r;
  r.set_spec_yaml(CoreTestSpec(2));
  r.add_overrides("parallel.tp=3");
  auto job = core_->SubmitJob(r);
  ASSERT_TRUE(absl::IsInvalidArgument(job.status()));
  EXPECT_NE(job.status().message().find("parallel.tp"), absl::string_view::npos);
  EXPECT_EQ(core_->ListJobs({})->jobs_size(), 0);
}

TEST_F(CoordinatorTest, GangWaitsForEnoughWorkersThenAssignsDistinctRanks) {
  std::vector<std::string> w;
  for (int i = 0; i < 4; ++i) w.push_back(Register());
  v1::Job job = Submit(5);
  EXPECT_EQ(State(job.job_id()), v1::JOB_STATE_PENDING);
  EXPECT_TRUE(absl::IsFailedPrecondition(core_->GetPlan(job.job_id()).status()));
  w.push_back(Register());
  v1::Job scheduled = *core_->GetJob(job.job_id());
  EXPECT_EQ(scheduled.state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(scheduled.generation(), 1);
  ASSERT_EQ(scheduled.ranks_size(), 5);
  for (int r = 0; r < 5; ++r) EXPECT_EQ(scheduled.ranks(r).worker_id(), w[r]);
  auto plan = core_->GetPlan(job.job_id());
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->world(), 5);
  EXPECT_EQ(plan->ranks(4).worker_id(), w[4]);
}

// A submit to a settled queue considers the new job alone (a pass over
// every waiting job per submit was the control plane's cost at 10,000
// jobs): it must decide what a whole pass would. Backfill places it at once
// and passes the earlier job over; a reservation left by the last pass holds
// it back; a cancel frees the workers and the reserving job starts.
TEST_F(CoordinatorTest, ASubmitToASettledQueueDecidesWhatAWholePassWould) {
  CoordinatorOptions o = TestOptions();
  o.lease_ms = 1000;
  o.reserve_after = 1;
  auto c = Coordinator::Create(o, NewMemoryStateStore(), ValidateSpec, &clock_);
  ASSERT_TRUE(c.ok()) << c.status();
  core_ = *std::move(c);
  const std::string w1 = Register(), w2 = Register();
  const v1::Job running = Submit(1);  // on w1
  ASSERT_EQ(State(running.job_id()), v1::JOB_STATE_SCHEDULED);
  const v1::Job big = Submit(2);  // 1 free: waits
  core_->Tick();
  EXPECT_EQ(State(big.job_id()), v1::JOB_STATE_PENDING);
  EXPECT_NE(core_->GetJob(big.job_id())->pending_reason().find("waiting for 2 cpu workers, 1 free"),
            std::string::npos)
      << core_->GetJob(big.job_id())->pending_reason();
  // Settled; a world-1 job backfills onto w2 without a Tick, and `big` was
  // passed over: the next pass makes it reserve the cpu workers.
  const v1::Job small = Submit(1);
  ASSERT_EQ(State(small.job_id()), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(core_->GetJob(small.job_id())->ranks(0).worker_id(), w2);
  core_->Tick();
  EXPECT_NE(core_->GetJob(big.job_id())->pending_reason().find("reserving the free cpu workers"),
            std::string::npos)
      << core_->GetJob(big.job_id())->pending_reason();
  // Settled again, with the reservation: a new job waits behind it even
  // though it was never in a whole pass.
  const v1::Job late = Submit(1);
  EXPECT_EQ(State(late.job_id()), v1::JOB_STATE_PENDING);
  EXPECT_NE(core_->GetJob(late.job_id())->pending_reason().find("queued behind " + big.job_id()),
            std::string::npos)
      << core_->GetJob(late.job_id())->pending_reason();
  // Both running jobs end: the reserving job takes both workers first.
  ASSERT_TRUE(core_->CancelJob(running.job_id(), "").ok());
  ASSERT_TRUE(core_->CancelJob(small.job_id(), "").ok());
  for (const std::string& w : {w1, w2}) Beat(w);
  core_->Tick();
  EXPECT_EQ(State(big.job_id()), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(State(late.job_id()), v1::JOB_STATE_PENDING);
}

TEST_F(CoordinatorTest, HeartbeatReconcilesRunThenRunningThenAbortOnCancel) {
  std::string a = Register(), b = Register();
  v1::Job job = Submit(2);
  auto resp = Beat(a);
  ASSERT_EQ(resp.commands_size(), 1);
  const v1::RunAssignment& run = resp.commands(0).run();
  EXPECT_EQ(run.job_id(), job.job_id());
  EXPECT_EQ(run.rank(), 0);
  EXPECT_EQ(run.world(), 2);
  EXPECT_FALSE(run.spec_yaml().empty());
  // Acknowledging is idempotent and sends nothing more.
  EXPECT_EQ(Beat(a, job.job_id(), 1).commands_size(), 0);
  EXPECT_EQ(State(job.job_id()), v1::JOB_STATE_SCHEDULED);
  Beat(b, job.job_id(), 1);
  EXPECT_EQ(State(job.job_id()), v1::JOB_STATE_RUNNING);

  ASSERT_TRUE(core_->CancelJob(job.job_id(), "test").ok());
  resp = Beat(a, job.job_id(), 1);
  ASSERT_EQ(resp.commands_size(), 1);
  EXPECT_EQ(resp.commands(0).abort().job_id(), job.job_id());
  EXPECT_TRUE(absl::IsFailedPrecondition(core_->CancelJob(job.job_id(), "").status()));
  // The workers are free again: a new job is scheduled on them.
  v1::Job next = Submit(2);
  EXPECT_EQ(State(next.job_id()), v1::JOB_STATE_SCHEDULED);
}

TEST_F(CoordinatorTest, MissedLeaseMarksDeadAndFailsItsJob) {
  std::string a = Register(), b = Register();
  v1::Job job = Submit(2);
  StartAll(job);
  clock_.AdvanceMs(600);
  Beat(a, job.job_id(), 1);  // a renews, b stays silent
  clock_.AdvanceMs(600);
  core_->Tick();
  auto workers = core_->ListWorkers();
  EXPECT_EQ(workers.workers(0).state(), v1::WORKER_STATE_ALIVE);
  EXPECT_EQ(workers.workers(1).state(), v1::WORKER_STATE_DEAD);
  v1::Job failed = *core_->GetJob(job.job_id());
  EXPECT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(failed.failure_reason().find(b), std::string::npos) << failed.failure_reason();
  // A dead worker must register again and gets a new id.
  v1::HeartbeatRequest hb;
  hb.set_worker_id(b);
  EXPECT_TRUE(absl::IsNotFound(core_->Heartbeat(Fenced(hb)).status()));
  EXPECT_NE(Register(b), b);
  // The survivor is told to abort the failed job.
  auto resp = Beat(a, job.job_id(), 1);
  ASSERT_EQ(resp.commands_size(), 1);
  EXPECT_TRUE(resp.commands(0).has_abort());
}

TEST_F(CoordinatorTest, StepsAggregateOverRanksAndDoneSucceeds) {
  std::string a = Register(), b = Register();
  v1::Job job = Submit(2, /*steps=*/2);
  StartAll(job);
  for (int step = 1; step <= 2; ++step) {
    for (int rank = 0; rank < 2; ++rank) {
      v1::ReportStepRequest r;
      r.set_worker_id(rank == 0 ? a : b);
      auto* s = r.mutable_report();
      s->set_job_id(job.job_id());
      s->set_generation(1);
      s->set_rank(rank);
      s->set_step(step);
      s->set_loss(rank == 0 ? 4.0 : 6.0);
      s->set_tokens_per_s(100);
      s->set_step_ms(rank == 0 ? 10 : 20);
      ASSERT_TRUE(core_->ReportStep(Fenced(r)).ok());
    }
  }
  auto history = core_->GetHistory(job.job_id());
  ASSERT_EQ(history->steps_size(), 2);
  EXPECT_DOUBLE_EQ(history->steps(0).loss(), 5.0);
  EXPECT_DOUBLE_EQ(history->steps(0).tokens_per_s(), 200);
  EXPECT_DOUBLE_EQ(history->steps(0).step_ms(), 20);

  v1::ReportStepRequest stale;
  stale.set_worker_id(a);
  stale.mutable_report()->set_job_id(job.job_id());
  stale.mutable_report()->set_generation(7);
  stale.mutable_report()->set_step(1);
  EXPECT_TRUE(absl::IsAborted(core_->ReportStep(Fenced(stale)).status()));

  for (int rank = 0; rank < 2; ++rank) {
    v1::ReportDoneRequest d;
    d.set_job_id(job.job_id());
    d.set_generation(1);
    d.set_rank(rank);
    d.set_worker_id(rank == 0 ? a : b);
    d.set_steps(2);
    ASSERT_TRUE(core_->ReportDone(Fenced(d)).ok());
    EXPECT_EQ(State(job.job_id()), rank == 0 ? v1::JOB_STATE_RUNNING : v1::JOB_STATE_SUCCEEDED);
  }
  bool ended = false;
  auto events = core_->WaitEvents(job.job_id(), 0, 0, &ended);
  ASSERT_TRUE(events.ok());
  EXPECT_TRUE(ended);
  EXPECT_EQ(events->back().state(), v1::JOB_STATE_SUCCEEDED);
  for (size_t i = 0; i < events->size(); ++i) EXPECT_EQ((*events)[i].seq(), int64_t(i + 1));
}

TEST_F(CoordinatorTest, StepOfATpPpJobAggregatesOverTheRanksThatSpeakForAReplica) {
  for (int i = 0; i < 8; ++i) Register();
  // dp 2 × tp 2 × pp 2: rank = (pp·2 + dp)·2 + tp, so the replicas' last
  // stage, tp 0, is ranks 4 (dp 0) and 6 (dp 1).
  v1::Job job = Submit(2, /*steps=*/3, /*max_restarts=*/0, {"parallel.tp=2", "parallel.pp=2"});
  ASSERT_EQ(job.world(), 8);
  auto plan = core_->GetPlan(job.job_id());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->dp(), 2);
  EXPECT_EQ(plan->tp(), 2);
  EXPECT_EQ(plan->pp(), 2);
  StartAll(job);
  ReportFromEveryRank(job.job_id(), 1);
  const v1::StepReport agg = OnlyStep(job.job_id());
  EXPECT_DOUBLE_EQ(agg.loss(), (5.0 + 7.0) / 2);      // ranks 4 and 6 only
  EXPECT_DOUBLE_EQ(agg.tokens_per_s(), 500.0 + 700);  // each replica's tokens once
  EXPECT_DOUBLE_EQ(agg.grad_norm(), 9.0);             // the max over all ranks
  EXPECT_DOUBLE_EQ(agg.lr(), 0.001);                  // rank 0's
  EXPECT_DOUBLE_EQ(agg.step_ms(), 70);                // the slowest rank
  EXPECT_EQ(agg.peak_rss_bytes(), 8000);              // the largest
  EXPECT_EQ(agg.step(), 1);
  EXPECT_DOUBLE_EQ(core_->GetJob(job.job_id())->progress().loss(), 6.0);
}

TEST_F(CoordinatorTest, StepOfADpOnlyJobAggregatesOverEveryRank) {
  for (int i = 0; i < 4; ++i) Register();
  v1::Job job = Submit(4);
  StartAll(job);
  ReportFromEveryRank(job.job_id(), 1);
  const v1::StepReport agg = OnlyStep(job.job_id());
  EXPECT_DOUBLE_EQ(agg.loss(), (1.0 + 2 + 3 + 4) / 4);  // every rank is a replica
  EXPECT_DOUBLE_EQ(agg.tokens_per_s(), 100.0 + 200 + 300 + 400);
  EXPECT_DOUBLE_EQ(agg.grad_norm(), 9.0);
  EXPECT_DOUBLE_EQ(agg.lr(), 0.001);
  EXPECT_DOUBLE_EQ(agg.step_ms(), 70);
  EXPECT_EQ(agg.peak_rss_bytes(), 4000);
}

// fp16: a step every rank skipped (gradients overflowed) is kept in the
// history with its loss scale, says so in its event, and counts in
// shardtrain_coordinator_skipped_steps_total; clean steps do not.
TEST_F(CoordinatorTest, SkippedStepIsInTheHistoryItsEventAndTheCounter) {
  MetricsRegistry registry;
  RegisterCoordinatorMetrics(core_.get(), &registry);
  std::string a = Register(), b = Register();
  v1::Job job = Submit(2, /*steps=*/3);
  StartAll(job);
  const std::string series =
      "shardtrain_coordinator_skipped_steps_total{job_id=\"" + job.job_id() + "\"} ";
  EXPECT_NE(registry.Serialize().find(series + "0\n"), std::string::npos) << registry.Serialize();
  // Steps 1 and 2 overflow (65536, then 32768); step 3 runs clean at 16384.
  const double scales[] = {65536, 32768, 16384};
  for (int step = 1; step <= 3; ++step) {
    for (int rank = 0; rank < 2; ++rank) {
      v1::ReportStepRequest r;
      r.set_worker_id(rank == 0 ? a : b);
      auto* s = r.mutable_report();
      s->set_job_id(job.job_id());
      s->set_generation(1);
      s->set_rank(rank);
      s->set_step(step);
      s->set_loss(3.5);
      s->set_loss_scale(scales[step - 1]);
      s->set_skipped(step < 3);
      ASSERT_TRUE(core_->ReportStep(Fenced(r)).ok());
    }
    if (step == 1) {
      EXPECT_NE(registry.Serialize().find(series + "1\n"), std::string::npos)
          << registry.Serialize();
    }
  }
  auto history = core_->GetHistory(job.job_id());
  ASSERT_TRUE(history.ok()) << history.status();
  ASSERT_EQ(history->steps_size(), 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(history->steps(i).skipped(), i < 2) << "step " << i + 1;
    EXPECT_DOUBLE_EQ(history->steps(i).loss_scale(), scales[i]) << "step " << i + 1;
  }
  bool ended = false;
  auto events = core_->WaitEvents(job.job_id(), 0, 0, &ended);
  ASSERT_TRUE(events.ok());
  std::vector<std::string> steps;
  for (const v1::JobEvent& e : *events) {
    if (e.kind() == v1::EVENT_KIND_STEP) steps.push_back(e.message());
  }
  EXPECT_EQ(steps, (std::vector<std::string>{
                       "step 1/3 loss 3.5000; skipped (fp16 overflow at loss scale 65536)",
                       "step 2/3 loss 3.5000; skipped (fp16 overflow at loss scale 32768)",
                       "step 3/3 loss 3.5000"}));
  EXPECT_NE(registry.Serialize().find(series + "2\n"), std::string::npos) << registry.Serialize();
  // The job ends: its series goes.
  ASSERT_TRUE(core_->CancelJob(job.job_id(), "").ok());
  EXPECT_EQ(registry.Serialize().find(series), std::string::npos) << registry.Serialize();
}

TEST_F(CoordinatorTest, SpecIsValidatedOnceAtSubmitAndOnceMorePerElasticShrink) {
  std::string a = Register(), b = Register();
  v1::Job job = Submit(2, /*steps=*/10, /*max_restarts=*/2, {"resources.min_workers=1"});
  EXPECT_EQ(validations_, 1);  // submitting
  EXPECT_EQ(State(job.job_id()), v1::JOB_STATE_SCHEDULED);
  StartAll(job);
  ReportFromEveryRank(job.job_id(), 1);
  EXPECT_EQ(CheckpointFromEveryRank(job.job_id(), 1).checkpoint().world(), 2);
  EXPECT_EQ(validations_, 1);  // scheduling, a step, a commit: none

  // b dies while a is not healthy (silent for over half a lease): the job
  // waits, then re-gangs at full size when c joins.
  clock_.AdvanceMs(600);
  Beat(a, job.job_id(), 1);
  clock_.AdvanceMs(600);
  core_->Tick();
  EXPECT_EQ(State(job.job_id()), v1::JOB_STATE_RECOVERING);
  Beat(a, job.job_id(), 1);
  Register();
  v1::Job again = *core_->GetJob(job.job_id());
  EXPECT_EQ(again.state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(again.world(), 2);
  EXPECT_EQ(validations_, 1);  // a failure and a recovery at the same size: none

  // c dies and only a is left: an elastic shrink to one worker.
  StartAll(again);
  clock_.AdvanceMs(600);
  Beat(a, job.job_id(), 2);
  clock_.AdvanceMs(600);
  core_->Tick();
  EXPECT_EQ(State(job.job_id()), v1::JOB_STATE_RECOVERING);
  Beat(a, job.job_id(), 2);
  core_->Tick();
  v1::Job shrunk = *core_->GetJob(job.job_id());
  EXPECT_EQ(shrunk.state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(shrunk.world(), 1);
  EXPECT_EQ(validations_, 2);  // the shrink, once
  auto stored = ValidateSpec(shrunk.spec_yaml(), {});
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->parallel.dp, 1);
  EXPECT_EQ(stored->batch.global, 4);  // the same global batch
  EXPECT_EQ(core_->GetPlan(job.job_id())->world(), 1);

  // The shrunk job commits with its one rank, validating nothing more.
  StartAll(shrunk);
  EXPECT_EQ(CheckpointFromEveryRank(job.job_id(), 2).checkpoint().world(), 1);
  EXPECT_EQ(validations_, 2);
}

TEST_F(CoordinatorTest, FailureReportFailsTheJobWithRankAndReason) {
  std::string a = Register();
  v1::Job job = Submit(1);
  StartAll(job);
  v1::ReportFailureRequest f;
  f.set_job_id(job.job_id());
  f.set_generation(1);
  f.set_rank(0);
  f.set_worker_id(a);
  f.set_reason("data: file missing.txt not found");
  f.set_step(3);
  ASSERT_TRUE(core_->ReportFailure(Fenced(f)).ok());
  v1::Job failed = *core_->GetJob(job.job_id());
  EXPECT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(failed.failure_reason().find("rank 0"), std::string::npos);
  EXPECT_NE(failed.failure_reason().find("missing.txt"), std::string::npos);
}

TEST_F(CoordinatorTest, FailedRankRecoversFromTheLastCommittedCheckpoint) {
  std::string a = Register(), b = Register();
  v1::Job job = Submit(2, /*steps=*/10, /*max_restarts=*/1);
  StartAll(job);
  CheckpointFromEveryRank(job.job_id(), 4);
  EXPECT_EQ(core_->ListCheckpoints(job.job_id())->checkpoints(0).step(), 4);

  // b dies: RECOVERING, and with no spare worker it waits.
  clock_.AdvanceMs(600);
  Beat(a, job.job_id(), 1);
  clock_.AdvanceMs(600);
  core_->Tick();
  v1::Job recovering = *core_->GetJob(job.job_id());
  EXPECT_EQ(recovering.state(), v1::JOB_STATE_RECOVERING);
  EXPECT_EQ(recovering.restarts(), 1);
  // The survivor is told to abort generation 1 (and is healthy: it beat just
  // now); a new worker re-forms the gang as generation 2, resuming from step 4.
  auto abort = Beat(a, job.job_id(), 1);
  ASSERT_EQ(abort.commands_size(), 1);
  EXPECT_TRUE(abort.commands(0).has_abort());
  std::string c = Register();
  v1::Job again = *core_->GetJob(job.job_id());
  EXPECT_EQ(again.state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(again.generation(), 2);
  auto resp = Beat(c);
  ASSERT_EQ(resp.commands_size(), 1);
  EXPECT_EQ(resp.commands(0).run().resume_from(), "/tmp/ckpt-t/step-4");
  EXPECT_EQ(resp.commands(0).run().resume_step(), 4);
  // A stale report of generation 1 is refused; the old survivor is told to abort.
  v1::ReportStepRequest stale;
  stale.set_worker_id(a);
  stale.mutable_report()->set_job_id(job.job_id());
  stale.mutable_report()->set_generation(1);
  stale.mutable_report()->set_step(5);
  EXPECT_FALSE(core_->ReportStep(Fenced(stale)).ok());
  // No restarts left: the next failure fails the job.
  StartAll(again);
  clock_.AdvanceMs(1200);
  core_->Tick();
  EXPECT_EQ(State(job.job_id()), v1::JOB_STATE_FAILED);
  EXPECT_NE(core_->GetJob(job.job_id())->failure_reason().find("no restarts left"),
            std::string::npos);
}

}  // namespace
}  // namespace shardtrain::coordinator
