// The job runner against the in-memory coordinator (job_runner_fixture.h):
// what it reports — each step, validation losses, the final weights — and
// how it checkpoints and commits. What the runner reports is compared with a
// Trainer driven directly over the same spec.
#include "tests/unit/worker/job_runner_fixture.h"

namespace shardtrain::worker::job_runner_testing {
namespace {

TEST_F(JobRunnerTest, ReportsEachStepOfTheTrainerThenDone) {
  const std::string yaml = Yaml();
  Schedule(yaml);
  RunJob(yaml);

  // The same spec driven directly: the runner must report its numbers.
  auto trainer = Trainer::Create(Spec(yaml), 0, 1, nullptr);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  const FakeCoordinator::Calls c = coordinator_.calls();
  EXPECT_TRUE(c.failures.empty()) << c.failures[0].reason();
  EXPECT_EQ(c.plan_requests, std::vector<std::string>{kJob});
  ASSERT_EQ(StepNumbers(c), (std::vector<int64_t>{1, 2, 3}));
  for (const v1::ReportStepRequest& r : c.steps) {
    auto want = (*trainer)->Step(r.report().step());
    ASSERT_TRUE(want.ok()) << want.status();
    const v1::StepReport& s = r.report();
    EXPECT_EQ(r.worker_id(), "w-1");
    EXPECT_EQ(s.job_id(), kJob);
    EXPECT_EQ(s.generation(), 1);
    EXPECT_EQ(s.rank(), 0);
    EXPECT_TRUE(std::isfinite(s.loss())) << "step " << s.step();
    EXPECT_EQ(s.loss(), want->loss) << "step " << s.step();
    EXPECT_EQ(s.grad_norm(), want->grad_norm) << "step " << s.step();
    EXPECT_EQ(s.lr(), want->lr) << "step " << s.step();
  }
  // A byte model starts near uniform: ln 256 = 5.55.
  EXPECT_NEAR(c.steps[0].report().loss(), std::log(256.0), 0.5);
  ASSERT_EQ(c.dones.size(), 1u);
  EXPECT_EQ(c.dones[0].job_id(), kJob);
  EXPECT_EQ(c.dones[0].generation(), 1);
  EXPECT_EQ(c.dones[0].rank(), 0);
  EXPECT_EQ(c.dones[0].worker_id(), "w-1");
  EXPECT_EQ(c.dones[0].steps(), 3);
  EXPECT_EQ(c.dones[0].output(), "");  // no checkpoint.dir: no weights saved
  EXPECT_TRUE(c.checkpoints.empty());
}

// eval.every 2 of 3 steps: steps 2 and 3 (the last) carry the trainer's
// validation loss, step 1 none; the worker's gauge holds the last one while
// the job runs (scraped at the last step report), and every series of the
// job is gone once it ended on this worker.
TEST_F(JobRunnerTest, ReportsTheValidationLossOnEvaluationSteps) {
  std::string during;
  coordinator_.set_on_step([&](const v1::ReportStepRequest& r) {
    if (r.report().step() == 3) during = registry_.Serialize();
  });
  const std::string val = (dir_ / "val.txt").string();
  {
    std::ofstream out(val);
    for (int i = 0; i < 5; ++i) out << "Held-out text the model never trains on. ";
  }
  const std::string yaml =
      absl::StrReplaceAll(Yaml("eval: {every: 2, batches: 2}\n"),
                          {{", format: text", absl::StrCat(", val: ", val, ", format: text")}});
  const FakeCoordinator::Calls c = RunToTheEnd(yaml);
  auto trainer = Trainer::Create(Spec(yaml), 0, 1, nullptr);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  double last = 0;
  for (const v1::ReportStepRequest& r : c.steps) {
    auto want = (*trainer)->Step(r.report().step());
    ASSERT_TRUE(want.ok()) << want.status();
    const v1::StepReport& s = r.report();
    ASSERT_EQ(s.has_val_loss(), s.step() != 1) << "step " << s.step();
    if (!s.has_val_loss()) continue;
    EXPECT_EQ(s.val_loss(), *want->val_loss) << "step " << s.step();
    EXPECT_NEAR(s.val_loss(), std::log(256.0), 1.0) << "step " << s.step();
    last = s.val_loss();
  }
  EXPECT_THAT(during, HasSubstr(absl::StrCat("shardtrain_worker_val_loss{job_id=\"", kJob,
                                             "\",rank=\"0\"} ", FormatMetricValue(last), "\n")));
  for (const char* series : {"steps_total", "tokens_total", "step_seconds_count", "loss",
                             "collective_seconds_total", "sent_bytes_total", "memory_bytes"}) {
    EXPECT_THAT(during, HasSubstr(absl::StrCat("shardtrain_worker_", series, "{job_id=\"", kJob)))
        << series;
  }
  const std::string after = registry_.Serialize();
  EXPECT_THAT(after, Not(HasSubstr(kJob))) << after;
  EXPECT_THAT(after, HasSubstr("shardtrain_worker_peak_rss_bytes "));
}

TEST_F(JobRunnerTest, SavesTheFinalWeightsAndReportsWhere) {
  const std::string yaml = Yaml(CheckpointYaml(0));
  const FakeCoordinator::Calls c = RunToTheEnd(yaml);
  ASSERT_EQ(c.dones.size(), 1u);
  EXPECT_EQ(c.dones[0].output(), (dir_ / "ckpt" / "final.weights").string());
  EXPECT_TRUE(c.checkpoints.empty());  // every: 0

  auto trainer = Trainer::Create(Spec(yaml), 0, 1, nullptr);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  for (int step = 1; step <= 3; ++step) ASSERT_TRUE((*trainer)->Step(step).ok());
  absl::StatusOr<checkpoint::LoadedWeights> saved = checkpoint::LoadWeights(c.dones[0].output());
  ASSERT_TRUE(saved.ok()) << saved.status();
  const absl::Span<const float> want = (*trainer)->engine().params().f32();
  ASSERT_EQ(saved->params.size(), want.size());
  size_t differ = 0;
  for (size_t i = 0; i < want.size(); ++i) differ += saved->params[i] != want[i];
  EXPECT_EQ(differ, 0u) << "of " << want.size() << " parameters";
}

// A LoRA job's final weights are the model with the adapters merged, in the
// model's own layout (what sample and export read).
TEST_F(JobRunnerTest, SavesALoraJobsMergedModel) {
  const std::string yaml =
      Yaml(CheckpointYaml(0)) + "finetune: {lora: {rank: 2, targets: [q, v, o]}}\n";
  const FakeCoordinator::Calls c = RunToTheEnd(yaml);
  ASSERT_EQ(c.dones.size(), 1u);
  absl::StatusOr<checkpoint::LoadedWeights> saved = checkpoint::LoadWeights(c.dones[0].output());
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_FALSE(saved->config.lora.on());
  auto trainer = Trainer::Create(Spec(yaml), 0, 1, nullptr);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  for (int step = 1; step <= 3; ++step) ASSERT_TRUE((*trainer)->Step(step).ok());
  absl::StatusOr<absl::Span<const float>> merged = (*trainer)->WholeModel();
  ASSERT_TRUE(merged.ok()) << merged.status();
  ASSERT_EQ(saved->params.size(), merged->size());
  size_t differ = 0;
  for (size_t i = 0; i < merged->size(); ++i) differ += saved->params[i] != (*merged)[i];
  EXPECT_EQ(differ, 0u) << "of " << merged->size() << " parameters";
}

TEST_F(JobRunnerTest, CheckpointsEveryStepBeforeTheLast) {
  const std::string yaml = Yaml(CheckpointYaml(1));
  const FakeCoordinator::Calls c = RunToTheEnd(yaml);
  ASSERT_EQ(c.dones.size(), 1u);
  const int64_t num_params = coordinator_.GetPlan(kJob)->num_params();
  ASSERT_GT(num_params, 0);
  ASSERT_EQ(c.checkpoints.size(), 2u);  // steps 1 and 2; the last step ends in final weights
  for (size_t i = 0; i < c.checkpoints.size(); ++i) {
    const v1::CheckpointShard& s = c.checkpoints[i].shard();
    EXPECT_EQ(c.checkpoints[i].worker_id(), "w-1");
    EXPECT_EQ(s.job_id(), kJob);
    EXPECT_EQ(s.generation(), 1);
    EXPECT_EQ(s.rank(), 0);
    EXPECT_EQ(s.step(), int64_t(i) + 1);
    ASSERT_TRUE(fs::exists(s.path())) << s.path();
    EXPECT_EQ(int64_t(fs::file_size(s.path())), s.bytes());
    EXPECT_NE(s.crc64(), 0u);
    // World 1: this rank's ranges cover every parameter once, in order.
    int64_t next = 0;
    for (const v1::FlatRange& r : s.ranges()) {
      EXPECT_EQ(r.begin(), next);
      EXPECT_GT(r.end(), r.begin());
      next = r.end();
    }
    EXPECT_EQ(next, num_params) << "step " << s.step();
  }
}

// Every call the rank makes for its job presents the assignment's lease
// token: without it the coordinator refuses the call (coordinator/fencing.h).
TEST_F(JobRunnerTest, EveryReportPresentsTheAssignmentsLeaseToken) {
  const FakeCoordinator::Calls c = RunToTheEnd(Yaml(CheckpointYaml(1)));
  ASSERT_EQ(c.steps.size(), 3u);
  ASSERT_FALSE(c.checkpoints.empty());
  ASSERT_FALSE(c.shard_waits.empty());
  ASSERT_FALSE(c.commits.empty());
  ASSERT_EQ(c.dones.size(), 1u);
  for (const auto& r : c.steps) EXPECT_EQ(r.lease_token(), kLeaseToken);
  for (const auto& r : c.checkpoints) EXPECT_EQ(r.lease_token(), kLeaseToken);
  for (const auto& r : c.shard_waits) EXPECT_EQ(r.lease_token(), kLeaseToken);
  for (const auto& r : c.commits) EXPECT_EQ(r.lease_token(), kLeaseToken);
  EXPECT_EQ(c.dones[0].lease_token(), kLeaseToken);
}

// Rank 0 commits each checkpoint itself: the manifest next to its shard, the
// commit at the coordinator, then the steps below the oldest kept one go.
TEST_F(JobRunnerTest, Rank0WritesTheManifestCommitsAndRemovesOlderSteps) {
  coordinator_.set_checkpoint_keep(1);
  const FakeCoordinator::Calls c = RunToTheEnd(Yaml(CheckpointYaml(1)));
  ASSERT_EQ(c.dones.size(), 1u);
  ASSERT_EQ(c.commits.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const std::string step_dir = (dir_ / "ckpt" / ("step-" + std::to_string(i + 1))).string();
    EXPECT_EQ(c.commits[i].step(), i + 1);
    EXPECT_EQ(c.commits[i].rank(), 0);
    EXPECT_EQ(c.commits[i].generation(), 1);
    EXPECT_EQ(c.commits[i].dir(), step_dir);
    EXPECT_EQ(c.commits[i].manifest_path(), step_dir + "/manifest.txt");
  }
  const std::vector<v1::CheckpointInfo> record = coordinator_.Committed(kJob);
  ASSERT_EQ(record.size(), 1u);
  EXPECT_EQ(record[0].step(), 2);
  // keep 1: step 1 was removed by the commit of step 2; final.weights stays.
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir_ / "ckpt")) left.push_back(e.path().filename());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"final.weights", "step-2"}));
  checkpoint::FileCheckpointStorage storage;
  const std::string step2 = (dir_ / "ckpt" / "step-2").string();
  absl::StatusOr<checkpoint::Manifest> m =
      checkpoint::ReadManifest(storage, checkpoint::ManifestPath(step2));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->step, 2);
  EXPECT_EQ(m->world, 1);
  EXPECT_TRUE(checkpoint::VerifyShards(storage, step2, *m).ok());
  EXPECT_TRUE(c.events.empty()) << c.events[0].message();
}

