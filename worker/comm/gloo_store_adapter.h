// Presents a RendezvousStore as the gloo::rendezvous::Store that
// gloo::rendezvous::Context::connectFullMesh needs, under a key prefix.
//
// connectFullMesh uses fixed keys ("rank_<i>", "<i>"), so every (job,
// generation, group) must get its own prefix. Gloo calls get() without wait()
// first, so get() blocks until the key exists (up to `timeout`). Failures are
// thrown as gloo::IoException, the type Gloo's callers expect.
#ifndef SHARDTRAIN_WORKER_COMM_GLOO_STORE_ADAPTER_H_
#define SHARDTRAIN_WORKER_COMM_GLOO_STORE_ADAPTER_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gloo/rendezvous/store.h"
#include "worker/comm/rendezvous_store.h"

namespace shardtrain::comm {

class GlooStoreAdapter final : public gloo::rendezvous::Store {
 public:
  // Keys become `prefix + "/" + key`. `store` must outlive the adapter.
  GlooStoreAdapter(RendezvousStore* store, std::string prefix, absl::Duration timeout);

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  RendezvousStore* store_;
  std::string prefix_;
  absl::Duration timeout_;
};

}  // namespace shardtrain::comm

#endif  // SHARDTRAIN_WORKER_COMM_GLOO_STORE_ADAPTER_H_
