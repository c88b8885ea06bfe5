#include "coordinator/etcd_election.h"

#include <chrono>
#include <iostream>

#include "absl/strings/str_cat.h"

namespace shardtrain::coordinator {

absl::StatusOr<std::unique_ptr<EtcdLeadership>> EtcdLeadership::Create(const EtcdOptions& options,
                                                                       std::string address,
                                                                       int64_t ttl_s) {
  if (ttl_s < 1) return absl::InvalidArgumentError("the leader lease's TTL must be >= 1 s");
  absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Create(options);
  if (!client.ok()) return client.status();
  absl::StatusOr<int64_t> lease = (*client)->GrantLease(ttl_s);
  if (!lease.ok()) return lease.status();
  return std::unique_ptr<EtcdLeadership>(
      new EtcdLeadership(*std::move(client), std::move(address), ttl_s, *lease));
}

EtcdLeadership::EtcdLeadership(std::unique_ptr<EtcdClient> client, std::string address,
                               int64_t ttl_s, int64_t lease)
    : client_(std::move(client)),
      address_(std::move(address)),
      election_(client_->options().prefix + "leader"),
      ttl_s_(ttl_s),
      lease_(lease) {
  renewer_ = std::thread([this] { Renew(); });
}

EtcdLeadership::~EtcdLeadership() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  renewer_.join();
  if (!lost_) client_->RevokeLease(lease_).IgnoreError();  // the next one need not wait a TTL
}

void EtcdLeadership::Renew() {
  using Clock = std::chrono::steady_clock;
  auto renewed = Clock::now();
  const auto period = std::chrono::milliseconds(ttl_s_ * 1000 / 3);
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, period, [&] { return stopping_.load(); })) {
    lock.unlock();
    absl::StatusOr<int64_t> ttl = client_->KeepAlive(lease_);
    const auto now = Clock::now();
    lock.lock();
    if (ttl.ok() && *ttl > 0) {
      renewed = now;
      continue;
    }
    std::string why;
    if (ttl.ok()) {
      why = absl::StrCat("the leader lease ", lease_, " had expired when it was renewed");
    } else if (now - renewed > std::chrono::seconds(ttl_s_)) {
      why = absl::StrCat("the leader lease could not be renewed for ", ttl_s_,
                         " s: ", ttl.status().message());
    } else {
      continue;  // etcd unreachable for now: try again within the TTL
    }
    lost_reason_ = why;
    lost_ = true;
    return;
  }
}

absl::StatusOr<EtcdLeaderKey> EtcdLeadership::Campaign(const std::atomic<bool>& stop) {
  std::atomic<bool> give_up{false};
  std::thread watch([&] {
    while (!stop && !lost_ && !give_up) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    give_up = true;
  });
  absl::StatusOr<EtcdLeaderKey> key = client_->Campaign(election_, lease_, address_, give_up);
  give_up = true;
  watch.join();
  if (lost_) return absl::AbortedError("the lease was lost while campaigning: " + lost_reason());
  return key;
}

std::string EtcdLeadership::LeaderAddress() {
  absl::StatusOr<std::string> leader = client_->Leader(election_);
  return leader.ok() ? *leader : "";
}

std::string EtcdLeadership::lost_reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lost_reason_;
}

void EtcdLeadership::Lose(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (lost_) return;
  lost_reason_ = why;
  lost_ = true;
}

}  // namespace shardtrain::coordinator
