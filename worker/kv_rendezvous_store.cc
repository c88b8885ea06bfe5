#include "worker/kv_rendezvous_store.h"

#include <utility>

namespace shardtrain::worker {

KvRendezvousStore::KvRendezvousStore(CoordinatorApi* client, std::string job_id, int64_t generation,
                                     std::string lease_token)
    : client_(client),
      job_id_(std::move(job_id)),
      generation_(generation),
      lease_token_(std::move(lease_token)) {}

absl::Status KvRendezvousStore::Set(absl::string_view key, absl::string_view value) {
  v1::KvSetRequest r;
  r.set_job_id(job_id_);
  r.set_generation(generation_);
  r.set_key(std::string(key));
  r.set_value(std::string(value));
  r.set_lease_token(lease_token_);
  return client_->KvSet(r);
}

absl::StatusOr<std::string> KvRendezvousStore::Get(absl::string_view key, absl::Duration timeout) {
  v1::KvGetRequest r;
  r.set_job_id(job_id_);
  r.set_generation(generation_);
  r.set_key(std::string(key));
  r.set_wait_ms(absl::ToInt64Milliseconds(timeout));
  absl::StatusOr<std::string> v = client_->KvGet(r);
  // A zero wait answers NOT_FOUND; the interface promises DEADLINE_EXCEEDED.
  if (!v.ok() && absl::IsNotFound(v.status())) {
    return absl::DeadlineExceededError(v.status().message());
  }
  return v;
}

absl::StatusOr<int64_t> KvRendezvousStore::Add(absl::string_view key, int64_t delta) {
  v1::KvAddRequest r;
  r.set_job_id(job_id_);
  r.set_generation(generation_);
  r.set_key(std::string(key));
  r.set_delta(delta);
  r.set_lease_token(lease_token_);
  return client_->KvAdd(r);
}

}  // namespace shardtrain::worker