// A relative checkpoint.dir lands under the worker's checkpoint root; the
// coordinator is told the step as the spec names it, and a relative
// resume_from (what recovery hands out) resolves there too.
TEST_F(JobRunnerTest, RelativeCheckpointDirResolvesAgainstTheCheckpointRoot) {
  checkpoint_root_ = (dir_ / "volume").string();
  const std::string yaml = Yaml(CheckpointYaml(1, "ckpt/rel"));
  const FakeCoordinator::Calls c = RunToTheEnd(yaml);
  ASSERT_EQ(c.commits.size(), 2u);
  EXPECT_EQ(c.commits[1].dir(), "ckpt/rel/step-2");
  EXPECT_EQ(c.checkpoints[1].shard().path(), checkpoint_root_ + "/ckpt/rel/step-2/rank-0.shard");
  EXPECT_TRUE(fs::exists(checkpoint_root_ + "/ckpt/rel/step-2/manifest.txt"));
  ASSERT_EQ(c.dones.size(), 1u);
  EXPECT_EQ(c.dones[0].output(), checkpoint_root_ + "/ckpt/rel/final.weights");
  EXPECT_FALSE(fs::exists(dir_ / "ckpt"));

  RunJob(yaml, "ckpt/rel/step-2");
  const FakeCoordinator::Calls again = coordinator_.calls();
  EXPECT_TRUE(again.failures.empty()) << again.failures[0].reason();
  ASSERT_EQ(again.steps.size(), 4u);  // 1, 2, 3, then only 3 again
  EXPECT_EQ(again.steps[3].report().step(), 3);
  EXPECT_EQ(again.steps[3].report().loss(), c.steps[2].report().loss());
  ASSERT_FALSE(again.events.empty());
  EXPECT_THAT(again.events.back().message(),
              HasSubstr("resumed from " + checkpoint_root_ + "/ckpt/rel/step-2"));
}

