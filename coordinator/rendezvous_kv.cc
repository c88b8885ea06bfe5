#include "coordinator/rendezvous_kv.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace shardtrain::coordinator {

void RendezvousKv::Set(const std::string& job, int64_t generation, const std::string& key,
                       std::string value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    data_[{{job, generation}, key}] = std::move(value);
  }
  cv_.notify_all();
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
      return absl::NotFoundError(absl::StrCat("rendezvous key '", key, "' of job ", job,
                                              " generation ", generation, " is not set"));
    }
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && !data_.count(k) &&
        !shutdown_) {
      return absl::DeadlineExceededError(absl::StrCat("rendezvous key '", key, "' of job ", job,
                                                      " generation ", generation,
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
    std::string& v = data_[{{job, generation}, key}];
    int64_t current = 0;
    if (!v.empty() && !absl::SimpleAtoi(v, &current)) {
      return absl::InvalidArgumentError(
          absl::StrCat("rendezvous key '", key, "' holds a non-integer value"));
    }
    sum = current + delta;
    v = absl::StrCat(sum);
  }
  cv_.notify_all();
  return sum;
}

void RendezvousKv::DropJob(const std::string& job) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = data_.lower_bound({{job, INT64_MIN}, ""});
  while (it != data_.end() && it->first.first.first == job) it = data_.erase(it);
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
