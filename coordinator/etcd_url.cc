// ParseEtcdUrl (etcd_client.h): built with or without etcd's stubs, so a
// coordinator built without them still says what --state etcd:// needs.
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "coordinator/etcd_client.h"

namespace shardtrain::coordinator {

absl::StatusOr<EtcdOptions> ParseEtcdUrl(const std::string& url) {
  constexpr absl::string_view kScheme = "etcd://";
  if (!absl::StartsWith(url, kScheme)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", url, "' is not an etcd URL: etcd://HOST:PORT[,HOST:PORT...][/PREFIX]"));
  }
  EtcdOptions o;
  std::string rest = url.substr(kScheme.size());
  if (const size_t slash = rest.find('/'); slash != std::string::npos) {
    o.prefix = rest.substr(slash);
    if (o.prefix.back() != '/') o.prefix += '/';
    rest.resize(slash);
  }
  for (absl::string_view ep : absl::StrSplit(rest, ',', absl::SkipEmpty())) {
    const size_t colon = ep.rfind(':');
    int port = 0;
    if (colon == absl::string_view::npos || colon == 0 ||
        !absl::SimpleAtoi(ep.substr(colon + 1), &port) || port < 1 || port > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat("etcd endpoint '", ep, "' in '", url, "' is not HOST:PORT"));
    }
    o.endpoints.emplace_back(ep);
  }
  if (o.endpoints.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", url, "' names no etcd member: etcd://HOST:PORT[,HOST:PORT...]"));
  }
  return o;
}

}  // namespace shardtrain::coordinator
