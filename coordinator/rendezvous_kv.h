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

class RendezvousKv {
 public:
  // Longest wait a single Get may ask for.
  static constexpr int64_t kMaxWaitMs = 10 * 60 * 1000;

  void Set(const std::string& job, int64_t generation, const std::string& key, std::string value);
  // The value of `key`. Absent: with wait_ms == 0 NOT_FOUND at once,
  // otherwise blocks up to wait_ms and then DEADLINE_EXCEEDED naming the key.
  // UNAVAILABLE when the store shuts down while waiting.
  absl::StatusOr<std::string> Get(const std::string& job, int64_t generation,
                                  const std::string& key, int64_t wait_ms);
  // Adds delta to the integer stored at key (absent = 0) and returns the sum.
  // INVALID_ARGUMENT when the stored value is not an integer.
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
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<Key, std::string> data_;  // GUARDED_BY(mu_)
  bool shutdown_ = false;            // GUARDED_BY(mu_)
};

}  // namespace shardtrain::coordinator

#endif  // SHARDTRAIN_COORDINATOR_RENDEZVOUS_KV_H_