// No rank's report within the wait (a rank died), then a commit the
// coordinator refuses (it restarted): nothing is committed, the job hears
// why each step failed, training goes on. The refused step's directory is
// removed; the timed-out one is left (a rank may still be writing into it)
// to the next commit's cleanup.
TEST_F(JobRunnerTest, CommitThatCannotCompleteLeavesTheStepUncommittedAndTrainingGoesOn) {
  coordinator_.set_checkpoint_keep(1);
  coordinator_.FailNext(Rpc::kWaitCheckpointShards,
                        absl::DeadlineExceededError("0 of 1 ranks reported"), 1);
  coordinator_.FailNext(Rpc::kCommitCheckpoint,
                        absl::FailedPreconditionError("the coordinator holds 0 of 1 reports"), 1);
  const FakeCoordinator::Calls c =
      RunToTheEnd(Yaml("timeouts: {collective_s: 2}\n" + CheckpointYaml(1)));
  EXPECT_EQ(c.dones.size(), 1u);
  EXPECT_TRUE(coordinator_.Committed(kJob).empty());
  EXPECT_FALSE(fs::exists(dir_ / "ckpt" / "step-1" / "manifest.txt"));  // the wait ran out
  EXPECT_TRUE(fs::exists(dir_ / "ckpt" / "step-1" / "rank-0.shard"));
  EXPECT_FALSE(fs::exists(dir_ / "ckpt" / "step-2"));  // written, refused, removed
  ASSERT_EQ(c.checkpoint_failures.size(), 2u);
  const v1::CheckpointFailure& first = c.checkpoint_failures[0].failure();
  EXPECT_EQ(first.step(), 1);
  EXPECT_EQ(first.rank(), 0);
  EXPECT_EQ(first.reason(), "incomplete");
  EXPECT_THAT(first.cause(), HasSubstr("0 of 1 ranks reported"));
  EXPECT_EQ(first.path(), (dir_ / "ckpt" / "step-1").string());
  const v1::CheckpointFailure& second = c.checkpoint_failures[1].failure();
  EXPECT_EQ(second.step(), 2);
  EXPECT_EQ(second.reason(), "other");
  EXPECT_THAT(second.cause(), HasSubstr("the coordinator holds 0 of 1 reports"));
  EXPECT_EQ(c.checkpoint_failures[1].lease_token(), kLeaseToken);
}

