// Unit tests of worker/checkpoint storage, the resharding loader and the
// directory policy, on the real filesystem (a fresh temp dir) and on the
// in-memory fake alike. The file formats: checkpoint_format_test.cc.
#include <cerrno>

#include "common/storage_fault.h"
#include "tests/unit/worker/checkpoint/checkpoint_test_util.h"

namespace shardtrain::checkpoint {
namespace {

using ::testing::HasSubstr;

INSTANTIATE_TEST_SUITE_P(Storages, StorageTest,
                         ::testing::Values(StorageKind::kFile, StorageKind::kFake),
                         [](const auto& info) {
                           return info.param == StorageKind::kFile ? "File" : "Fake";
                         });

TEST_P(StorageTest, BasicOperations) {
  const std::string a = JoinPath(dir_, "x/a.bin");
  EXPECT_TRUE(absl::IsNotFound(storage().Read(a).status()));
  EXPECT_TRUE(absl::IsNotFound(storage().List(dir_).status()));
  const std::string_view pieces[] = {"hello ", "", "world"};
  ASSERT_TRUE(storage().WriteFileAtomic(a, pieces).ok());
  EXPECT_EQ(*storage().Read(a), "hello world");
  ASSERT_TRUE(storage().WriteFileAtomic(a, std::string_view("replaced")).ok());
  EXPECT_EQ(*storage().Read(a), "replaced");
  ASSERT_TRUE(storage().WriteFileAtomic(JoinPath(dir_, "b"), std::string_view("")).ok());
  EXPECT_EQ(*storage().Read(JoinPath(dir_, "b")), "");
  // No temp files left behind: exactly what was written is listed.
  EXPECT_EQ(*storage().List(dir_), (std::vector<std::string>{"b", "x"}));
  EXPECT_EQ(*storage().List(JoinPath(dir_, "x")), (std::vector<std::string>{"a.bin"}));
  ASSERT_TRUE(storage().RemoveAll(JoinPath(dir_, "x")).ok());
  EXPECT_TRUE(absl::IsNotFound(storage().Read(a).status()));
  EXPECT_EQ(*storage().List(dir_), (std::vector<std::string>{"b"}));
  EXPECT_TRUE(storage().RemoveAll(JoinPath(dir_, "missing")).ok());
}

TEST_P(StorageTest, ShardRoundTripIsBitwise) {
  const FlatState state = MakeFlatState(layout_.num_params(), 1);
  const auto ranges = RankRanges(layout_, 3, /*zero=*/3);  // several ranges per shard
  const ShardContents want = MakeShard(layout_, 40, 3, 1, ranges[1], state);
  const std::string path = JoinPath(StepDir(dir_, 40), ShardFileName(1));
  absl::StatusOr<ShardFileInfo> info = WriteShard(storage(), path, want);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->rank, 1);
  EXPECT_EQ(info->file, "rank-1.shard");
  EXPECT_EQ(info->ranges, ranges[1]);
  const std::string bytes = *storage().Read(path);
  EXPECT_EQ(info->bytes, bytes.size());
  EXPECT_EQ(info->checksum, Crc64(bytes.data(), bytes.size() - 8));

  absl::StatusOr<ShardContents> got = ReadShard(storage(), path);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->step, 40);
  EXPECT_EQ(got->rank, 1);
  EXPECT_EQ(got->world, 3);
  EXPECT_EQ(got->layout_fingerprint, layout_.Fingerprint());
  EXPECT_EQ(got->num_params, layout_.num_params());
  EXPECT_EQ(got->ranges, want.ranges);
  EXPECT_TRUE(got->scalars == want.scalars);
  EXPECT_TRUE(Bitwise(got->params, want.params, 0));
  EXPECT_TRUE(Bitwise(got->m, want.m, 0));
  EXPECT_TRUE(Bitwise(got->v, want.v, 0));
}
// ---------------------------------------------------------------- resharding

