// The job runner against the in-memory coordinator (job_runner_fixture.h):
// what ends a run before or during training (a plan, data or spec it cannot
// use, the stop flag, an abort or a stale generation in an answer), and what
// does not (a coordinator that is unreachable or down: reports are held and
// sent once it answers).
#include "tests/unit/worker/job_runner_fixture.h"

namespace shardtrain::worker::job_runner_testing {
namespace {

TEST_F(JobRunnerTest, PlanWithOtherAccumulationFailsBeforeTraining) {
  const std::string yaml = Yaml();
  Schedule(yaml);
  v1::Plan plan = *coordinator_.GetPlan(kJob);
  ASSERT_EQ(plan.grad_accum_steps(), 1);
  plan.set_grad_accum_steps(2);
  coordinator_.SetPlan(plan);
  RunJob(yaml);
  const FakeCoordinator::Calls c = coordinator_.calls();
  ASSERT_EQ(c.failures.size(), 1u);
  EXPECT_THAT(c.failures[0].reason(), HasSubstr("plan disagrees"));
  EXPECT_THAT(c.failures[0].reason(), HasSubstr("accumulation 2"));
  EXPECT_EQ(c.failures[0].step(), 0);
  EXPECT_EQ(c.failures[0].job_id(), kJob);
  EXPECT_TRUE(c.steps.empty());
  EXPECT_TRUE(c.dones.empty());
}

TEST_F(JobRunnerTest, PlanOfAnotherGenerationFailsBeforeTraining) {
  const std::string yaml = Yaml();
  ASSERT_TRUE(coordinator_.PlanJob(kJob, /*generation=*/2, Spec(yaml), 1).ok());
  RunJob(yaml);  // generation 1
  EXPECT_FALSE(FailedBeforeTraining({"ABORTED", "plan of generation 2"}).permanent());
}

TEST_F(JobRunnerTest, MissingPlanFails) {
  RunJob(Yaml());  // nothing scheduled: GetPlan answers NOT_FOUND
  EXPECT_FALSE(FailedBeforeTraining({"NOT_FOUND"}).permanent()) << "the plan may come later";
}

TEST_F(JobRunnerTest, MissingDataFileFailsNamingIt) {
  const std::string missing = (dir_ / "no-such.txt").string();
  const std::string yaml = absl::StrReplaceAll(Yaml(), {{data_, missing}});
  Schedule(yaml);
  RunJob(yaml);
  const v1::ReportFailureRequest f = FailedBeforeTraining({missing.c_str(), "data.train"});
  EXPECT_EQ(f.step(), 0);
  EXPECT_TRUE(f.permanent()) << "a retry cannot make the file appear";
}

// With --data-root, an absolute data path outside it fails for good, naming
// the field, before anything is opened; a relative one resolves under it.
TEST_F(JobRunnerTest, DataPathOutsideTheDataRootFailsForGood) {
  data_root_ = (dir_ / "data").string();
  const std::string yaml = Yaml();  // data.train is dir_/train.txt: outside
  Schedule(yaml);
  RunJob(yaml);
  const v1::ReportFailureRequest f = FailedBeforeTraining(
      {"INVALID_ARGUMENT", ("data.train: '" + data_ + "' is outside this worker's root").c_str()});
  EXPECT_TRUE(f.permanent());
  EXPECT_TRUE(coordinator_.calls().plan_requests.empty()) << "refused before the rendezvous";
}

TEST_F(JobRunnerTest, RelativeDataPathResolvesUnderTheDataRoot) {
  data_root_ = (dir_ / "data").string();
  fs::create_directories(data_root_);
  fs::copy_file(data_, data_root_ + "/train.txt");
  fs::remove(data_);  // only the copy under the root exists
  const std::string relative = absl::StrReplaceAll(Yaml(), {{data_, "train.txt"}});
  Schedule(relative);
  RunJob(relative);
  EXPECT_TRUE(coordinator_.calls().failures.empty());
  EXPECT_EQ(coordinator_.calls().dones.size(), 1u);
}

TEST_F(JobRunnerTest, InvalidSpecFailsNamingTheField) {
  RunJob(Yaml("steps2: 4\n"));
  EXPECT_TRUE(FailedBeforeTraining({"INVALID_ARGUMENT", "steps2"}).permanent());
  EXPECT_TRUE(coordinator_.calls().plan_requests.empty());
}

TEST_F(JobRunnerTest, StopFlagEndsTheRunWithoutDone) {
  const std::string yaml = Yaml();
  Schedule(yaml);
  coordinator_.set_on_step([this](const v1::ReportStepRequest& r) {
    if (r.report().step() == 2) stop_ = true;  // e.g. the daemon was told to abort
  });
  ExpectStoppedQuietlyAfterStep2(yaml);
}

TEST_F(JobRunnerTest, StepAnsweredWithAbortEndsTheRun) {
  const std::string yaml = Yaml();
  Schedule(yaml);
  coordinator_.AbortAtStep(2);  // e.g. the job was cancelled
  ExpectStoppedQuietlyAfterStep2(yaml);
}

TEST_F(JobRunnerTest, StaleGenerationOnStepReportEndsTheRun) {
  const std::string yaml = Yaml();
  Schedule(yaml);
  coordinator_.FailNext(Rpc::kReportStep, absl::AbortedError("generation 1 is stale"));
  RunJob(yaml);
  const FakeCoordinator::Calls c = coordinator_.calls();
  EXPECT_EQ(StepNumbers(c), (std::vector<int64_t>{1}));
  EXPECT_TRUE(c.dones.empty());
}

// The refused report is held and sent again, before the later ones.
TEST_F(JobRunnerTest, UnreachableCoordinatorOnStepReportDoesNotStopTraining) {
  const std::string yaml = Yaml();
  Schedule(yaml);
  coordinator_.FailNext(Rpc::kReportStep, absl::UnavailableError("connection refused"));
  RunJob(yaml);
  const FakeCoordinator::Calls c = coordinator_.calls();
  EXPECT_EQ(StepNumbers(c), (std::vector<int64_t>{1, 1, 2, 3}));
  EXPECT_EQ(c.dones.size(), 1u);
}

// A coordinator outage from step 2's report to after the run's end (issue
// 50): training goes on, every report is held, and once the coordinator
// answers they arrive in order: the steps, the checkpoints of steps 2 and 4
// (shard, then rank 0's commit), then done.
TEST_F(JobRunnerTest, AnOutageLosesNoReportAndCommitsTheCheckpointsWrittenMeanwhile) {
  const std::string yaml = absl::StrReplaceAll(Yaml(CheckpointYaml(2)), {{"steps: 3", "steps: 6"}});
  Schedule(yaml);
  coordinator_.set_on_step([this](const v1::ReportStepRequest& r) {
    if (r.report().step() == 1) coordinator_.SetOutage(true);
  });
  std::thread ends_outage([this] {
    // Until the run has written step 4's shard and ended (final weights).
    const fs::path last = dir_ / "ckpt" / "final.weights";
    for (int i = 0; i < 300 && !fs::exists(last); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_TRUE(coordinator_.Committed(kJob).empty());  // nothing got through meanwhile
    coordinator_.SetOutage(false);
  });
  RunJob(yaml);
  ends_outage.join();
  const FakeCoordinator::Calls c = coordinator_.calls();
  std::vector<int64_t> delivered;  // the refused attempts of step 2 folded into one
  for (int64_t s : StepNumbers(c)) {
    if (delivered.empty() || delivered.back() != s) delivered.push_back(s);
  }
  EXPECT_EQ(delivered, (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  std::vector<int64_t> committed;
  for (const v1::CheckpointInfo& i : coordinator_.Committed(kJob)) committed.push_back(i.step());
  EXPECT_EQ(committed, (std::vector<int64_t>{2, 4}));
  EXPECT_TRUE(fs::exists(dir_ / "ckpt" / "step-4" / "manifest.txt"));
  EXPECT_TRUE(c.checkpoint_failures.empty());
  ASSERT_EQ(c.dones.size(), 1u);  // sent once, after everything else
  EXPECT_EQ(c.dones[0].steps(), 6);
  EXPECT_TRUE(c.failures.empty());
}

TEST_F(JobRunnerTest, DoneIsRetriedWhileTheCoordinatorIsUnreachable) {
  const std::string yaml = Yaml();
  Schedule(yaml);
  coordinator_.FailNext(Rpc::kReportDone, absl::UnavailableError("connection refused"), 2);
  RunJob(yaml);
  const FakeCoordinator::Calls c = coordinator_.calls();
  EXPECT_EQ(c.dones.size(), 3u);  // two refused, the third answered
  for (const v1::ReportDoneRequest& d : c.dones) EXPECT_EQ(d.steps(), 3);
}

}  // namespace
}  // namespace shardtrain::worker::job_runner_testing
