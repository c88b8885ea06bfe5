// A small client of etcd's v3 gRPC API (KV, Auth), as much as the
// coordinator's etcd state store needs, speaking to the stubs generated from
// the protos Debian ships (proto/CMakeLists.txt: shardtrain_etcd_proto).
//
// Endpoints are tried in order: a call that finds its member unreachable
// (UNAVAILABLE, or no answer within the timeout) goes to the next one, once
// around the list; the member that answered is tried first next time. TLS
// and etcd's user/password authentication are named as etcdctl names them
// (--cacert, --cert, --key, --user).
//
// etcd's own limits, which callers respect: a request of at most 1.5 MiB
// (--max-request-bytes), at most 128 operations in one Txn (--max-txn-ops),
// and a 2 GiB database by default (--quota-backend-bytes).
//
// Thread-safe.
#ifndef SHARDTRAIN_COORDINATOR_ETCD_CLIENT_H_
#define SHARDTRAIN_COORDINATOR_ETCD_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace shardtrain::coordinator {

struct EtcdOptions {
  std::vector<std::string> endpoints;   // host:port of each member
  std::string prefix = "/shardtrain/";  // every key the coordinator writes starts with it
  // TLS when ca is set (PEM contents; cert and key: a client certificate).
  std::string ca, cert, key;
  // etcd authentication when user is set.
  std::string user, password;
  int64_t timeout_ms = 5000;  // per call, whichever members it tries
};

// "etcd://H1:P1,H2:P2" (optionally ending in /PREFIX, a key prefix other
// than /shardtrain/). INVALID_ARGUMENT naming what is wrong.
absl::StatusOr<EtcdOptions> ParseEtcdUrl(const std::string& url);

// etcd's limits (see the header comment), with room for the request's keys
// and framing.
inline constexpr size_t kEtcdMaxValueBytes = 1 << 20;
inline constexpr int kEtcdMaxTxnOps = 128;

// One key-value pair as read.
struct EtcdKv {
  std::string key, value;
  int64_t mod_revision = 0;
};

// A write of one Txn: a put of value at key.
struct EtcdPut {
  std::string key, value;
};

// An election's leader key (etcd's v3election LeaderKey): the key the
// leader holds on its lease, and the revision it was created at. A write
// guarded by it commits only while that key still exists as created, so a
// leader whose lease ran out (paused, partitioned) can no longer write.
struct EtcdLeaderKey {
  std::string name, key;
  int64_t rev = 0, lease = 0;
};

class EtcdClient {
 public:
  // Connects lazily: fails only for options that cannot work (no endpoint).
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Create(const EtcdOptions& options);
  ~EtcdClient();

  // Every pair with a key in [prefix, prefix + 1), read at one revision in
  // pages, in key order (keys_only: values left empty).
  absl::StatusOr<std::vector<EtcdKv>> RangePrefix(const std::string& prefix,
                                                  bool keys_only = false);
  // The value at `key`; NOT_FOUND when absent.
  absl::StatusOr<EtcdKv> Get(const std::string& key);
  // All puts in one Txn (at most kEtcdMaxTxnOps): durable in etcd on OK.
  // With a guard, only while the guard's leader key exists as created;
  // FAILED_PRECONDITION (nothing written) otherwise.
  absl::Status PutAll(const std::vector<EtcdPut>& puts, const EtcdLeaderKey* guard = nullptr);
  // Deletes `key` (absent: OK).
  absl::Status Delete(const std::string& key);
  // Puts value at key only when the key does not exist; returns the value
  // the key holds afterwards (value, or the one some other writer put first).
  absl::StatusOr<std::string> PutIfAbsent(const std::string& key, const std::string& value);

  // ---- leases and elections (etcd_election.h uses them)
  // A lease of ttl_s seconds: its id.
  absl::StatusOr<int64_t> GrantLease(int64_t ttl_s);
  // Renews lease `id` once: the TTL it has now (0: it had expired).
  absl::StatusOr<int64_t> KeepAlive(int64_t id);
  absl::Status RevokeLease(int64_t id);
  // Campaigns in election `name` with `value` on lease `lease`: returns once
  // this campaigner leads (etcd's Campaign blocks until then), trying the
  // members in turn while they fail; CANCELLED once `stop` is set.
  absl::StatusOr<EtcdLeaderKey> Campaign(const std::string& name, int64_t lease,
                                         const std::string& value, const std::atomic<bool>& stop);
  // The current leader's value of election `name`; NOT_FOUND without one.
  absl::StatusOr<std::string> Leader(const std::string& name);

  const EtcdOptions& options() const { return options_; }

  struct Impl;  // the members' stubs (etcd_client.cc)

 private:
  explicit EtcdClient(EtcdOptions options);
  EtcdOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardtrain::coordinator

#endif  // SHARDTRAIN_COORDINATOR_ETCD_CLIENT_H_