TEST_P(StorageTest, SavedOnFourLoadsOnAnyWorldBitwise) {
  const FlatState state = MakeFlatState(layout_.num_params(), 11);
  for (int save_zero : {0, 3}) {
    const int64_t step = 100 + save_zero;
    ASSERT_TRUE(SaveCheckpoint(storage(), dir_, layout_, step, /*world=*/4, save_zero, state).ok());
    absl::StatusOr<Manifest> m = ReadManifest(storage(), ManifestPath(StepDir(dir_, step)));
    ASSERT_TRUE(m.ok()) << m.status();
    ASSERT_TRUE(CheckCompatible(*m, layout_).ok());
    // New world M under ZeRO-0 (one even range per rank) and ZeRO-3 (one
    // range per unit per rank): every rank gets exactly its elements.
    for (int world : {1, 2, 3, 5}) {
      for (int load_zero : {0, 3}) {
        const auto ranges = RankRanges(layout_, world, load_zero);
        for (int r = 0; r < world; ++r) {
          SCOPED_TRACE(absl::StrCat("saved zero ", save_zero, " world 4; loading zero ", load_zero,
                                    " world ", world, " rank ", r));
          absl::StatusOr<LoadedState> got =
              LoadRanges(storage(), StepDir(dir_, step), *m, ranges[r]);
          ASSERT_TRUE(got.ok()) << got.status();
          EXPECT_EQ(got->step, step);
          EXPECT_TRUE(got->scalars == Scalars(step));
          uint64_t at = 0;
          for (const FlatRange& fr : ranges[r]) {
            std::vector<float> p(got->params.begin() + at, got->params.begin() + at + fr.size());
            std::vector<float> mm(got->m.begin() + at, got->m.begin() + at + fr.size());
            std::vector<float> vv(got->v.begin() + at, got->v.begin() + at + fr.size());
            EXPECT_TRUE(Bitwise(p, state.params, fr.begin));
            EXPECT_TRUE(Bitwise(mm, state.m, fr.begin));
            EXPECT_TRUE(Bitwise(vv, state.v, fr.begin));
            at += fr.size();
          }
          EXPECT_EQ(at, got->params.size());
        }
      }
    }
    // Arbitrary ranges: empty, single elements, across shard boundaries.
    std::mt19937_64 rng(5);
    for (int i = 0; i < 50; ++i) {
      uint64_t a = rng() % (layout_.num_params() + 1), b = rng() % (layout_.num_params() + 1);
      if (a > b) std::swap(a, b);
      if (i % 10 == 0) b = a;
      absl::StatusOr<LoadedState> got = LoadRange(storage(), StepDir(dir_, step), *m, a, b);
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_EQ(got->params.size(), b - a);
      EXPECT_TRUE(Bitwise(got->params, state.params, a)) << "[" << a << ", " << b << ")";
      EXPECT_TRUE(Bitwise(got->m, state.m, a));
      EXPECT_TRUE(Bitwise(got->v, state.v, a));
      EXPECT_TRUE(got->scalars == Scalars(step));
    }
    absl::StatusOr<LoadedState> all = LoadAll(storage(), StepDir(dir_, step), *m);
    ASSERT_TRUE(all.ok()) << all.status();
    EXPECT_TRUE(Bitwise(all->params, state.params, 0));
    EXPECT_TRUE(Bitwise(all->m, state.m, 0));
    EXPECT_TRUE(Bitwise(all->v, state.v, 0));
    EXPECT_TRUE(absl::IsInvalidArgument(
        LoadRange(storage(), StepDir(dir_, step), *m, 0, layout_.num_params() + 1).status()));
  }
}

// ---------------------------------------------------------------- directory policy

TEST(StepDirNameTest, ParsesOnlyCanonicalNames) {
  EXPECT_EQ(StepDirName(120), "step-120");
  EXPECT_EQ(ParseStepDirName("step-120"), 120);
  EXPECT_EQ(ParseStepDirName("step-0"), 0);
  for (const char* bad : {"step-", "step-012", "step--1", "step-+1", "step-1x", "stepx-1",
                          "step-1.tmp", "manifest.txt"}) {
    EXPECT_FALSE(ParseStepDirName(bad).has_value()) << bad;
  }
}

enum class Corruption { kFlippedShardByte, kTruncatedShard, kMissingShard, kTruncatedManifest };

