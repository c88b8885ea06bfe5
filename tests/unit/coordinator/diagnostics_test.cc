// GetJobDiagnostics: what the heartbeats of a job's ranks carried (their
// newest flight-recorder records, at most 16 kept) and how long ago each
// worker was heard from.
#include <gtest/gtest.h>

#include "coordinator/coordinator.h"
#include "coordinator/spec_validator.h"
#include "tests/unit/coordinator/fenced.h"

namespace shardtrain::coordinator {
namespace {

class DiagnosticsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorOptions o = TestOptions();
    o.lease_ms = 10'000;
    auto c = Coordinator::Create(o, NewMemoryStateStore(), ValidateSpec, &clock_);
    ASSERT_TRUE(c.ok()) << c.status();
    core_ = *std::move(c);
  }
  std::string Register() {
    v1::RegisterWorkerRequest r;
    r.set_host("h");
    r.set_collective_address("127.0.0.1");
    r.add_devices()->set_kind("cpu");
    auto resp = core_->RegisterWorker(Fenced(r));
    EXPECT_TRUE(resp.ok()) << resp.status();
    return resp.ok() ? resp->worker_id() : "";
  }
  // A heartbeat running (job, generation) whose flight recorder holds
  // seqs first..last.
  void Beat(const std::string& w, const std::string& job, int64_t generation, int first = 0,
            int last = -1) {
    v1::HeartbeatRequest r;
    r.set_worker_id(w);
    r.set_job_id(job);
    r.set_generation(generation);
    for (int seq = first; seq <= last; ++seq) {
      v1::CollectiveRecord* c = r.add_recent_collectives();
      c->set_seq(seq);
      c->set_op("allreduce");
      c->set_group(std::string(seq == last ? 1000 : 5, 'g'));  // a long one is clipped
      c->set_state(seq == last ? "running" : "done");
    }
    ASSERT_TRUE(core_->Heartbeat(Fenced(r)).ok());
  }

  FakeClock clock_;
  std::unique_ptr<Coordinator> core_;
};

TEST_F(DiagnosticsTest, RanksShowTheirWorkersHeartbeatAgeAndNewestRecords) {
  const std::string a = Register(), b = Register();
  v1::SubmitJobRequest s;
  s.set_spec_yaml(
      "name: t\nmodel: {layers: 2, heads: 2, dim: 16, context: 16, vocab: 256}\n"
      "data: {train: data/x.txt}\nbatch: {global: 4, micro: 2, seq_len: 8}\nparallel: {dp: 2}\n"
      "steps: 3\n");
  auto job = core_->SubmitJob(s);
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string id = job->job_id();
  Beat(a, id, 1, 1, 40);  // 40 records: the newest 16 are kept
  Beat(b, id, 1, 1, 3);
  clock_.AdvanceMs(2'500);
  Beat(a, id, 1, 1, 40);
  Beat(b, "j-other", 7, 1, 9);  // another job's records are not this job's

  auto d = core_->GetJobDiagnostics(id);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(d->generation(), 1);
  EXPECT_EQ(d->now_ms(), clock_.NowMs());
  ASSERT_EQ(d->ranks_size(), 2);
  EXPECT_EQ(d->ranks(0).rank(), 0);
  EXPECT_EQ(d->ranks(0).worker_id(), a);
  EXPECT_EQ(d->ranks(0).worker_state(), v1::WORKER_STATE_ALIVE);
  EXPECT_EQ(d->ranks(0).since_heartbeat_ms(), 0);
  ASSERT_EQ(d->ranks(0).recent_collectives_size(), 16);
  EXPECT_EQ(d->ranks(0).recent_collectives(0).seq(), 25);
  EXPECT_EQ(d->ranks(0).recent_collectives(15).seq(), 40);
  EXPECT_EQ(d->ranks(0).recent_collectives(15).state(), "running");
  EXPECT_EQ(d->ranks(0).recent_collectives(15).group().size(), 64u);
  EXPECT_EQ(d->ranks(1).worker_id(), b);
  EXPECT_EQ(d->ranks(1).since_heartbeat_ms(), 0);
  EXPECT_EQ(d->ranks(1).recent_collectives_size(), 0);

  clock_.AdvanceMs(1'200);
  d = core_->GetJobDiagnostics(id);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->ranks(0).since_heartbeat_ms(), 1'200);
  EXPECT_TRUE(absl::IsNotFound(core_->GetJobDiagnostics("j-999999").status()));
}

// A cuda job on a cluster of cpu workers waits (none registered yet when it
// came: the cluster may still be starting), and `why` gets the reason.
TEST_F(DiagnosticsTest, APendingJobSaysWhatItWaitsFor) {
  v1::SubmitJobRequest s;
  s.set_spec_yaml(
      "name: t\nmodel: {layers: 2, heads: 2, dim: 16, context: 16, vocab: 256}\n"
      "data: {train: data/x.txt}\nbatch: {global: 2, micro: 2, seq_len: 8}\nsteps: 3\n"
      "precision: bf16\nresources: {device: cuda}\n");
  auto job = core_->SubmitJob(s);
  ASSERT_TRUE(job.ok()) << job.status();
  Register();  // a cpu worker: it cannot run the job
  auto d = core_->GetJobDiagnostics(job->job_id());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(d->pending_reason(), core_->GetJob(job->job_id())->pending_reason());
  EXPECT_EQ(d->pending_reason(),
            "waiting for 1 cuda (bf16) workers, 0 free; no alive worker can run cuda (bf16)");
}

}  // namespace
}  // namespace shardtrain::coordinator
