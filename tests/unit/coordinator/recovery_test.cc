// Recovery rules of the coordinator core (issue #15), against a fake clock:
// a failed generation's workers wait for a heartbeat before they are ganged
// again, an elastic job does not shrink while a former rank may come back,
// permanent failures are not retried, and spec paths escaping with ".." are
// refused at submit.
#include <gtest/gtest.h>

#include <algorithm>

#include "coordinator/coordinator.h"
#include "coordinator/spec_validator.h"
#include "tests/unit/coordinator/fenced.h"

namespace shardtrain::coordinator {
namespace {

std::string Spec(int dp) {
  return "name: t\nmodel: {layers: 2, heads: 2, dim: 16, context: 16, vocab: 256}\n"
         "data: {train: data/x.txt}\nbatch: {global: " +
         std::to_string(2 * dp) + ", micro: 2, seq_len: 8}\nparallel: {dp: " + std::to_string(dp) +
         "}\nsteps: 10\nmax_restarts: 3\ncheckpoint: {every: 1, dir: ckpt/t}\n";
}

class RecoveryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorOptions o = TestOptions();
    o.lease_ms = 1000;
    auto c = Coordinator::Create(o, NewMemoryStateStore(), ValidateSpec, &clock_);
    ASSERT_TRUE(c.ok()) << c.status();
    core_ = *std::move(c);
  }
  std::string Register() {
    v1::RegisterWorkerRequest r;
    r.set_host("h");
    r.set_collective_address("127.0.0.1");
    r.add_devices()->set_kind("cpu");
    auto resp = core_->RegisterWorker(r);
    EXPECT_TRUE(resp.ok()) << resp.status();
    return resp.ok() ? resp->worker_id() : "";
  }
  absl::StatusOr<v1::Job> Submit(int dp, const std::vector<std::string>& overrides = {},
                                 const std::string& resume_from = "") {
    v1::SubmitJobRequest r;
    r.set_spec_yaml(Spec(dp));
    for (const std::string& o : overrides) r.add_overrides(o);
    r.set_resume_from(resume_from);
    return core_->SubmitJob(r);
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
  v1::Job Job(const std::string& id) { return *core_->GetJob(id); }
  // Every rank acknowledges its assignment: the gang runs.
  void StartAll(const std::string& id) {
    const v1::Job job = Job(id);
    for (const auto& r : job.ranks()) {
      auto resp = Beat(r.worker_id());
      ASSERT_EQ(resp.commands_size(), 1);
      Beat(r.worker_id(), id, resp.commands(0).run().generation());
    }
    ASSERT_EQ(Job(id).state(), v1::JOB_STATE_RUNNING);
  }
  absl::Status Fail(const std::string& id, int rank, bool permanent) {
    const v1::Job job = Job(id);
    v1::ReportFailureRequest f;
    f.set_job_id(id);
    f.set_generation(job.generation());
    f.set_rank(rank);
    f.set_worker_id(job.ranks(rank).worker_id());
    f.set_reason("NOT_FOUND: data path data/x.txt does not exist");
    f.set_permanent(permanent);
    return core_->ReportFailure(Fenced(f));
  }
  std::vector<std::string> Workers(const std::string& id) {
    std::vector<std::string> out;
    const v1::Job job = Job(id);
    for (const auto& r : job.ranks()) out.push_back(r.worker_id());
    return out;
  }

  FakeClock clock_;
  std::unique_ptr<Coordinator> core_;
};

// Rank 1's worker died; rank 0 reports the lost peer. With a spare attached,
// generation 2 takes rank 0's worker (once it heartbeats) and the spare,
// never the dead worker, although its lease has not run out.
TEST_F(RecoveryTest, FailedGenerationsWorkersAreGangedOnlyAfterTheirNextHeartbeat) {
  const std::string w1 = Register(), w2 = Register();
  auto job = Submit(2);
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string id = job->job_id();
  StartAll(id);
  ASSERT_EQ(Workers(id), (std::vector<std::string>{w1, w2}));
  const std::string spare = Register();
  ASSERT_TRUE(Fail(id, 0, /*permanent=*/false).ok());
  core_->Tick();
  EXPECT_EQ(Job(id).state(), v1::JOB_STATE_RECOVERING) << "only the spare has heartbeaten";
  const v1::HeartbeatResponse abort = Beat(w1, id, 1);  // its rank still runs generation 1
  ASSERT_EQ(abort.commands_size(), 1);
  EXPECT_TRUE(abort.commands(0).has_abort());
  core_->Tick();
  EXPECT_EQ(Job(id).state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(Job(id).generation(), 2);
  EXPECT_EQ(Workers(id), (std::vector<std::string>{w1, spare}));
  EXPECT_EQ(Job(id).restarts(), 1);
}

// An elastic job (min_workers 1) does not shrink onto the live worker while
// the other may still heartbeat; once its lease runs out it does.
TEST_F(RecoveryTest, ElasticJobWaitsForFormerRanksUntilTheirLeaseRunsOut) {
  const std::string w1 = Register(), w2 = Register();
  auto job = Submit(2, {"resources.min_workers=1"});
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string id = job->job_id();
  StartAll(id);
  ASSERT_TRUE(Fail(id, 0, /*permanent=*/false).ok());
  Beat(w1);
  core_->Tick();
  EXPECT_EQ(Job(id).state(), v1::JOB_STATE_RECOVERING) << "shrank while w2 may come back";
  clock_.AdvanceMs(600);
  Beat(w1);
  clock_.AdvanceMs(600);  // w2 silent for 1200 ms > lease 1000 ms: DEAD
  Beat(w1);
  core_->Tick();
  EXPECT_EQ(Job(id).state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(Job(id).world(), 1);
  EXPECT_EQ(Workers(id), std::vector<std::string>{w1});
}

TEST_F(RecoveryTest, PermanentFailureFailsTheJobAtOnceWithoutRestarts) {
  Register();
  Register();
  auto job = Submit(2);
  ASSERT_TRUE(job.ok()) << job.status();
  StartAll(job->job_id());
  ASSERT_TRUE(Fail(job->job_id(), 1, /*permanent=*/true).ok());
  const v1::Job failed = Job(job->job_id());
  EXPECT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(failed.restarts(), 0);
  EXPECT_NE(failed.failure_reason().find("data/x.txt does not exist"), std::string::npos);
  EXPECT_NE(failed.failure_reason().find("permanent"), std::string::npos)
      << failed.failure_reason();
}

TEST_F(RecoveryTest, SubmitRefusesRelativePathsEscapingWithDotDot) {
  for (const std::string set :
       {"data.train=../x.txt", "data.val=a/../../v.txt", "checkpoint.dir=../ckpt"}) {
    auto job = Submit(1, {set});
    ASSERT_FALSE(job.ok()) << set;
    EXPECT_TRUE(absl::IsInvalidArgument(job.status())) << job.status();
    EXPECT_NE(job.status().message().find(set.substr(0, set.find('=')) + ": "), std::string::npos)
        << job.status();
  }
  auto resume = Submit(1, {}, "ckpt/../../elsewhere");
  EXPECT_TRUE(absl::IsInvalidArgument(resume.status())) << resume.status();
  EXPECT_NE(resume.status().message().find("resume_from: "), std::string::npos);
  EXPECT_TRUE(core_->ListJobs({})->jobs().empty()) << "nothing stored";
  // Staying inside, and absolute paths (each worker checks those against
  // its roots), are accepted.
  EXPECT_TRUE(Submit(1, {"data.train=a/../x.txt", "checkpoint.dir=/srv/ckpt"}).ok());
}

}  // namespace
}  // namespace shardtrain::coordinator
