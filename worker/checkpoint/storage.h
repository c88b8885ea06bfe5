// CheckpointStorage: every filesystem access of the checkpoint code goes
// through this small interface (leveldb's Env), so tests can inject faults
// (FakeCheckpointStorage in fake_storage.h) and the real implementation stays
// a thin adapter.
//
// Paths are '/'-separated strings; a directory exists when it holds files.
#ifndef SHARDTRAIN_WORKER_CHECKPOINT_STORAGE_H_
#define SHARDTRAIN_WORKER_CHECKPOINT_STORAGE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace shardtrain::checkpoint {

class CheckpointStorage {
 public:
  virtual ~CheckpointStorage() = default;

  // Makes `path` hold exactly the concatenation of `pieces`, atomically: a
  // reader sees either the old file (or none) or the complete new one, also
  // across a crash. Creates missing parent directories. On error `path` is
  // unchanged and no temporary file is left. I/O errors name the path and
  // carry their StorageFault (common/storage_fault.h): RESOURCE_EXHAUSTED for
  // a full disk, FAILED_PRECONDITION for a read-only, unwritable or
  // not-a-directory path, UNAVAILABLE otherwise.
  virtual absl::Status WriteFileAtomic(const std::string& path,
                                       absl::Span<const std::string_view> pieces) = 0;

  // The whole content of a file. NotFound if it does not exist; Unavailable
  // on other I/O errors. Both name the path.
  virtual absl::StatusOr<std::string> Read(const std::string& path) = 0;

  // Names (not paths) of the entries directly inside `dir`, files and
  // directories alike, sorted. NotFound if `dir` does not exist.
  virtual absl::StatusOr<std::vector<std::string>> List(const std::string& dir) = 0;

  // Removes a file or a whole directory tree. OK if `path` does not exist.
  virtual absl::Status RemoveAll(const std::string& path) = 0;

  // Bytes a write under `path` (a file or directory, existing or not) may
  // still use. An error when that cannot be asked.
  virtual absl::StatusOr<int64_t> FreeBytes(const std::string& path) = 0;

  // Convenience: WriteFileAtomic with one piece.
  absl::Status WriteFileAtomic(const std::string& path, std::string_view bytes) {
    return WriteFileAtomic(path, absl::MakeConstSpan(&bytes, 1));
  }
};

// The local (or network-mounted POSIX) filesystem. WriteFileAtomic writes
// <path>.tmp.<pid>.<n>, fsyncs it, renames it over <path> and fsyncs the
// directory (and the parents of directories it had to create); the temp file
// is removed on failure. Thread-safe (no state).
class FileCheckpointStorage : public CheckpointStorage {
 public:
  using CheckpointStorage::WriteFileAtomic;
  absl::Status WriteFileAtomic(const std::string& path,
                               absl::Span<const std::string_view> pieces) override;
  absl::StatusOr<std::string> Read(const std::string& path) override;
  absl::StatusOr<std::vector<std::string>> List(const std::string& dir) override;
  absl::Status RemoveAll(const std::string& path) override;
  // statvfs of `path` or its nearest existing ancestor (FreeBytesAt).
  absl::StatusOr<int64_t> FreeBytes(const std::string& path) override;
};

// Before writing `bytes` to `path`: RESOURCE_EXHAUSTED (StorageFault
// kNoSpace, cause "needs 10.2 MiB, 3.1 MiB free"), naming `path`, when
// storage.FreeBytes says there is less room than that, so a write that
// cannot fit fails before it half-fills the disk. OK when the free space is
// unknown (the write then says what is wrong).
absl::Status CheckRoomFor(CheckpointStorage& storage, const std::string& path, uint64_t bytes);

// Creates `dir` and its missing parents, fsyncing the parent of each one it
// created. A StorageError naming the directory when it cannot (a file where
// a directory must be is kNotADirectory).
absl::Status MakeDirectories(const std::string& dir);

// Joins two path parts with exactly one '/'.
std::string JoinPath(const std::string& a, const std::string& b);

}  // namespace shardtrain::checkpoint

#endif  // SHARDTRAIN_WORKER_CHECKPOINT_STORAGE_H_