TEST_P(StorageTest, CorruptionIsDetectedAndLatestValidFallsBack) {
  const FlatState old_state = MakeFlatState(layout_.num_params(), 21);
  const FlatState new_state = MakeFlatState(layout_.num_params(), 22);
  for (Corruption kind : {Corruption::kFlippedShardByte, Corruption::kTruncatedShard,
                          Corruption::kMissingShard, Corruption::kTruncatedManifest}) {
    SCOPED_TRACE(static_cast<int>(kind));
    ASSERT_TRUE(storage().RemoveAll(dir_).ok());
    ASSERT_TRUE(SaveCheckpoint(storage(), dir_, layout_, 10, 4, 0, old_state).ok());
    ASSERT_TRUE(SaveCheckpoint(storage(), dir_, layout_, 20, 4, 3, new_state).ok());
    const std::string step20 = StepDir(dir_, 20);
    absl::StatusOr<LatestValidResult> before = LatestValid(storage(), dir_);
    ASSERT_TRUE(before.ok() && before->checkpoint.has_value());
    EXPECT_EQ(before->checkpoint->step, 20);
    EXPECT_TRUE(before->skipped.empty());

    std::string bad_file;
    switch (kind) {
      case Corruption::kFlippedShardByte:
        bad_file = JoinPath(step20, "rank-2.shard");
        FlipByte(bad_file, FileSize(bad_file) / 2);
        break;
      case Corruption::kTruncatedShard:
        bad_file = JoinPath(step20, "rank-1.shard");
        Truncate(bad_file, FileSize(bad_file) - 100);
        break;
      case Corruption::kMissingShard:
        bad_file = JoinPath(step20, "rank-3.shard");
        ASSERT_TRUE(storage().RemoveAll(bad_file).ok());
        break;
      case Corruption::kTruncatedManifest:
        bad_file = ManifestPath(step20);
        Truncate(bad_file, FileSize(bad_file) * 2 / 3);
        break;
    }

    // Loading step 20 directly fails with DataLoss naming the file.
    absl::Status load_status;
    absl::StatusOr<Manifest> m = ReadManifest(storage(), ManifestPath(step20));
    if (kind == Corruption::kTruncatedManifest) {
      load_status = m.status();
    } else {
      ASSERT_TRUE(m.ok()) << m.status();
      load_status = LoadAll(storage(), step20, *m).status();
    }
    EXPECT_TRUE(absl::IsDataLoss(load_status)) << load_status;
    EXPECT_THAT(std::string(load_status.message()), HasSubstr(bad_file));

    // LatestValid falls back to step 10 and says why it skipped step 20.
    absl::StatusOr<LatestValidResult> latest = LatestValid(storage(), dir_);
    ASSERT_TRUE(latest.ok()) << latest.status();
    ASSERT_TRUE(latest->checkpoint.has_value());
    EXPECT_EQ(latest->checkpoint->step, 10);
    ASSERT_EQ(latest->skipped.size(), 1u);
    EXPECT_EQ(latest->skipped[0].step_dir, step20);
    EXPECT_TRUE(absl::IsDataLoss(latest->skipped[0].reason)) << latest->skipped[0].reason;
    EXPECT_THAT(std::string(latest->skipped[0].reason.message()), HasSubstr(bad_file));
    absl::StatusOr<LoadedState> loaded =
        LoadAll(storage(), latest->checkpoint->step_dir, latest->checkpoint->manifest);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_TRUE(Bitwise(loaded->params, old_state.params, 0));

    // A corrupt manifest also drops the step from the committed list.
    absl::StatusOr<std::vector<CommittedCheckpoint>> committed = ListCommitted(storage(), dir_);
    ASSERT_TRUE(committed.ok());
    EXPECT_EQ(committed->size(), kind == Corruption::kTruncatedManifest ? 1u : 2u);
  }
}

