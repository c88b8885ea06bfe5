// Bug 4 of issue 15: with only the ids ListWorkers and GetJob hand out, a
// client forged step reports, checkpoint commits that pruned the real
// checkpoints, ReportDone, heartbeats under another worker's id and
// registrations taking over a live id. Each forgery is refused here and
// leaves the job as it was; the genuine calls beside them still work.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "common/metrics.h"
#include "coordinator/coordinator.h"
#include "coordinator/service.h"
#include "coordinator/spec_validator.h"
#include "tests/unit/coordinator/fenced.h"

namespace shardtrain::coordinator {
namespace {

std::string Spec() {
  return "name: t\nmodel: {layers: 2, heads: 2, dim: 16, context: 16, vocab: 256}\n"
         "data: {train: data/x.txt}\nbatch: {global: 4, micro: 2, seq_len: 8}\n"
         "parallel: {dp: 2}\nsteps: 100\nmax_restarts: 1\n"
         "checkpoint: {every: 10, dir: ckpt/t, keep: 2}\n";
}

class FencingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto c = Coordinator::Create(TestOptions(), NewMemoryStateStore(), ValidateSpec, &clock_);
    ASSERT_TRUE(c.ok()) << c.status();
    core_ = *std::move(c);
    for (int i = 0; i < 2; ++i) {
      v1::RegisterWorkerRequest r;
      r.set_collective_address("10.0.0." + std::to_string(i + 1));
      r.add_devices()->set_kind("cpu");
      auto resp = core_->RegisterWorker(r);
      ASSERT_TRUE(resp.ok()) << resp.status();
      secrets_[resp->worker_id()] = resp->worker_secret();
    }
    v1::SubmitJobRequest s;
    s.set_spec_yaml(Spec());
    auto job = core_->SubmitJob(s);
    ASSERT_TRUE(job.ok()) << job.status();
    job_ = job->job_id();
    const v1::Job scheduled = Job();
    ASSERT_EQ(scheduled.ranks_size(), 2);
    for (const v1::RankAssignment& a : scheduled.ranks()) {
      v1::HeartbeatRequest hb;
      hb.set_worker_id(a.worker_id());
      hb.set_worker_secret(secrets_[a.worker_id()]);
      auto resp = core_->Heartbeat(hb);
      ASSERT_TRUE(resp.ok()) << resp.status();
      ASSERT_EQ(resp->commands_size(), 1);
      tokens_[a.rank()] = resp->commands(0).run().lease_token();
      hb.set_job_id(job_);
      hb.set_generation(Job().generation());
      ASSERT_TRUE(core_->Heartbeat(hb).ok());
    }
    // Two real checkpoints, committed by the genuine ranks.
    for (int64_t step : {10, 20}) {
      for (int rank = 0; rank < 2; ++rank) {
        ASSERT_TRUE(core_->ReportCheckpoint(Shard(rank, step, tokens_[rank])).ok());
      }
      ASSERT_TRUE(core_->CommitCheckpoint(Commit(step, tokens_[0])).ok());
    }
  }

  v1::Job Job() { return *core_->GetJob(job_); }

  v1::ReportCheckpointRequest Shard(int rank, int64_t step, const std::string& token) {
    v1::ReportCheckpointRequest r;
    r.set_worker_id(Job().ranks(rank).worker_id());
    r.set_lease_token(token);
    v1::CheckpointShard* s = r.mutable_shard();
    s->set_job_id(job_);
    s->set_generation(Job().generation());
    s->set_rank(rank);
    s->set_step(step);
    s->set_bytes(100);
    return r;
  }
  v1::CommitCheckpointRequest Commit(int64_t step, const std::string& token) {
    v1::CommitCheckpointRequest c;
    c.set_job_id(job_);
    c.set_generation(Job().generation());
    c.set_rank(0);
    c.set_worker_id(Job().ranks(0).worker_id());
    c.set_step(step);
    c.set_dir("ckpt/t/step-" + std::to_string(step));
    c.set_manifest_path(c.dir() + "/manifest.txt");
    c.set_lease_token(token);
    return c;
  }
  v1::ReportStepRequest Step(int rank, int64_t step, double loss, const std::string& token) {
    v1::ReportStepRequest r;
    r.set_worker_id(Job().ranks(rank).worker_id());
    r.set_lease_token(token);
    v1::StepReport* s = r.mutable_report();
    s->set_job_id(job_);
    s->set_generation(Job().generation());
    s->set_rank(rank);
    s->set_step(step);
    s->set_loss(loss);
    return r;
  }
  std::vector<int64_t> Committed() {
    std::vector<int64_t> out;
    const v1::ListCheckpointsResponse list = *core_->ListCheckpoints(job_);
    for (const v1::CheckpointInfo& c : list.checkpoints()) {
      out.push_back(c.step());
    }
    return out;
  }

