// The job spec's field readers and schema (job_spec_read.h).
#include "common/job_spec_read.h"

#include <cerrno>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace shardtrain::spec_read {

namespace si = spec_internal;  // the number format, shared with job_spec_yaml.cc
namespace {

// ---------------------------------------------------------------------------
// Schema: the keys each level of the document may hold.

const std::vector<absl::string_view> kTopKeys_def = {
    "name",         "model",    "data",       "batch",   "parallel", "precision",
    "optimizer",    "steps",    "checkpoint", "eval",    "seed",     "resources",
    "max_restarts", "timeouts", "router",     "finetune"};
const std::vector<absl::string_view> kModelKeys = {"preset",
                                                   "arch",
                                                   "layers",
                                                   "heads",
                                                   "dim",
                                                   "context",
                                                   "vocab",
                                                   "kv_heads",
                                                   "ffn_dim",
                                                   "rope_theta",
                                                   "rope_scaling",
                                                   "head_dim",
                                                   "qk_norm",
                                                   "norm_eps",
                                                   "tie_embeddings",
                                                   "init",
                                                   "adapter",
                                                   "recompute",
                                                   "recompute_layers",
                                                   "attention",
                                                   "moe"};
const std::vector<absl::string_view> kDataKeys = {"train", "val", "format", "tokenizer",
                                                  "tokenizer_json"};
const std::vector<absl::string_view> kBatchKeys = {"global", "micro", "seq_len"};
const std::vector<absl::string_view> kParallelKeys = {"dp",
                                                      "cp",
                                                      "ep",
                                                      "tp",
                                                      "pp",
                                                      "stages",
                                                      "zero",
                                                      "offload",
                                                      "schedule",
                                                      "pp_virtual",
                                                      "reshard_after_forward",
                                                      "bucket_mb",
                                                      "sequence_parallel",
                                                      "comm",
                                                      "reduce_dtype"};
const std::vector<absl::string_view> kOptimizerKeys = {
    "name",         "lr",           "min_lr",   "betas",     "eps",
    "weight_decay", "warmup_steps", "schedule", "grad_clip", "state"};
const std::vector<absl::string_view> kCheckpointKeys = {
    "every", "dir", "keep", "on_failure", "max_consecutive_failures", "final_retry_s"};
const std::vector<absl::string_view> kEvalKeys = {"every", "batches"};
const std::vector<absl::string_view> kResourcesKeys = {"device", "min_workers", "max_workers"};
const std::vector<absl::string_view> kTimeoutsKeys = {"collective_s"};
const std::vector<absl::string_view> kRouterKeys = {"aux_loss_coef", "z_loss_coef",
                                                    "bias_update_rate", "capacity_factor"};
const std::vector<absl::string_view> kFinetuneKeys = {"lora", "base_dtype", "double_quant"};

// The keys of a top-level section, or nullptr when `key` holds a plain value.
const std::vector<absl::string_view>* SectionKeys(absl::string_view key) {
  if (key == "model") return &kModelKeys;
  if (key == "data") return &kDataKeys;
  if (key == "batch") return &kBatchKeys;
  if (key == "parallel") return &kParallelKeys;
  if (key == "optimizer") return &kOptimizerKeys;
  if (key == "checkpoint") return &kCheckpointKeys;
  if (key == "eval") return &kEvalKeys;
  if (key == "resources") return &kResourcesKeys;
  if (key == "timeouts") return &kTimeoutsKeys;
  if (key == "router") return &kRouterKeys;
  if (key == "finetune") return &kFinetuneKeys;
  return nullptr;
}

}  // namespace

const std::vector<absl::string_view>& kTopKeys = kTopKeys_def;

// ---------------------------------------------------------------------------
// Messages.

std::string Join(absl::string_view prefix, absl::string_view key) {
  return prefix.empty() ? std::string(key) : absl::StrCat(prefix, ".", key);
}

// How a node looks, for "expected X, got Y" messages.
std::string Describe(const Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map:
      return "a map";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Scalar:
      return absl::StrCat("\"", absl::CEscape(n.Scalar()), "\"");
    default:
      return "nothing";
  }
}

int EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<int> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = static_cast<int>(j);
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = static_cast<int>(i);
    for (size_t j = 1; j <= b.size(); ++j) {
      int subst = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, subst});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// " (did you mean X?)" for the closest allowed key within a small distance.
