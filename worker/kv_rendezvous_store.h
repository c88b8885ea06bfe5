// comm::RendezvousStore over the coordinator's KV RPCs, in the namespace of
// one (job, generation): how a rank's collectives find their peers without a
// shared filesystem.
//
// Thread-safe.
#ifndef SHARDTRAIN_WORKER_KV_RENDEZVOUS_STORE_H_
#define SHARDTRAIN_WORKER_KV_RENDEZVOUS_STORE_H_

#include <string>

#include "worker/comm/rendezvous_store.h"
#include "worker/coordinator_api.h"

namespace shardtrain::worker {

class KvRendezvousStore final : public comm::RendezvousStore {
 public:
  // `client` must outlive the store. `lease_token`: the assignment's, which
  // the coordinator asks of every KV write.
  KvRendezvousStore(CoordinatorApi* client, std::string job_id, int64_t generation,
                    std::string lease_token = "");

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;

 private:
  CoordinatorApi* const client_;
  const std::string job_id_;
  const int64_t generation_;
  const std::string lease_token_;
};

}  // namespace shardtrain::worker

#endif  // SHARDTRAIN_WORKER_KV_RENDEZVOUS_STORE_H_
