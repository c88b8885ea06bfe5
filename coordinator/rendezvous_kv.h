// The rendezvous key-value store workers bootstrap their collectives with
// (Gloo store keys, NCCL unique ids). Keys live in a namespace per
// (job, generation): a re-ganged job starts from an empty namespace, and a
// job's namespaces are dropped when it ends. Not durable: a generation that
// outlives a coordinator restart re-rendezvous through the worker's retry.
//
// Thread-safe. Get may block (bounded by its wait).
#ifndef SHARDTRAIN_COORDINATOR_RENDEZVOUS_KV_H_
#define SHARDTRAIN_COORDINATOR_RENDEZVOUS_KV_H_

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace shardtrain::coordinator {

// Bounds per job (over all its generations), so that no client can grow the
// coordinator's memory without limit. Gloo's full-mesh rendezvous stores one
// value per rank of ~100 bytes per peer: 1024 ranks need ~100 KiB each.
struct KvLimits {
  size_t max_value_bytes = 1 << 20;     // one value
  size_t max_keys_per_job = 64 * 1024;  // keys
  size_t max_bytes_per_job = 64 << 20;  // keys and values together
};

class RendezvousKv {
 public:
  // Longest wait a single Get may ask for.
  static constexpr int64_t kMaxWaitMs = 10 * 60 * 1000;

  RendezvousKv() : RendezvousKv(KvLimits()) {}
  explicit RendezvousKv(KvLimits limits) : limits_(limits) {}

  // Stores the value. INVALID_ARGUMENT for a value above max_value_bytes,
  // RESOURCE_EXHAUSTED when the job would exceed its keys or bytes.
  absl::Status Set(const std::string& job, int64_t generation, const std::string& key,
                   std::string value);
  // The value of `key`. Absent: with wait_ms == 0 NOT_FOUND at once,
  // otherwise blocks up to wait_ms and then DEADLINE_EXCEEDED naming the key.
  // UNAVAILABLE when the store shuts down while waiting.
  absl::StatusOr<std::string> Get(const std::string& job, int64_t generation,
                                  const std::string& key, int64_t wait_ms);
  // Adds delta to the integer stored at key (absent = 0) and returns the sum.
  // INVALID_ARGUMENT when the stored value is not an integer, OUT_OF_RANGE
  // when the sum would overflow int64 (the value is left unchanged),
  // RESOURCE_EXHAUSTED as Set.
  absl::StatusOr<int64_t> Add(const std::string& job, int64_t generation, const std::string& key,
                              int64_t delta);
  // Forgets every generation of `job`.
  void DropJob(const std::string& job);
  // Wakes every waiter with UNAVAILABLE; later calls fail likewise.
  void Shutdown();
  // Keys held, over all namespaces (for metrics and tests).
  size_t Size() const;

 private:
  using Key = std::pair<std::pair<std::string, int64_t>, std::string>;
  struct Usage {
    size_t keys = 0;
    size_t bytes = 0;
  };
  // Stores value at k, keeping usage_ and the limits; requires mu_.
  absl::Status PutLocked(const Key& k, std::string value);

  const KvLimits limits_;
  mutable std::mutex mu_;
  std::map<std::string, Usage> usage_;  // GUARDED_BY(mu_), by job
  std::condition_variable cv_;
  std::map<Key, std::string> data_;  // GUARDED_BY(mu_)
  bool shutdown_ = false;            // GUARDED_BY(mu_)
};

}  // namespace shardtrain::coordinator

#endif  // SHARDTRAIN_COORDINATOR_RENDEZVOUS_KV_H_