  // What a forger may try as a token: none, and one that is some other
  // generation's or job's (it cannot compute the real one).
  std::vector<std::string> Forgeries() {
    return {"", TestKey().LeaseToken(job_, Job().generation() + 1),
            TestKey().LeaseToken("j-999999", Job().generation()), std::string(32, '0')};
  }

  FakeClock clock_;
  std::unique_ptr<Coordinator> core_;
  std::string job_;
  std::map<std::string, std::string> secrets_;  // worker id -> its registration secret
  std::map<int, std::string> tokens_;           // rank -> lease token
};

TEST_F(FencingTest, ForgedStepReportsAreRefusedAndNothingIsStored) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const std::string& token : Forgeries()) {
    for (int64_t step : {int64_t{1}, int64_t{99999}}) {
      for (int rank = 0; rank < 2; ++rank) {
        auto r = core_->ReportStep(Step(rank, step, nan, token));
        EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied) << r.status();
      }
    }
  }
  EXPECT_EQ(core_->GetHistory(job_)->steps_size(), 0);
  EXPECT_EQ(Job().progress().step(), 0);
  EXPECT_EQ(Job().state(), v1::JOB_STATE_RUNNING);
  // The genuine ranks' reports of step 1 still count.
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(core_->ReportStep(Step(rank, 1, 2.5, tokens_[rank])).ok());
  }
  EXPECT_EQ(Job().progress().step(), 1);
  EXPECT_DOUBLE_EQ(Job().progress().loss(), 2.5);
}

TEST_F(FencingTest, ForgedCheckpointAtAHugeStepPrunesNothing) {
  ASSERT_EQ(Committed(), (std::vector<int64_t>{20, 10}));
  const int64_t huge = 999999999;
  for (const std::string& token : Forgeries()) {
    for (int rank = 0; rank < 2; ++rank) {
      auto r = core_->ReportCheckpoint(Shard(rank, huge, token));
      EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied) << r.status();
    }
    auto c = core_->CommitCheckpoint(Commit(huge, token));
    EXPECT_EQ(c.status().code(), absl::StatusCode::kPermissionDenied) << c.status();
    EXPECT_TRUE(c.status().message().find("lease token") != std::string::npos) << c.status();
    v1::WaitCheckpointShardsRequest w;
    w.set_job_id(job_);
    w.set_generation(Job().generation());
    w.set_worker_id(Job().ranks(0).worker_id());
    w.set_step(20);
    w.set_lease_token(token);
    EXPECT_EQ(core_->WaitCheckpointShards(w).status().code(), absl::StatusCode::kPermissionDenied);
  }
  EXPECT_EQ(Committed(), (std::vector<int64_t>{20, 10}));
  EXPECT_EQ(Job().progress().last_committed_checkpoint_step(), 20);
}

TEST_F(FencingTest, ForgedDoneFailureAndEventChangeNothing) {
  bool ended = false;
  const size_t events = core_->WaitEvents(job_, 0, 0, &ended)->size();
  for (const std::string& token : Forgeries()) {
    for (int rank = 0; rank < 2; ++rank) {
      v1::ReportDoneRequest d;
      d.set_job_id(job_);
      d.set_generation(Job().generation());
      d.set_rank(rank);
      d.set_worker_id(Job().ranks(rank).worker_id());
      d.set_steps(100);
      d.set_lease_token(token);
      EXPECT_EQ(core_->ReportDone(d).code(), absl::StatusCode::kPermissionDenied);
      v1::ReportFailureRequest f;
      f.set_job_id(job_);
      f.set_generation(Job().generation());
      f.set_rank(rank);
      f.set_worker_id(Job().ranks(rank).worker_id());
      f.set_reason("forged");
      f.set_lease_token(token);
      EXPECT_EQ(core_->ReportFailure(f).code(), absl::StatusCode::kPermissionDenied);
      v1::ReportEventRequest e;
      e.set_job_id(job_);
      e.set_generation(Job().generation());
      e.set_rank(rank);
      e.set_worker_id(Job().ranks(rank).worker_id());
      e.set_message("forged");
      e.set_lease_token(token);
      EXPECT_EQ(core_->ReportEvent(e).code(), absl::StatusCode::kPermissionDenied);
    }
  }
  EXPECT_EQ(Job().state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Job().done_ranks_size(), 0);
  EXPECT_EQ(Job().restarts(), 0);
  EXPECT_EQ(core_->WaitEvents(job_, 0, 0, &ended)->size(), events);
}

