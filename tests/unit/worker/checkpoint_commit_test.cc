// Rank 0's side of a checkpoint commit (worker/checkpoint_commit.h) against
// the in-memory coordinator and checkpoint storage, with a world of 2: the
// manifest it writes loads, it commits what the spec names, it deletes only
// below the oldest kept step, and it commits nothing when a report is
// missing, a shard is not on its volume, or it is stopped.
#include "worker/checkpoint_commit.h"

#include <atomic>
#include <string>
#include <vector>

#include "common/storage_fault.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/checkpoint/checkpoint_test_util.h"
#include "tests/unit/worker/fake_coordinator.h"

namespace shardtrain::worker {
namespace {

using ::testing::HasSubstr;
using Rpc = FakeCoordinator::Rpc;
namespace ck = ::shardtrain::checkpoint;

constexpr char kJob[] = "job-1";
constexpr char kLocalDir[] = "/volume/ckpt";  // where this worker reaches the job's checkpoint.dir

class Rank0CommitTest : public ::testing::Test {
 protected:
  Rank0CommitTest()
      : layout_(ck::SmallConfig()), state_(ck::MakeFlatState(layout_.num_params(), 7)) {}

  void SetUp() override {
    v1::Plan plan;
    plan.set_job_id(kJob);
    plan.set_generation(1);
    plan.set_world(2);
    coordinator_.SetPlan(plan);  // the fake's world for shard reports
    target_.job_id = kJob;
    target_.generation = 1;
    target_.worker_id = "w-1";
    target_.world = 2;
    target_.zero_stage = 1;
    target_.dir = "ckpt";  // relative, as the spec says
    target_.local_dir = kLocalDir;
    target_.wait = absl::Milliseconds(200);
  }

  // Rank `rank` writes its shard of `step` under `dir` and, when `report`,
  // tells the coordinator.
  void WriteShard(int rank, int64_t step, const std::string& dir = kLocalDir, bool report = true) {
    const auto ranges = ck::RankRanges(layout_, 2, /*zero=*/1);
    const std::string path = ck::JoinPath(ck::StepDir(dir, step), ck::ShardFileName(rank));
    absl::StatusOr<ck::ShardFileInfo> info =
        ck::WriteShard(storage_, path, ck::MakeShard(layout_, step, 2, rank, ranges[rank], state_));
    ASSERT_TRUE(info.ok()) << info.status();
    if (!report) return;
    v1::ReportCheckpointRequest r;
    r.set_worker_id(rank == 0 ? "w-1" : "w-2");
    v1::CheckpointShard* s = r.mutable_shard();
    s->set_job_id(kJob);
    s->set_generation(1);
    s->set_rank(rank);
    s->set_step(step);
    s->set_path(path);
    s->set_bytes(int64_t(info->bytes));
    s->set_crc64(info->checksum);
    for (const ck::FlatRange& fr : info->ranges) {
      v1::FlatRange* out = s->add_ranges();
      out->set_begin(int64_t(fr.begin));
      out->set_end(int64_t(fr.end));
    }
    ASSERT_TRUE(coordinator_.ReportCheckpoint(r).ok());
  }
  void WriteBothShards(int64_t step) {
    WriteShard(0, step);
    WriteShard(1, step);
  }

  absl::StatusOr<CommitResult> Commit(int64_t step) {
    return CommitCheckpoint(coordinator_, storage_, layout_, target_, step, stop_);
  }

  bool HasManifest(int64_t step) {
    return storage_.Exists(ck::ManifestPath(ck::StepDir(kLocalDir, step)));
  }

  const model::ParamLayout layout_;
  const ck::FlatState state_;
  ck::FakeCheckpointStorage storage_;
  FakeCoordinator coordinator_;
  CommitTarget target_;
  std::atomic<bool> stop_{false};
};

TEST_F(Rank0CommitTest, WritesAManifestThatLoadsCommitsAndDeletesBelowTheOldestKept) {
  coordinator_.set_checkpoint_keep(1);
  WriteShard(0, 5, kLocalDir, /*report=*/false);  // a save cut short: no report, no manifest
  WriteBothShards(10);
  absl::StatusOr<CommitResult> first = Commit(10);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->removed, std::vector<std::string>{ck::StepDir(kLocalDir, 5)});
  WriteBothShards(20);
  absl::StatusOr<CommitResult> second = Commit(20);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE(second->cleanup.ok()) << second->cleanup;

