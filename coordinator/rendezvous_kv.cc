#include "coordinator/rendezvous_kv.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/text_bounds.h"

namespace shardtrain::coordinator {

absl::Status RendezvousKv::PutLocked(const Key& k, std::string value) {
  if (value.size() > limits_.max_value_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "value: ", value.size(), " bytes, above the limit of ", limits_.max_value_bytes));
  }
  const std::string& job = k.first.first;
  Usage& u = usage_[job];
  auto it = data_.find(k);
  const size_t old_bytes = it == data_.end() ? 0 : k.second.size() + it->second.size();
  const size_t new_bytes = k.second.size() + value.size();
  const size_t keys = u.keys + (it == data_.end() ? 1 : 0);
  const size_t bytes = u.bytes - old_bytes + new_bytes;
  if (keys > limits_.max_keys_per_job || bytes > limits_.max_bytes_per_job) {
    if (u.keys == 0) usage_.erase(job);
    return absl::ResourceExhaustedError(absl::StrCat("rendezvous store of job ", Truncate(job, 64),
                                                     " is full (limits: ", limits_.max_keys_per_job,
                                                     " keys, ", limits_.max_bytes_per_job,
                                                     " bytes)"));
  }
  u.keys = keys;
  u.bytes = bytes;
  data_[k] = std::move(value);
  return absl::OkStatus();
}

absl::Status RendezvousKv::Set(const std::string& job, int64_t generation, const std::string& key,
                               std::string value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto s = PutLocked({{job, generation}, key}, std::move(value)); !s.ok()) return s;
  }
  cv_.notify_all();
  return absl::OkStatus();
}

absl::StatusOr<std::string> RendezvousKv::Get(const std::string& job, int64_t generation,
                                              const std::string& key, int64_t wait_ms) {
  const Key k{{job, generation}, key};
  wait_ms = std::clamp<int64_t>(wait_ms, 0, kMaxWaitMs);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    if (shutdown_) return absl::UnavailableError("rendezvous store is shutting down");
    auto it = data_.find(k);
    if (it != data_.end()) return it->second;
    if (wait_ms == 0) {
      return absl::NotFoundError(absl::StrCat("rendezvous key '", Truncate(key), "' of job ", job,
                                              " generation ", generation, " is not set"));
    }
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && !data_.count(k) &&
        !shutdown_) {
      return absl::DeadlineExceededError(absl::StrCat("rendezvous key '", Truncate(key),
                                                      "' of job ", job, " generation ", generation,
                                                      " was not set within ", wait_ms, " ms"));
    }
  }
}

absl::StatusOr<int64_t> RendezvousKv::Add(const std::string& job, int64_t generation,
                                          const std::string& key, int64_t delta) {
  int64_t sum = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutdown_) return absl::UnavailableError("rendezvous store is shutting down");
    const Key k{{job, generation}, key};
    auto it = data_.find(k);
    int64_t current = 0;
    if (it != data_.end() && !it->second.empty() && !absl::SimpleAtoi(it->second, &current)) {
      return absl::InvalidArgumentError(
          absl::StrCat("rendezvous key '", Truncate(key), "' holds a non-integer value"));
    }
    if (__builtin_add_overflow(current, delta, &sum)) {
      return absl::OutOfRangeError(absl::StrCat("rendezvous key '", Truncate(key), "': ", current,
                                                " + ", delta, " overflows int64"));
    }
    if (auto s = PutLocked(k, absl::StrCat(sum)); !s.ok()) return s;
  }
  cv_.notify_all();
  return sum;
}

void RendezvousKv::DropJob(const std::string& job) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = data_.lower_bound({{job, INT64_MIN}, ""});
  while (it != data_.end() && it->first.first.first == job) it = data_.erase(it);
  usage_.erase(job);
}

void RendezvousKv::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_ = true;
  }
  cv_.notify_all();
}

size_t RendezvousKv::Size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return data_.size();
}

}  // namespace shardtrain::coordinator