TEST_F(FencingTest, KvWritesNeedTheLeaseToken) {
  for (const std::string& token : Forgeries()) {
    EXPECT_EQ(core_->CheckLease(job_, Job().generation(), token).code(),
              absl::StatusCode::kPermissionDenied);
  }
  EXPECT_TRUE(core_->CheckLease(job_, Job().generation(), tokens_[0]).ok());
  // A stale generation is ABORTED, an unknown job NOT_FOUND, as before.
  EXPECT_EQ(core_->CheckLease(job_, Job().generation() - 1, tokens_[0]).code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(core_->CheckLease("j-999999", 1, tokens_[0]).code(), absl::StatusCode::kNotFound);
}

TEST_F(FencingTest, HeartbeatUnderAnotherWorkersIdIsRefusedAndLeaksNothing) {
  const std::string victim = Job().ranks(1).worker_id();
  const std::string attacker = Job().ranks(0).worker_id();
  const int64_t last = core_->ListWorkers().workers(1).last_heartbeat_ms();
  clock_.AdvanceMs(100);
  for (const std::string& secret : {std::string(), secrets_[attacker]}) {
    v1::HeartbeatRequest hb;
    hb.set_worker_id(victim);
    hb.set_worker_secret(secret);
    auto resp = core_->Heartbeat(hb);
    EXPECT_EQ(resp.status().code(), absl::StatusCode::kPermissionDenied) << resp.status();
  }
  // The lease was not renewed by the forgery.
  EXPECT_EQ(core_->ListWorkers().workers(1).worker_id(), victim);
  EXPECT_EQ(core_->ListWorkers().workers(1).last_heartbeat_ms(), last);
}

TEST_F(FencingTest, RegisteringUnderALiveWorkersIdIsNoTakeover) {
  const std::string victim = Job().ranks(1).worker_id();
  for (const std::string& secret : {std::string(), secrets_[Job().ranks(0).worker_id()]}) {
    v1::RegisterWorkerRequest r;
    r.set_collective_address("6.6.6.6");
    r.add_devices()->set_kind("cpu");
    r.set_previous_worker_id(victim);
    r.set_worker_secret(secret);
    auto resp = core_->RegisterWorker(r);
    EXPECT_EQ(resp.status().code(), absl::StatusCode::kPermissionDenied) << resp.status();
  }
  EXPECT_EQ(core_->ListWorkers().workers_size(), 2);
  EXPECT_EQ(core_->ListWorkers().workers(1).collective_address(), "10.0.0.2");
  EXPECT_EQ(Job().ranks(1).collective_address(), "10.0.0.2");
  // The worker itself re-registers under its id with its secret.
  v1::RegisterWorkerRequest r;
  r.set_collective_address("10.0.0.2");
  r.add_devices()->set_kind("cpu");
  r.set_previous_worker_id(victim);
  r.set_worker_secret(secrets_[victim]);
  auto resp = core_->RegisterWorker(r);
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(resp->worker_id(), victim);
}

TEST_F(FencingTest, SecretsAreNeverInListGetOrWatchAnswers) {
  std::string shown = core_->GetJob(job_)->SerializeAsString() +
                      core_->ListJobs({})->SerializeAsString() +
                      core_->ListWorkers().SerializeAsString();
  bool ended = false;
  const std::vector<v1::JobEvent> events = *core_->WaitEvents(job_, 0, 0, &ended);
  for (const v1::JobEvent& e : events) {
    shown += e.SerializeAsString();
  }
  ASSERT_FALSE(tokens_[0].empty());
  for (const auto& [rank, token] : tokens_) EXPECT_EQ(shown.find(token), std::string::npos);
  for (const auto& [id, secret] : secrets_) EXPECT_EQ(shown.find(secret), std::string::npos);
}

TEST_F(FencingTest, NonFiniteLossIsNeverExported) {
  MetricsRegistry registry;
  RegisterCoordinatorMetrics(core_.get(), &registry);
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(
        core_->ReportStep(Step(rank, 1, std::numeric_limits<double>::infinity(), tokens_[rank]))
            .ok());
  }
  ASSERT_TRUE(std::isinf(Job().progress().loss()));
  std::string text = registry.Serialize();
  EXPECT_EQ(text.find("shardtrain_coordinator_job_loss{"), std::string::npos) << text;
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(core_->ReportStep(Step(rank, 2, 3.0, tokens_[rank])).ok());
  }
  text = registry.Serialize();
  EXPECT_NE(text.find("shardtrain_coordinator_job_loss{"), std::string::npos) << text;
  EXPECT_EQ(text.find("NaN"), std::string::npos);
  EXPECT_EQ(text.find("Inf"), std::string::npos);
}

}  // namespace
}  // namespace shardtrain::coordinator
