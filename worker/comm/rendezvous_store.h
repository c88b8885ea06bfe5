// RendezvousStore: the small key/value interface collectives bootstrap from
// (Gloo addresses, NCCL unique ids, split colours, failure reports).
//
// Production code implements it over the coordinator's KvSet / KvGet(wait) /
// KvAdd RPCs, namespaced by job and generation. This header also provides
//   * InMemoryStore: one process, many threads (unit tests);
//   * FileStore: a directory shared by processes on one host (multi-process
//     tests, the SIGKILL test, the benchmark);
//   * GlooStoreAdapter: exposes a RendezvousStore as a gloo::rendezvous::Store
//     under a key prefix (see gloo_store_adapter.h).
//
// Thread safety: every implementation here is safe to call from many threads.
#ifndef SHARDTRAIN_WORKER_COMM_RENDEZVOUS_STORE_H_
#define SHARDTRAIN_WORKER_COMM_RENDEZVOUS_STORE_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace shardtrain::comm {

class RendezvousStore {
 public:
  virtual ~RendezvousStore() = default;

  // Stores `value` (arbitrary bytes) under `key`, replacing any old value.
  // Errors: UNAVAILABLE / INTERNAL when the backing store cannot be written.
  virtual absl::Status Set(absl::string_view key, absl::string_view value) = 0;

  // Returns the value of `key`, blocking until it exists.
  // Errors: DEADLINE_EXCEEDED (message names the key) if it does not appear
  // within `timeout`; a zero timeout checks exactly once.
  virtual absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) = 0;

  // Atomically adds `delta` to the integer stored under `key` (missing = 0)
  // and returns the new value. The value is stored as decimal ASCII, so Get
  // on the same key returns e.g. "3".
  // Errors: INVALID_ARGUMENT if the existing value is not an integer.
  virtual absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) = 0;
};

// In-process store for thread-based tests. Get waits on a condition variable.
class InMemoryStore final : public RendezvousStore {
 public:
  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string, std::less<>> data_ ABSL_GUARDED_BY(mu_);
};

// Store in a directory, one file per key, usable across processes on one
// host. Set writes a temp file and renames it (readers never see a partial
// value); Add serialises through flock(2) on a per-key lock file; Get polls
// every 2 ms. Keys may contain any characters ('/' and '%' are escaped).
class FileStore final : public RendezvousStore {
 public:
  // `dir` must exist and be writable.
  explicit FileStore(std::string dir);

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;

 private:
  std::string PathFor(absl::string_view key) const;
  std::string dir_;
};

}  // namespace shardtrain::comm

#endif  // SHARDTRAIN_WORKER_COMM_RENDEZVOUS_STORE_H_
