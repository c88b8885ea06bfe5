#include "worker/comm/gloo_store_adapter.h"

#include "absl/strings/str_cat.h"
#include "gloo/common/error.h"

namespace shardtrain::comm {

GlooStoreAdapter::GlooStoreAdapter(RendezvousStore* store, std::string prefix,
                                   absl::Duration timeout)
    : store_(store), prefix_(std::move(prefix)), timeout_(timeout) {}

void GlooStoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  absl::Status s =
      store_->Set(absl::StrCat(prefix_, "/", key), absl::string_view(data.data(), data.size()));
  if (!s.ok()) throw gloo::IoException(s.ToString());
}

std::vector<char> GlooStoreAdapter::get(const std::string& key) {
  absl::StatusOr<std::string> v = store_->Get(absl::StrCat(prefix_, "/", key), timeout_);
  if (!v.ok()) throw gloo::IoException(v.status().ToString());
  return std::vector<char>(v->begin(), v->end());
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys) {
  wait(keys, std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout_)));
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& timeout) {
  const absl::Time deadline = absl::Now() + absl::FromChrono(timeout);
  for (const std::string& key : keys) {
    absl::Duration left = deadline - absl::Now();
    if (left < absl::ZeroDuration()) left = absl::ZeroDuration();
    absl::StatusOr<std::string> v = store_->Get(absl::StrCat(prefix_, "/", key), left);
    if (!v.ok()) throw gloo::IoException(v.status().ToString());
  }
}

}  // namespace shardtrain::comm