TEST_P(StorageTest, ShardReplacedByAnotherValidShardIsDetected) {
  // A shard that verifies by itself but is not the one the manifest names
  // (e.g. a stale rank rewrote step 20 after the commit) is still rejected.
  const FlatState state = MakeFlatState(layout_.num_params(), 23);
  ASSERT_TRUE(SaveCheckpoint(storage(), dir_, layout_, 20, 2, 0, state).ok());
  const FlatState other = MakeFlatState(layout_.num_params(), 24);
  const std::string path = JoinPath(StepDir(dir_, 20), ShardFileName(1));
  ASSERT_TRUE(
      WriteShard(storage(), path, MakeShard(layout_, 20, 2, 1, RankRanges(layout_, 2, 0)[1], other))
          .ok());
  absl::StatusOr<Manifest> m = ReadManifest(storage(), ManifestPath(StepDir(dir_, 20)));
  ASSERT_TRUE(m.ok());
  absl::Status s = LoadAll(storage(), StepDir(dir_, 20), *m).status();
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(path));
}

TEST_P(StorageTest, DirectoryWithoutManifestIsNeverCommitted) {
  const FlatState state = MakeFlatState(layout_.num_params(), 31);
  absl::StatusOr<LatestValidResult> none = LatestValid(storage(), dir_);  // dir absent
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->checkpoint.has_value());
  EXPECT_TRUE(ListCommitted(storage(), dir_)->empty());

  ASSERT_TRUE(SaveCheckpoint(storage(), dir_, layout_, 10, 2, 0, state).ok());
  ASSERT_TRUE(SaveCheckpoint(storage(), dir_, layout_, 30, 2, 0, state, /*commit=*/false).ok());
  // Stray entries that are not step directories are ignored too.
  ASSERT_TRUE(storage().WriteFileAtomic(JoinPath(dir_, "step-x/junk"), std::string_view("j")).ok());
  ASSERT_TRUE(storage().WriteFileAtomic(JoinPath(dir_, "notes.txt"), std::string_view("n")).ok());

  absl::StatusOr<std::vector<CommittedCheckpoint>> committed = ListCommitted(storage(), dir_);
  ASSERT_TRUE(committed.ok()) << committed.status();
  ASSERT_EQ(committed->size(), 1u);
  EXPECT_EQ((*committed)[0].step, 10);
  absl::StatusOr<LatestValidResult> latest = LatestValid(storage(), dir_);
  ASSERT_TRUE(latest.ok()) << latest.status();
  ASSERT_TRUE(latest->checkpoint.has_value());
  EXPECT_EQ(latest->checkpoint->step, 10);
  ASSERT_EQ(latest->skipped.size(), 1u);
  EXPECT_EQ(latest->skipped[0].step_dir, StepDir(dir_, 30));
  EXPECT_TRUE(absl::IsNotFound(latest->skipped[0].reason)) << latest->skipped[0].reason;
}

TEST_P(StorageTest, RemoveStepDirsBelowRemovesOlderStepsCommittedOrNot) {
  const FlatState state = MakeFlatState(layout_.num_params(), 41);
  ASSERT_TRUE(SaveCheckpoint(storage(), dir_, layout_, 5, 2, 0, state, /*commit=*/false).ok());
  for (int64_t step : {10, 20, 30, 40, 50}) {
    ASSERT_TRUE(SaveCheckpoint(storage(), dir_, layout_, step, 2, 0, state).ok());
  }
  ASSERT_TRUE(SaveCheckpoint(storage(), dir_, layout_, 35, 2, 0, state, /*commit=*/false).ok());
  ASSERT_TRUE(SaveCheckpoint(storage(), dir_, layout_, 60, 2, 0, state, /*commit=*/false).ok());
  ASSERT_TRUE(storage().WriteFileAtomic(JoinPath(dir_, "final.weights"), "w").ok());

  absl::StatusOr<std::vector<std::string>> removed = RemoveStepDirsBelow(storage(), dir_, 40);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(*removed,
            (std::vector<std::string>{StepDir(dir_, 5), StepDir(dir_, 10), StepDir(dir_, 20),
                                      StepDir(dir_, 30), StepDir(dir_, 35)}));
  // Kept: step 40 and newer, committed or not, and files that are no step.
  EXPECT_EQ(*storage().List(dir_),
            (std::vector<std::string>{"final.weights", "step-40", "step-50", "step-60"}));
  absl::StatusOr<std::vector<CommittedCheckpoint>> committed = ListCommitted(storage(), dir_);
  ASSERT_TRUE(committed.ok());
  ASSERT_EQ(committed->size(), 2u);
  EXPECT_EQ((*committed)[0].step, 50);
  EXPECT_EQ((*committed)[1].step, 40);
  EXPECT_TRUE(LoadAll(storage(), (*committed)[1].step_dir, (*committed)[1].manifest).ok());
  // Idempotent; an absent dir removes nothing.
  EXPECT_TRUE(RemoveStepDirsBelow(storage(), dir_, 40)->empty());
  EXPECT_TRUE(RemoveStepDirsBelow(storage(), JoinPath(dir_, "absent"), 100)->empty());
}

