// Directory policy of a job's checkpoint dir:
//   <dir>/step-<N>/rank-<R>.shard ...   written by every rank
//   <dir>/step-<N>/manifest.txt         written last, by rank 0
// A step directory is *complete* iff its manifest exists and parses
// (ReadManifest) with step == N: rank 0 writes it only once every rank
// reported its shard. One without (a save cut short, e.g. a rank SIGKILLed
// mid-write, or a rank that failed) is never loaded. The job's *committed*
// checkpoints are those the coordinator recorded after the manifest was
// written (what recovery resumes from); the functions here, which see only
// files, call complete step directories "committed".
//
// Thread-compatible; concurrent writers into the same step directory are the
// caller's business (rank 0 writes each manifest).
#ifndef SHARDTRAIN_WORKER_CHECKPOINT_DIRECTORY_H_
#define SHARDTRAIN_WORKER_CHECKPOINT_DIRECTORY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/checkpoint/manifest.h"
#include "worker/checkpoint/storage.h"

namespace shardtrain::checkpoint {

// "step-N" (no zero padding) and JoinPath(dir, "step-N").
std::string StepDirName(int64_t step);
std::string StepDir(const std::string& dir, int64_t step);
// The N of a name in exactly StepDirName's form; nullopt otherwise.
std::optional<int64_t> ParseStepDirName(const std::string& name);

struct CommittedCheckpoint {
  int64_t step = 0;
  std::string step_dir;  // JoinPath(dir, StepDirName(step))
  Manifest manifest;
};

// Committed checkpoints under `dir`, newest (highest step) first. Shards are
// not read. An absent `dir` gives an empty list; Unavailable on I/O errors.
absl::StatusOr<std::vector<CommittedCheckpoint>> ListCommitted(CheckpointStorage& storage,
                                                               const std::string& dir);

// Removes every step directory under `dir` whose step is below `step`,
// committed or not: what rank 0 does with the oldest step the coordinator
// still records (CommitCheckpoint's keep_from_step). Oldest first, and a
// manifest before the rest of its directory, so a removal cut short keeps
// the newest ones and never leaves a manifest whose shards are gone. Does
// not read manifests or shards. Returns the removed step directories,
// oldest first. Unavailable on I/O errors.
absl::StatusOr<std::vector<std::string>> RemoveStepDirsBelow(CheckpointStorage& storage,
                                                             const std::string& dir, int64_t step);

struct SkippedCheckpoint {
  std::string step_dir;
  absl::Status reason;  // NotFound: no manifest (uncommitted); DataLoss: corrupt, naming the file
};

struct LatestValidResult {
  std::optional<CommittedCheckpoint> checkpoint;  // nullopt: nothing loadable
  // Step directories newer than `checkpoint` (all of them if none), newest
  // first, with why each was passed over.
  std::vector<SkippedCheckpoint> skipped;
};

// The newest committed checkpoint whose shards all verify (VerifyShards:
// reads every shard of each candidate, newest first, until one passes).
// Unavailable on I/O errors other than missing or corrupt files.
absl::StatusOr<LatestValidResult> LatestValid(CheckpointStorage& storage, const std::string& dir);

}  // namespace shardtrain::checkpoint

#endif  // SHARDTRAIN_WORKER_CHECKPOINT_DIRECTORY_H_