  // What the coordinator was asked to record: the step as the spec names it.
  const FakeCoordinator::Calls c = coordinator_.calls();
  ASSERT_EQ(c.commits.size(), 2u);
  EXPECT_EQ(c.commits[1].rank(), 0);
  EXPECT_EQ(c.commits[1].worker_id(), "w-1");
  EXPECT_EQ(c.commits[1].generation(), 1);
  EXPECT_EQ(c.commits[1].step(), 20);
  EXPECT_EQ(c.commits[1].dir(), "ckpt/step-20");
  EXPECT_EQ(c.commits[1].manifest_path(), "ckpt/step-20/manifest.txt");
  EXPECT_EQ(second->commit.keep_from_step(), 20);
  EXPECT_EQ(second->removed, std::vector<std::string>{ck::StepDir(kLocalDir, 10)});
  EXPECT_EQ(*storage_.List(kLocalDir), std::vector<std::string>{"step-20"});

  // The manifest names both ranks' shards and loads back bit for bit.
  absl::StatusOr<ck::Manifest> m =
      ck::ReadManifest(storage_, ck::ManifestPath(ck::StepDir(kLocalDir, 20)));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->step, 20);
  EXPECT_EQ(m->world, 2);
  EXPECT_EQ(m->zero_stage, 1);
  absl::StatusOr<ck::LoadedState> loaded = ck::LoadAll(storage_, ck::StepDir(kLocalDir, 20), *m);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(ck::Bitwise(loaded->params, state_.params, 0));
}

TEST_F(Rank0CommitTest, ShardMissingFromRank0sVolumeIsNotCommitted) {
  WriteShard(0, 10);
  WriteShard(1, 10, "/another/volume/ckpt");  // rank 1 resolved checkpoint.dir elsewhere
  absl::StatusOr<CommitResult> r = Commit(10);
  EXPECT_TRUE(absl::IsFailedPrecondition(r.status())) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("rank 1 wrote /another/volume/ckpt/step-10"));
  EXPECT_THAT(r.status().message(), HasSubstr("--checkpoint-root"));
  EXPECT_FALSE(HasManifest(10));
  EXPECT_TRUE(coordinator_.calls().commits.empty());
}

TEST_F(Rank0CommitTest, RankThatNeverReportsRunsTheWaitOutAndNothingIsCommitted) {
  WriteShard(0, 10);
  absl::StatusOr<CommitResult> r = Commit(10);
  EXPECT_TRUE(absl::IsDeadlineExceeded(r.status())) << r.status();
  EXPECT_FALSE(HasManifest(10));
  EXPECT_TRUE(coordinator_.calls().commits.empty());
  EXPECT_FALSE(coordinator_.calls().shard_waits.empty());
  for (const auto& w : coordinator_.calls().shard_waits) EXPECT_LE(w.wait_ms(), 1000);
}

TEST_F(Rank0CommitTest, StopEndsTheWait) {
  WriteShard(0, 10);
  stop_ = true;
  EXPECT_TRUE(absl::IsCancelled(Commit(10).status()));
  EXPECT_FALSE(HasManifest(10));
}

// The coordinator restarted after the reports: it refuses the commit, so the
// step is not committed; its directory, manifest and all, is removed (nobody
// resumes from it), and the commit before it stays.
TEST_F(Rank0CommitTest, RefusedCommitRemovesItsStepAndKeepsTheOneBefore) {
  coordinator_.set_checkpoint_keep(1);
  WriteBothShards(10);
  ASSERT_TRUE(Commit(10).ok());
  WriteBothShards(20);
  coordinator_.FailNext(Rpc::kCommitCheckpoint,
                        absl::FailedPreconditionError("the coordinator holds 0 of 2 reports"));
  absl::StatusOr<CommitResult> r = Commit(20);
  EXPECT_TRUE(absl::IsFailedPrecondition(r.status())) << r.status();
  EXPECT_FALSE(HasManifest(20));
  EXPECT_TRUE(HasManifest(10));
  EXPECT_EQ(*storage_.List(kLocalDir), std::vector<std::string>{"step-10"});
  ASSERT_EQ(coordinator_.Committed(kJob).size(), 1u);
  EXPECT_EQ(coordinator_.Committed(kJob)[0].step(), 10);
}