std::string DidYouMean(absl::string_view key, const std::vector<absl::string_view>& allowed) {
  absl::string_view best;
  int best_distance = INT_MAX;
  for (absl::string_view candidate : allowed) {
    int d = EditDistance(absl::AsciiStrToLower(key), candidate);
    if (d < best_distance) {
      best_distance = d;
      best = candidate;
    }
  }
  int limit = key.size() <= 3 ? 1 : 2;
  if (best_distance > limit) return "";
  return absl::StrCat(" (did you mean ", best, "?)");
}

// ---------------------------------------------------------------------------
// Typed reads. A key that is absent or null leaves `*out` (the default) alone.

bool Present(const Node& parent, absl::string_view key) {
  if (!parent.IsMap()) return false;
  const Node n = parent[std::string(key)];
  return n.IsDefined() && !n.IsNull();
}

// A quoted scalar ('10' or "10") is a string in YAML, never a number.
bool IsQuoted(const Node& n) { return n.Tag() == "!"; }

absl::Status CheckMap(const Node& node, const std::string& path,
                      const std::vector<absl::string_view>& allowed) {
  if (!node.IsMap()) {
    return FieldError(path.empty() ? "spec" : path, "expected a map of fields, got ",
                      Describe(node));
  }
  std::set<std::string> seen;
  for (const auto& entry : node) {
    if (!entry.first.IsScalar()) {
      return FieldError(path.empty() ? "spec" : path, "keys must be plain names, got ",
                        Describe(entry.first));
    }
    const std::string& key = entry.first.Scalar();
    std::string field = Join(path, key);
    bool known = false;
    for (absl::string_view a : allowed) known = known || a == key;
    if (!known) return FieldError(field, "unknown key", DidYouMean(key, allowed));
    if (!seen.insert(key).second) return FieldError(field, "appears more than once");
  }
  return absl::OkStatus();
}

absl::Status Require(const Node& parent, const std::string& prefix, absl::string_view key,
                     absl::string_view hint) {
  if (Present(parent, key)) return absl::OkStatus();
  return FieldError(Join(prefix, key), "required", hint);
}

absl::StatusOr<int64_t> ParseInt(const Node& n, const std::string& path) {
  if (!n.IsScalar() || IsQuoted(n)) {
    return FieldError(path, "expected an integer, got ", Describe(n));
  }
  absl::string_view text = n.Scalar();
  if (!text.empty() && text[0] == '+') text.remove_prefix(1);
  int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || end != text.data() + text.size()) {
    return FieldError(path, "expected an integer, got ", Describe(n));
  }
  if (ec == std::errc::result_out_of_range) {
    return FieldError(path, "integer out of range: ", n.Scalar());
  }
  return value;
}

absl::Status CheckRange(const std::string& path, int64_t v, int64_t lo, int64_t hi) {
  if (v >= lo && v <= hi) return absl::OkStatus();
  if (hi == INT_MAX) return FieldError(path, "must be >= ", lo, ", got ", v);
  return FieldError(path, "must be between ", lo, " and ", hi, ", got ", v);
}

absl::Status ReadInt(const Node& parent, const std::string& prefix, absl::string_view key,
                     int64_t lo, int* out) {
  if (!Present(parent, key)) return absl::OkStatus();
  std::string path = Join(prefix, key);
  SHARDTRAIN_ASSIGN_OR_RETURN(int64_t v, ParseInt(parent[std::string(key)], path));
  SHARDTRAIN_RETURN_IF_ERROR(CheckRange(path, v, lo, INT_MAX));
  *out = static_cast<int>(v);
  return absl::OkStatus();
}

absl::StatusOr<double> ParseDouble(const Node& n, const std::string& path) {
  if (!n.IsScalar() || IsQuoted(n) || n.Scalar().empty()) {
    return FieldError(path, "expected a number, got ", Describe(n));
  }
  const std::string& text = n.Scalar();
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || errno == ERANGE) {
    return FieldError(path, "expected a number, got ", Describe(n));
  }
  if (!std::isfinite(v)) return FieldError(path, "must be a finite number, got ", text);
  return v;
}

// Reads a number >= lo (or > lo when `exclusive`).
absl::Status ReadDouble(const Node& parent, const std::string& prefix, absl::string_view key,
                        double lo, bool exclusive, double* out) {
  if (!Present(parent, key)) return absl::OkStatus();
  std::string path = Join(prefix, key);
  SHARDTRAIN_ASSIGN_OR_RETURN(double v, ParseDouble(parent[std::string(key)], path));
  if (exclusive ? !(v > lo) : !(v >= lo)) {
    return FieldError(path, "must be ", exclusive ? "> " : ">= ", si::FormatDouble(lo), ", got ",
                      si::FormatDouble(v));
  }
  *out = v;
  return absl::OkStatus();
}