TEST(FakeStorageTest, WriteFailureMidSaveLeavesNothingVisible) {
  FakeCheckpointStorage storage;
  const model::ParamLayout layout(SmallConfig());
  const FlatState state = MakeFlatState(layout.num_params(), 51);
  ASSERT_TRUE(SaveCheckpoint(storage, "/c", layout, 10, 4, 0, state).ok());
  // Writes of step 20: rank-0..rank-3 shards, then the manifest. Fail the 3rd
  // (rank 2's shard), then separately the 5th (the manifest).
  for (int fail_at : {3, 5}) {
    SCOPED_TRACE(fail_at);
    ASSERT_TRUE(storage.RemoveAll(StepDir("/c", 20)).ok());
    storage.FailNthWrite(fail_at);
    const int before = storage.write_count();
    absl::Status s = SaveCheckpoint(storage, "/c", layout, 20, 4, 0, state);
    EXPECT_TRUE(absl::IsUnavailable(s)) << s;
    EXPECT_EQ(storage.write_count() - before, fail_at);
    const std::string failed = fail_at == 3 ? JoinPath(StepDir("/c", 20), "rank-2.shard")
                                            : ManifestPath(StepDir("/c", 20));
    EXPECT_THAT(std::string(s.message()), HasSubstr(failed));
    // The half-written temp file is there; the file itself never appears.
    EXPECT_FALSE(storage.Exists(failed));
    EXPECT_TRUE(absl::IsNotFound(storage.Read(failed).status()));
    EXPECT_TRUE(storage.Exists(failed + ".tmp"));
    EXPECT_FALSE(storage.Exists(ManifestPath(StepDir("/c", 20))));
    absl::StatusOr<std::vector<CommittedCheckpoint>> committed = ListCommitted(storage, "/c");
    ASSERT_TRUE(committed.ok());
    ASSERT_EQ(committed->size(), 1u);
    EXPECT_EQ((*committed)[0].step, 10);
    absl::StatusOr<LatestValidResult> latest = LatestValid(storage, "/c");
    ASSERT_TRUE(latest.ok() && latest->checkpoint.has_value());
    EXPECT_EQ(latest->checkpoint->step, 10);
  }
  // Later writes succeed again.
  EXPECT_TRUE(SaveCheckpoint(storage, "/c", layout, 20, 4, 0, state).ok());
  EXPECT_EQ(LatestValid(storage, "/c")->checkpoint->step, 20);
}

TEST(FakeStorageTest, CorruptionInjectors) {
  FakeCheckpointStorage storage;
  ASSERT_TRUE(storage.WriteFileAtomic("/a/f", std::string_view("abcdef")).ok());
  ASSERT_TRUE(storage.FlipByte("/a/f", 1).ok());
  EXPECT_EQ(*storage.Read("/a/f"), std::string("a") + static_cast<char>(~'b') + "cdef");
  ASSERT_TRUE(storage.Truncate("/a/f", 2).ok());
  EXPECT_EQ(storage.Read("/a/f")->size(), 2u);
  EXPECT_TRUE(absl::IsInvalidArgument(storage.FlipByte("/a/f", 2)));
  EXPECT_TRUE(absl::IsInvalidArgument(storage.Truncate("/a/f", 3)));
  EXPECT_TRUE(absl::IsNotFound(storage.FlipByte("/a/g", 0)));
}