// Rank 1 could not write its shard (a full volume): the wait ends as soon as
// it says so, nothing is committed, and the step's directory (rank 0's
// shard) is removed; the newest committed checkpoint stays whole.
TEST_F(Rank0CommitTest, RankThatCouldNotWriteItsShardEndsTheWaitAndItsStepIsRemoved) {
  WriteBothShards(10);
  ASSERT_TRUE(Commit(10).ok());
  WriteShard(0, 20);
  v1::ReportCheckpointFailureRequest f;
  f.set_job_id(kJob);
  f.set_generation(1);
  f.set_worker_id("w-2");
  f.mutable_failure()->set_rank(1);
  f.mutable_failure()->set_step(20);
  f.mutable_failure()->set_cause("No space left on device");
  f.mutable_failure()->set_path("/volume/ckpt/step-20");
  f.mutable_failure()->set_reason("no_space");
  ASSERT_TRUE(coordinator_.ReportCheckpointFailure(f).ok());
  target_.wait = absl::Seconds(30);  // must not be waited out
  const absl::Time start = absl::Now();
  absl::StatusOr<CommitResult> r = Commit(20);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_TRUE(absl::IsFailedPrecondition(r.status())) << r.status();
  EXPECT_EQ(r.status().message(),
            "rank 1 could not write its shard: No space left on device (/volume/ckpt/step-20)");
  EXPECT_EQ(*storage_.List(kLocalDir), std::vector<std::string>{"step-10"});
  EXPECT_TRUE(HasManifest(10));
  ASSERT_EQ(coordinator_.calls().commits.size(), 1u);  // step 10's only
}

// The manifest cannot be written (the volume filled up meanwhile): not
// committed, and the step's shards are removed.
TEST_F(Rank0CommitTest, ManifestThatCannotBeWrittenRemovesTheStep) {
  WriteBothShards(10);
  storage_.FailWritesWith(StorageError(StorageFault::kNoSpace, "cannot write manifest: full",
                                       "No space left on device"));
  absl::StatusOr<CommitResult> r = Commit(10);
  EXPECT_TRUE(absl::IsResourceExhausted(r.status())) << r.status();
  EXPECT_EQ(StorageFaultOf(r.status()), StorageFault::kNoSpace);
  EXPECT_TRUE(absl::IsNotFound(storage_.List(kLocalDir).status()));  // nothing left
  EXPECT_TRUE(coordinator_.calls().commits.empty());
}

TEST_F(Rank0CommitTest, CommitIsRetriedWhileTheCoordinatorIsUnreachable) {
  WriteBothShards(10);
  coordinator_.FailNext(Rpc::kCommitCheckpoint, absl::UnavailableError("connection refused"), 2);
  absl::StatusOr<CommitResult> r = Commit(10);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(coordinator_.calls().commits.size(), 3u);
  EXPECT_EQ(r->commit.checkpoint().step(), 10);
}

TEST(ResolveCheckpointPathTest, RelativePathsResolveAgainstTheRoot) {
  EXPECT_EQ(ResolveCheckpointPath("/volume", "ckpt/a"), "/volume/ckpt/a");
  EXPECT_EQ(ResolveCheckpointPath("/volume/", "ckpt/a"), "/volume/ckpt/a");
  EXPECT_EQ(ResolveCheckpointPath("/volume", "/abs/ckpt"), "/abs/ckpt");
  EXPECT_EQ(ResolveCheckpointPath("/volume", ""), "");
  EXPECT_EQ(ResolveCheckpointPath("", "ckpt/a"), "ckpt/a");
}

}  // namespace
}  // namespace shardtrain::worker
