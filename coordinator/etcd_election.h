// Leadership among the coordinators that share one etcd prefix (issue 50,
// item 2): each campaigns in etcd's election `<prefix>leader` on a lease of
// its own, with the address clients reach it at as its value. The one
// elected leads: it loads the state and serves; the others stand by,
// answering every RPC UNAVAILABLE with the leader's address
// (kCoordinatorStandby), until the leader's lease runs out (it died, hung,
// or was cut off) and one of them is elected.
//
// Fencing: every state write of the leader is an etcd Txn guarded by its
// leader key (EtcdLeaderKey): once its lease expired the key is gone and
// etcd refuses the write, so a leader that was paused past its lease never
// commits another write, even before it notices; the refusal, or a renewal
// that finds the lease expired, makes it step down (lost()).
//
// Thread-safe.
#ifndef SHARDTRAIN_COORDINATOR_ETCD_ELECTION_H_
#define SHARDTRAIN_COORDINATOR_ETCD_ELECTION_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "coordinator/etcd_client.h"

namespace shardtrain::coordinator {

class EtcdLeadership {
 public:
  // Grants the lease (ttl_s seconds) and starts renewing it every ttl_s / 3.
  // `address`: this coordinator's, as clients and workers reach it.
  static absl::StatusOr<std::unique_ptr<EtcdLeadership>> Create(const EtcdOptions& options,
                                                                std::string address, int64_t ttl_s);
  // Stops renewing and revokes the lease (a clean exit hands over at once).
  ~EtcdLeadership();

  // Blocks until this coordinator leads: its leader key. CANCELLED when
  // `stop` was set; ABORTED when the lease was lost meanwhile.
  absl::StatusOr<EtcdLeaderKey> Campaign(const std::atomic<bool>& stop);
  // The leader's address as it campaigned with it ("" while none is known).
  std::string LeaderAddress();
  // Whether the lease was lost (expired, or not renewed within its TTL):
  // this coordinator must not act as leader any more; why.
  bool lost() const { return lost_; }
  std::string lost_reason() const;
  // Marks the lease lost (a guarded write was refused).
  void Lose(const std::string& why);
  int64_t ttl_s() const { return ttl_s_; }

 private:
  EtcdLeadership(std::unique_ptr<EtcdClient> client, std::string address, int64_t ttl_s,
                 int64_t lease);
  void Renew();  // the renewing thread

  const std::unique_ptr<EtcdClient> client_;
  const std::string address_, election_;
  const int64_t ttl_s_, lease_;
  std::atomic<bool> lost_{false}, stopping_{false};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::string lost_reason_;  // GUARDED_BY(mu_)
  std::thread renewer_;
};

}  // namespace shardtrain::coordinator

#endif  // SHARDTRAIN_COORDINATOR_ETCD_ELECTION_H_