// A checkpoint.dir that is a file ("a path that is not a directory"): each
// checkpoint is reported as not written (why and where), training goes on
// and every step is reported; the final weights are retried for
// checkpoint.final_retry_s with one warning, then the job fails once, for
// good, naming the file and the cause.
TEST_F(JobRunnerTest, StorageFaultsAreReportedTrainingGoesOnAndFinalWeightsFailOnceForGood) {
  const std::string file = (dir_ / "not-a-dir").string();
  std::ofstream(file) << "x";
  const std::string yaml = Yaml("checkpoint: {every: 1, dir: " + file + ", final_retry_s: 1}\n");
  Schedule(yaml);
  const absl::Time start = absl::Now();
  RunJob(yaml);
  const absl::Duration took = absl::Now() - start;
  const FakeCoordinator::Calls c = coordinator_.calls();
  EXPECT_EQ(StepNumbers(c), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_TRUE(c.checkpoints.empty());
  ASSERT_EQ(c.checkpoint_failures.size(), 2u) << "one per checkpoint step, rank 0 once each";
  for (int i = 0; i < 2; ++i) {
    const v1::CheckpointFailure& f = c.checkpoint_failures[i].failure();
    EXPECT_EQ(f.step(), i + 1);
    EXPECT_EQ(f.reason(), "not_a_directory");
    EXPECT_EQ(f.cause(), "Not a directory");
    EXPECT_EQ(f.path(), file + "/step-" + std::to_string(i + 1));
  }
  EXPECT_TRUE(c.dones.empty());
  ASSERT_EQ(c.failures.size(), 1u);
  EXPECT_TRUE(c.failures[0].permanent()) << "retraining cannot fix the path";
  EXPECT_EQ(c.failures[0].step(), 3);
  EXPECT_THAT(c.failures[0].reason(),
              HasSubstr("final weights not saved: Not a directory (" + file + "/final.weights)"));
  EXPECT_THAT(c.failures[0].reason(), HasSubstr("retried for 1s"));
  ASSERT_EQ(c.events.size(), 1u);
  EXPECT_TRUE(c.events[0].warning());
  EXPECT_THAT(c.events[0].message(), HasSubstr("final weights not saved: Not a directory"));
  EXPECT_THAT(c.events[0].message(), HasSubstr("retried for up to 1s"));
  EXPECT_GE(took, absl::Seconds(1));
  EXPECT_LT(took, absl::Seconds(20));
  EXPECT_TRUE(fs::is_regular_file(file));  // nothing written around it
}

// Space freed during the back-off: the weights kept in memory are saved and
// the job is done, with one warning and the attempt that succeeded.
TEST_F(JobRunnerTest, FinalWeightsAreSavedWhenTheDirectoryIsFixedDuringTheBackOff) {
  const std::string dir = (dir_ / "ck").string();
  std::ofstream(dir) << "in the way";
  const std::string yaml = Yaml("checkpoint: {every: 0, dir: " + dir + ", final_retry_s: 30}\n");
  Schedule(yaml);
  std::thread fix([&] {
    coordinator_.WaitFor([](const FakeCoordinator::Calls& c) { return !c.events.empty(); },
                         absl::Seconds(30));
    fs::remove(dir);  // the user frees the path
  });
  RunJob(yaml);
  fix.join();
  const FakeCoordinator::Calls c = coordinator_.calls();
  EXPECT_TRUE(c.failures.empty());
  ASSERT_EQ(c.dones.size(), 1u);
  EXPECT_EQ(c.dones[0].output(), dir + "/final.weights");
  EXPECT_TRUE(checkpoint::LoadWeights(dir + "/final.weights").ok());
  ASSERT_EQ(c.events.size(), 2u);
  EXPECT_TRUE(c.events[0].warning());
  EXPECT_THAT(c.events[1].message(), HasSubstr("final weights saved to " + dir + "/final.weights"));
}

// checkpoint.on_failure failed the job: the rank stops at once, quietly.
TEST_F(JobRunnerTest, CheckpointFailureAnsweredWithAbortEndsTheRun) {
  coordinator_.AbortOnCheckpointFailure(true);
  const std::string file = (dir_ / "not-a-dir").string();
  std::ofstream(file) << "x";
  const std::string yaml = Yaml("checkpoint: {every: 1, dir: " + file + "}\n");
  Schedule(yaml);
  RunJob(yaml);
  const FakeCoordinator::Calls c = coordinator_.calls();
  EXPECT_EQ(StepNumbers(c), (std::vector<int64_t>{1}));
  EXPECT_EQ(c.checkpoint_failures.size(), 1u);
  EXPECT_TRUE(c.dones.empty());
  EXPECT_TRUE(c.failures.empty());
}

}  // namespace
}  // namespace shardtrain::worker::job_runner_testing
