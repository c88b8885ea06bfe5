// Internal to the job spec's reader (job_spec.cc parses the sections): the
// schema (the keys each level may hold), the typed readers of one field each
// (every error INVALID_ARGUMENT naming the field's dotted path), and --set
// overrides applied to the document before it is read. Not part of the
// public API.
#ifndef SHARDTRAIN_COMMON_JOB_SPEC_READ_H_
#define SHARDTRAIN_COMMON_JOB_SPEC_READ_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/job_spec.h"
#include "common/job_spec_internal.h"
#include "yaml-cpp/yaml.h"

namespace shardtrain::spec_read {

using YAML::Node;

// The keys the top level may hold.
extern const std::vector<absl::string_view>& kTopKeys;

// "prefix.key", or "key" at the top level.
std::string Join(absl::string_view prefix, absl::string_view key);
template <typename... Args>
absl::Status FieldError(absl::string_view path, const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", args...));
}

// How a node looks, for "expected X, got Y" messages.
std::string Describe(const Node& n);
// " (did you mean X?)" for the allowed key nearest to `key`, or "".
std::string DidYouMean(absl::string_view key, const std::vector<absl::string_view>& allowed);

bool Present(const Node& parent, absl::string_view key);
// A map holding only `allowed` keys (unknown ones named, with a suggestion).
absl::Status CheckMap(const Node& node, const std::string& path,
                      const std::vector<absl::string_view>& allowed);
absl::Status Require(const Node& parent, const std::string& prefix, absl::string_view key,
                     absl::string_view hint = "");
absl::StatusOr<int64_t> ParseInt(const Node& n, const std::string& path);
absl::Status CheckRange(const std::string& path, int64_t v, int64_t lo, int64_t hi);
// Each reader leaves *out as it is when the key is absent.
absl::Status ReadInt(const Node& parent, const std::string& prefix, absl::string_view key,
                     int64_t lo, int* out);
absl::StatusOr<double> ParseDouble(const Node& n, const std::string& path);
absl::Status ReadDouble(const Node& parent, const std::string& prefix, absl::string_view key,
                        double lo, bool exclusive, double* out);
absl::Status ReadBool(const Node& parent, const std::string& prefix, absl::string_view key,
                      bool* out);
absl::Status ReadString(const Node& parent, const std::string& prefix, absl::string_view key,
                        std::string* out);
template <typename E>
absl::Status ReadEnum(const Node& parent, const std::string& prefix, absl::string_view key,
                      const spec_internal::EnumTable<E>& table, E* out) {
  if (!Present(parent, key)) return absl::OkStatus();
  const Node n = parent[std::string(key)];
  if (n.IsScalar()) {
    for (const auto& [name, value] : table) {
      if (n.Scalar() == name) {
        *out = value;
        return absl::OkStatus();
      }
    }
  }
  std::vector<absl::string_view> names;
  for (const auto& entry : table) names.push_back(entry.first);
  return FieldError(Join(prefix, key), "expected one of ", absl::StrJoin(names, ", "), ", got ",
                    Describe(n));
}

// The section node (a map, or an empty map when absent), checked to hold
// only its known keys.
absl::StatusOr<Node> Section(const Node& root, absl::string_view key);
// Applies one "key.path=value" override to the document.
absl::Status ApplyOverride(Node& root, const std::string& override_text);

// The model section (job_spec_model.cc): model.* into *m (a preset
// expanded, the family's fields checked), validated as ModelSpec::Config()
// validates it. model.attention's auto is left for the caller
// (AttentionIsAuto): it depends on the rest of the spec.
// The router section (RouterSpec): its ranges (JobSpec-wide checks of
// bias_update_rate against model.moe.router_bias in ParseJobSpec).
absl::Status ParseRouter(const Node& root, RouterSpec* r);
// The finetune section (FinetuneSpec), then what it asks of the rest of the
// spec: a model the adapters fit (model::ValidateLora), and what runs so
// far (CPU workers, no tensor parallelism, dropout 0, the base in bf16).
absl::Status ParseFinetune(const Node& root, FinetuneSpec* f);
absl::Status CheckFinetune(const JobSpec& spec);
absl::Status ParseModel(const Node& root, ModelSpec* m);
// model.attention absent or "auto": the job gets flash where its kernels
// serve it, materialized elsewhere (resolved once the whole spec is read).
bool AttentionIsAuto(const Node& model);

}  // namespace shardtrain::spec_read

#endif  // SHARDTRAIN_COMMON_JOB_SPEC_READ_H_