absl::Status ReadBool(const Node& parent, const std::string& prefix, absl::string_view key,
                      bool* out) {
  if (!Present(parent, key)) return absl::OkStatus();
  std::string path = Join(prefix, key);
  const Node n = parent[std::string(key)];
  if (n.IsScalar() && !IsQuoted(n)) {
    std::string text = absl::AsciiStrToLower(n.Scalar());
    if (text == "true" || text == "yes" || text == "on") {
      *out = true;
      return absl::OkStatus();
    }
    if (text == "false" || text == "no" || text == "off") {
      *out = false;
      return absl::OkStatus();
    }
  }
  return FieldError(path, "expected true or false, got ", Describe(n));
}

absl::Status ReadString(const Node& parent, const std::string& prefix, absl::string_view key,
                        std::string* out) {
  if (!Present(parent, key)) return absl::OkStatus();
  const Node n = parent[std::string(key)];
  if (!n.IsScalar()) return FieldError(Join(prefix, key), "expected a string, got ", Describe(n));
  *out = n.Scalar();
  return absl::OkStatus();
}

// Returns the section node (a map, or an undefined node when absent), having
// checked that it is a map holding only known keys.
absl::StatusOr<Node> Section(const Node& root, absl::string_view key) {
  if (!Present(root, key)) return Node(YAML::NodeType::Map);
  Node section = root[std::string(key)];
  SHARDTRAIN_RETURN_IF_ERROR(CheckMap(section, std::string(key), *SectionKeys(key)));
  return section;
}

// ---------------------------------------------------------------------------
// Overrides.

absl::Status ApplyOverride(Node& root, const std::string& override_text) {
  auto bad = [&](const auto&... args) {
    return absl::InvalidArgumentError(
        absl::StrCat("override \"", absl::CEscape(override_text), "\": ", args...));
  };
  size_t eq = override_text.find('=');
  if (eq == std::string::npos) return bad("expected key.path=value");
  std::string key(absl::StripAsciiWhitespace(override_text.substr(0, eq)));
  std::string value_text = override_text.substr(eq + 1);
  std::vector<std::string> parts = absl::StrSplit(key, '.');
  for (const std::string& p : parts) {
    if (p.empty()) return bad("expected key.path=value, got an empty name in \"", key, "\"");
  }
  bool top_known = false;
  for (absl::string_view k : kTopKeys) top_known = top_known || k == parts[0];
  if (!top_known) return bad("unknown field ", key, DidYouMean(parts[0], kTopKeys));
  const std::vector<absl::string_view>* section_keys = SectionKeys(parts[0]);
  if (parts.size() > 2 || (parts.size() == 2 && section_keys == nullptr)) {
    return bad("unknown field ", key);
  }
  if (parts.size() == 2) {
    bool known = false;
    for (absl::string_view k : *section_keys) known = known || k == parts[1];
    if (!known) return bad("unknown field ", key, DidYouMean(parts[1], *section_keys));
  }

  Node value;
  try {
    value = YAML::Load(value_text);
  } catch (const YAML::Exception& e) {
    return bad("value is not valid YAML: ", e.msg);
  }

  if (parts.size() == 1) {
    root[parts[0]] = value;
    return absl::OkStatus();
  }
  Node section = root[parts[0]];
  if (!section.IsDefined() || section.IsNull()) {
    root[parts[0]] = Node(YAML::NodeType::Map);
    section.reset(root[parts[0]]);
  } else if (!section.IsMap()) {
    return bad(parts[0], " in the spec is not a map");
  }
  section[parts[1]] = value;
  return absl::OkStatus();
}

}  // namespace shardtrain::spec_read

namespace shardtrain {

std::vector<std::string> JobSpecFieldPaths() {
  std::vector<std::string> out;
  for (absl::string_view top : spec_read::kTopKeys) {
    const std::vector<absl::string_view>* keys = spec_read::SectionKeys(top);
    if (keys == nullptr) {
      out.emplace_back(top);
      continue;
    }
    for (absl::string_view k : *keys) out.push_back(absl::StrCat(top, ".", k));
  }
  return out;
}

}  // namespace shardtrain
