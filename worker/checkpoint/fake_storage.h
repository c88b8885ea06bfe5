// FakeCheckpointStorage: an in-memory CheckpointStorage with fault injection
// for tests (a failed write, a truncated or bit-flipped file).
//
// Directories are implicit: a directory exists while some file lies under it.
// Thread-safe.
#ifndef SHARDTRAIN_WORKER_CHECKPOINT_FAKE_STORAGE_H_
#define SHARDTRAIN_WORKER_CHECKPOINT_FAKE_STORAGE_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "worker/checkpoint/storage.h"

namespace shardtrain::checkpoint {

class FakeCheckpointStorage : public CheckpointStorage {
 public:
  using CheckpointStorage::WriteFileAtomic;
  absl::Status WriteFileAtomic(const std::string& path,
                               absl::Span<const std::string_view> pieces) override;
  absl::StatusOr<std::string> Read(const std::string& path) override;
  absl::StatusOr<std::vector<std::string>> List(const std::string& dir) override;
  absl::Status RemoveAll(const std::string& path) override;
  // set_free_bytes's value (default: practically unlimited).
  absl::StatusOr<int64_t> FreeBytes(const std::string& path) override;

  // Makes the n-th WriteFileAtomic call from now fail (n = 1: the next one)
  // with Unavailable, as a crash or a full disk mid-write would: it leaves
  // "<path>.tmp" holding the first half of the bytes and does not touch
  // <path>. Later writes succeed again.
  void FailNthWrite(int n);

  // While `error` is not OK, every WriteFileAtomic fails with it and writes
  // nothing (a full, read-only or unwritable volume); OK stops it.
  void FailWritesWith(absl::Status error);

  // What FreeBytes answers from now on.
  void set_free_bytes(int64_t bytes);

  // Corrupts an existing file in place (bypassing atomicity, like a bad disk).
  // NotFound if there is no such file; InvalidArgument when out of range.
  absl::Status Truncate(const std::string& path, size_t size);
  absl::Status FlipByte(const std::string& path, size_t offset);

  // Number of WriteFileAtomic calls so far (failed ones included).
  int write_count() const;
  // Whether `path` is a file.
  bool Exists(const std::string& path) const;

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, std::string> files_ ABSL_GUARDED_BY(mu_);
  int writes_ ABSL_GUARDED_BY(mu_) = 0;
  int fail_at_ ABSL_GUARDED_BY(mu_) = 0;  // write number that fails; 0 = none
  absl::Status fail_all_ ABSL_GUARDED_BY(mu_);
  int64_t free_bytes_ ABSL_GUARDED_BY(mu_) = int64_t{1} << 50;
};

}  // namespace shardtrain::checkpoint

#endif  // SHARDTRAIN_WORKER_CHECKPOINT_FAKE_STORAGE_H_