TEST(FileStorageTest, FailedWriteLeavesTargetAndNoTempFile) {
  std::string tmpl = JoinPath(::testing::TempDir(), "checkpoint_fs.XXXXXX");
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
  FileCheckpointStorage storage;
  // The target is a non-empty directory: the rename at the end must fail.
  const std::string target = JoinPath(tmpl, "target");
  ASSERT_TRUE(storage.WriteFileAtomic(JoinPath(target, "inside"), std::string_view("x")).ok());
  absl::Status s = storage.WriteFileAtomic(target, std::string_view("new contents"));
  // A directory where the file should be: no retry renames over it.
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_EQ(StorageFaultOf(s), StorageFault::kNotADirectory);
  EXPECT_THAT(std::string(s.message()), HasSubstr(target));
  EXPECT_EQ(*storage.List(tmpl), (std::vector<std::string>{"target"}));  // no temp left
  EXPECT_EQ(*storage.Read(JoinPath(target, "inside")), "x");
  std::filesystem::remove_all(tmpl);
}

TEST(FileStorageTest, FileWhereTheDirectoryShouldBeIsNotADirectory) {
  std::string tmpl = JoinPath(::testing::TempDir(), "checkpoint_fs.XXXXXX");
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
  FileCheckpointStorage storage;
  const std::string file = JoinPath(tmpl, "ck");
  ASSERT_TRUE(storage.WriteFileAtomic(file, std::string_view("x")).ok());
  absl::Status s = storage.WriteFileAtomic(JoinPath(StepDir(file, 10), "rank-0.shard"),
                                           std::string_view("shard"));
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_EQ(StorageFaultOf(s), StorageFault::kNotADirectory);
  EXPECT_EQ(StorageCause(s), "Not a directory");
  EXPECT_EQ(StorageFaultOf(MakeDirectories(file)), StorageFault::kNotADirectory);
  // Free space is asked of the nearest directory that exists.
  absl::StatusOr<int64_t> free = storage.FreeBytes(JoinPath(tmpl, "not/made/yet"));
  ASSERT_TRUE(free.ok()) << free.status();
  EXPECT_GT(*free, 0);
  EXPECT_TRUE(storage.RemoveAll(JoinPath(StepDir(file, 10), "x")).ok());  // nothing to remove
  std::filesystem::remove_all(tmpl);
}

// A rank checks its volume before writing: a shard that cannot fit fails
// with what it needs and what is free, and nothing is written (no partial
// file fills the disk further).
TEST(FakeStorageTest, ShardWithoutRoomFailsBeforeWritingSayingWhatItNeeds) {
  FakeCheckpointStorage storage;
  const model::ParamLayout layout(SmallConfig());
  const FlatState state = MakeFlatState(layout.num_params(), 3);
  const auto ranges = RankRanges(layout, 1, 0);
  const ShardContents shard = MakeShard(layout, 10, 1, 0, ranges[0], state);
  const size_t bytes = EncodeShard(shard)->size();
  storage.set_free_bytes(1000);
  const std::string path = JoinPath(StepDir("/c", 10), ShardFileName(0));
  absl::StatusOr<ShardFileInfo> info = WriteShard(storage, path, shard);
  EXPECT_TRUE(absl::IsResourceExhausted(info.status())) << info.status();
  EXPECT_EQ(StorageFaultOf(info.status()), StorageFault::kNoSpace);
  EXPECT_EQ(StorageCause(info.status()),
            "needs " + FormatStorageBytes(int64_t(bytes)) + ", 1000 B free");
  EXPECT_THAT(std::string(info.status().message()), HasSubstr(path));
  EXPECT_EQ(storage.write_count(), 0);
  storage.set_free_bytes(int64_t(bytes));  // exactly enough
  EXPECT_TRUE(WriteShard(storage, path, shard).ok());
  // A volume that refuses every write (read-only) says so the same way.
  storage.FailWritesWith(ErrnoStorageError("cannot create", path, EROFS));
  absl::StatusOr<ShardFileInfo> ro = WriteShard(storage, path, shard);
  EXPECT_EQ(StorageFaultOf(ro.status()), StorageFault::kReadOnly);
  storage.FailWritesWith(absl::OkStatus());
  EXPECT_TRUE(WriteShard(storage, path, shard).ok());
}

}  // namespace
}  // namespace shardtrain::checkpoint
