// The fixture of the job runner's tests (job_runner_test.cc: what it reports
// and checkpoints; job_runner_failures_test.cc: what ends a run, and outages):
// the in-memory coordinator, the real Trainer on a tiny model and a small text
// file, world 1, CPU, one thread.
#ifndef SHARDTRAIN_TESTS_UNIT_WORKER_JOB_RUNNER_FIXTURE_H_
#define SHARDTRAIN_TESTS_UNIT_WORKER_JOB_RUNNER_FIXTURE_H_

#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/job_spec.h"
#include "common/metrics.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/fake_coordinator.h"
#include "worker/checkpoint/loader.h"
#include "worker/checkpoint/manifest.h"
#include "worker/checkpoint/storage.h"
#include "worker/checkpoint/weights_file.h"
#include "worker/job_runner.h"
#include "worker/trainer.h"

namespace shardtrain::worker::job_runner_testing {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;
using Rpc = FakeCoordinator::Rpc;

inline constexpr char kJob[] = "job-1";
inline constexpr char kLeaseToken[] = "0123456789abcdef0123456789abcdef";

inline std::vector<int64_t> StepNumbers(const FakeCoordinator::Calls& c) {
  std::vector<int64_t> out;
  for (const v1::ReportStepRequest& r : c.steps) out.push_back(r.report().step());
  return out;
}

class JobRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "job_runner_test-XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    data_ = (dir_ / "train.txt").string();
    std::ofstream out(data_);
    for (int i = 0; i < 20; ++i) out << "A fortune favours the bold; a byte favours the model. ";
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A 3-step job on the tiny model; `extra` lines are appended (later keys
  // must not repeat earlier ones).
  std::string Yaml(const std::string& extra = "") const {
    return absl::StrCat(
        "name: t\n"
        "model: {layers: 1, heads: 2, dim: 16, context: 16, vocab: 256}\n"
        "data: {train: ",
        data_,
        ", format: text, tokenizer: byte}\n"
        "batch: {global: 2, micro: 2, seq_len: 8}\n"
        "steps: 3\n"
        "seed: 7\n",
        extra);
  }
  std::string CheckpointYaml(int every, const std::string& dir = "") const {
    return absl::StrCat("checkpoint: {every: ", every,
                        ", dir: ", dir.empty() ? (dir_ / "ckpt").string() : dir, "}\n");
  }

  JobSpec Spec(const std::string& yaml) const {
    absl::StatusOr<JobSpec> spec = ParseJobSpec(yaml);
    EXPECT_TRUE(spec.ok()) << spec.status();
    return spec.ok() ? *spec : JobSpec();
  }

  // Plans the job in the fake (generation 1, world 1), as the coordinator
  // would when it schedules it.
  void Schedule(const std::string& yaml) {
    ASSERT_TRUE(coordinator_.PlanJob(kJob, 1, Spec(yaml), 1).ok());
  }

  // Runs `yaml` as rank 0 of generation 1 to its end, on this thread, on a
  // worker whose checkpoint root is checkpoint_root_.
  void RunJob(const std::string& yaml, const std::string& resume_from = "") {
    v1::RunAssignment a;
    a.set_job_id(kJob);
    a.set_generation(1);
    a.set_rank(0);
    a.set_world(1);
    a.set_spec_yaml(yaml);
    a.set_resume_from(resume_from);
    a.set_lease_token(kLeaseToken);
    WorkerOptions options;
    options.threads = 1;
    options.checkpoint_root = checkpoint_root_;
    options.data_root = data_root_;
    options.confine_data = !data_root_.empty();
    RunContext ctx{&a, "w-1", &coordinator_, &options, &stop_};
    NewJobRunner (&registry_)(ctx);
  }

  // Runs the job and checks it stopped after step 2 without reporting done
  // or a failure (the daemon's stop flag, the coordinator's abort).
  void ExpectStoppedQuietlyAfterStep2(const std::string& yaml) {
    RunJob(yaml);
    const FakeCoordinator::Calls c = coordinator_.calls();
    EXPECT_EQ(StepNumbers(c), (std::vector<int64_t>{1, 2}));
    EXPECT_TRUE(c.dones.empty());
    EXPECT_TRUE(c.failures.empty());
  }

  // Schedules and runs the 3-step job `yaml`, which must report its three
  // steps and no failure; returns what the coordinator heard.
  FakeCoordinator::Calls RunToTheEnd(const std::string& yaml) {
    Schedule(yaml);
    RunJob(yaml);
    FakeCoordinator::Calls c = coordinator_.calls();
    EXPECT_TRUE(c.failures.empty()) << c.failures[0].reason();
    EXPECT_EQ(StepNumbers(c), (std::vector<int64_t>{1, 2, 3}));
    return c;
  }

  // The run's one failure report, before any step or done: it must say each
  // of `parts`.
  v1::ReportFailureRequest FailedBeforeTraining(std::initializer_list<const char*> parts) {
    const FakeCoordinator::Calls c = coordinator_.calls();
    EXPECT_TRUE(c.steps.empty());
    EXPECT_TRUE(c.dones.empty());
    if (c.failures.size() != 1) {
      ADD_FAILURE() << c.failures.size() << " failure reports, want 1";
      return {};
    }
    for (const char* part : parts) EXPECT_THAT(c.failures[0].reason(), HasSubstr(part));
    return c.failures[0];
  }

  FakeCoordinator coordinator_;
  MetricsRegistry registry_;
  std::atomic<bool> stop_{false};
  std::string checkpoint_root_;
  std::string data_root_;  // when set, the worker's --data-root (confining)
  fs::path dir_;
  std::string data_;
};

}  // namespace shardtrain::worker::job_runner_testing

#endif  // SHARDTRAIN_TESTS_UNIT_WORKER_JOB_RUNNER_FIXTURE_H_
