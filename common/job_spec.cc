#include "common/job_spec.h"

#include <cerrno>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/job_spec_internal.h"
#include "common/model/config.h"
#include "common/model/slice.h"
#include "common/status_macros.h"
#include "yaml-cpp/yaml.h"

namespace shardtrain {
namespace {

using YAML::Node;
namespace si = spec_internal;  // enum spellings and number format, shared with job_spec_yaml.cc

// ---------------------------------------------------------------------------
// Schema: the keys each level of the document may hold.

const std::vector<absl::string_view> kTopKeys = {
    "name",  "model",      "data", "batch", "parallel",  "precision",    "optimizer",
    "steps", "checkpoint", "eval", "seed",  "resources", "max_restarts", "timeouts"};
const std::vector<absl::string_view> kModelKeys = {"preset", "layers",    "heads",
                                                   "dim",    "context",   "vocab",
                                                   "init",   "recompute", "recompute_layers"};
const std::vector<absl::string_view> kDataKeys = {"train", "val", "format", "tokenizer"};
const std::vector<absl::string_view> kBatchKeys = {"global", "micro", "seq_len"};
const std::vector<absl::string_view> kParallelKeys = {"dp",        "tp",
                                                      "pp",        "stages",
                                                      "zero",      "offload",
                                                      "schedule",  "reshard_after_forward",
                                                      "bucket_mb", "sequence_parallel"};
const std::vector<absl::string_view> kOptimizerKeys = {"name",         "lr",       "min_lr",
                                                       "betas",        "eps",      "weight_decay",
                                                       "warmup_steps", "schedule", "grad_clip"};
const std::vector<absl::string_view> kCheckpointKeys = {"every", "dir", "keep"};
const std::vector<absl::string_view> kEvalKeys = {"every", "batches"};
const std::vector<absl::string_view> kResourcesKeys = {"device", "min_workers", "max_workers"};
const std::vector<absl::string_view> kTimeoutsKeys = {"collective_s"};

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
  return nullptr;
}

// ---------------------------------------------------------------------------
// Messages.

std::string Join(absl::string_view prefix, absl::string_view key) {
  return prefix.empty() ? std::string(key) : absl::StrCat(prefix, ".", key);
}

template <typename... Args>
absl::Status FieldError(absl::string_view path, const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", args...));
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
                     absl::string_view hint = "") {
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

template <typename E>
absl::Status ReadEnum(const Node& parent, const std::string& prefix, absl::string_view key,
                      const si::EnumTable<E>& table, E* out) {
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

// ---------------------------------------------------------------------------
// Sections.

absl::Status ParseModel(const Node& root, ModelSpec* m) {
  SHARDTRAIN_RETURN_IF_ERROR(Require(root, "", "model"));
  SHARDTRAIN_ASSIGN_OR_RETURN(Node n, Section(root, "model"));
  SHARDTRAIN_RETURN_IF_ERROR(ReadString(n, "model", "preset", &m->preset));
  if (!m->preset.empty()) {
    absl::StatusOr<model::GptConfig> preset = model::GptPreset(m->preset);
    if (!preset.ok()) return FieldError("model.preset", preset.status().message());
    m->layers = preset->layers;
    m->heads = preset->heads;
    m->dim = preset->dim;
    m->context = preset->context;
    m->vocab = preset->vocab;
  } else {
    for (const char* key : {"layers", "heads", "dim", "context", "vocab"}) {
      SHARDTRAIN_RETURN_IF_ERROR(Require(n, "model", key, " (or set model.preset)"));
    }
  }
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, "model", "layers", 1, &m->layers));
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, "model", "heads", 1, &m->heads));
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, "model", "dim", 1, &m->dim));
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, "model", "context", 1, &m->context));
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, "model", "vocab", 1, &m->vocab));
  SHARDTRAIN_RETURN_IF_ERROR(ReadString(n, "model", "init", &m->init));
  SHARDTRAIN_RETURN_IF_ERROR(ReadEnum(n, "model", "recompute", si::kRecomputes, &m->recompute));
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, "model", "recompute_layers", 1, &m->recompute_layers));
  if (m->recompute_layers > 0 && m->recompute == Recompute::kNone) {
    return FieldError("model.recompute_layers",
                      "needs model.recompute: selective or full (it is none)");
  }
  return model::MakeGptConfig(m->layers, m->heads, m->dim, m->context, m->vocab).status();
}

absl::Status ParseData(const Node& root, const ModelSpec& model, DataSpec* d) {
  SHARDTRAIN_RETURN_IF_ERROR(Require(root, "", "data"));
  SHARDTRAIN_ASSIGN_OR_RETURN(Node n, Section(root, "data"));
  SHARDTRAIN_RETURN_IF_ERROR(Require(n, "data", "train"));
  SHARDTRAIN_RETURN_IF_ERROR(ReadString(n, "data", "train", &d->train));
  if (d->train.empty()) return FieldError("data.train", "must not be empty");
  SHARDTRAIN_RETURN_IF_ERROR(ReadString(n, "data", "val", &d->val));
  SHARDTRAIN_RETURN_IF_ERROR(ReadEnum(n, "data", "format", si::kDataFormats, &d->format));
  d->tokenizer = d->format == DataFormat::kLlmc ? TokenizerKind::kGpt2 : TokenizerKind::kByte;
  SHARDTRAIN_RETURN_IF_ERROR(ReadEnum(n, "data", "tokenizer", si::kTokenizers, &d->tokenizer));
  if (d->tokenizer == TokenizerKind::kGpt2 && d->format != DataFormat::kLlmc) {
    return FieldError("data.tokenizer",
                      "gpt2 requires data.format: llmc (text data uses the byte tokenizer)");
  }
  if (d->tokenizer == TokenizerKind::kByte && model.vocab < 256) {
    return FieldError("model.vocab", model.vocab,
                      " is too small for the byte tokenizer (needs >= 256)");
  }
  if (d->tokenizer == TokenizerKind::kGpt2 && model.vocab < 50257) {
    return FieldError("model.vocab", model.vocab,
                      " is too small for the gpt2 tokenizer (needs >= 50257)");
  }
  return absl::OkStatus();
}

absl::Status ParseParallel(const Node& root, const ModelSpec& model, ParallelSpec* p) {
  SHARDTRAIN_ASSIGN_OR_RETURN(Node n, Section(root, "parallel"));
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, "parallel", "dp", 1, &p->dp));
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, "parallel", "tp", 1, &p->tp));
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, "parallel", "pp", 1, &p->pp));
  if (Present(n, "stages")) {
    const Node stages = n["stages"];
    if (!stages.IsSequence()) {
      return FieldError("parallel.stages", "expected a list of layers per stage, got ",
                        Describe(stages));
    }
    for (size_t i = 0; i < stages.size(); ++i) {
      const std::string path = absl::StrCat("parallel.stages[", i, "]");
      SHARDTRAIN_ASSIGN_OR_RETURN(int64_t layers, ParseInt(stages[i], path));
      SHARDTRAIN_RETURN_IF_ERROR(CheckRange(path, layers, 1, INT_MAX));
      p->stages.push_back(static_cast<int>(layers));
    }
  }
  if (Present(n, "zero")) {
    SHARDTRAIN_ASSIGN_OR_RETURN(int64_t zero, ParseInt(n["zero"], "parallel.zero"));
    SHARDTRAIN_RETURN_IF_ERROR(CheckRange("parallel.zero", zero, 0, 3));
    p->zero = static_cast<int>(zero);
  }
  SHARDTRAIN_RETURN_IF_ERROR(ReadEnum(n, "parallel", "offload", si::kOffloadModes, &p->offload));
  SHARDTRAIN_RETURN_IF_ERROR(
      ReadEnum(n, "parallel", "schedule", si::kPipelineSchedules, &p->schedule));
  SHARDTRAIN_RETURN_IF_ERROR(
      ReadBool(n, "parallel", "reshard_after_forward", &p->reshard_after_forward));
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, "parallel", "bucket_mb", 1, &p->bucket_mb));
  SHARDTRAIN_RETURN_IF_ERROR(ReadBool(n, "parallel", "sequence_parallel", &p->sequence_parallel));
  if (p->sequence_parallel && p->tp < 2) {
    return FieldError("parallel.sequence_parallel", "needs parallel.tp > 1 (tp is ", p->tp, ")");
  }

  SHARDTRAIN_ASSIGN_OR_RETURN(ParallelDims dims, ParallelDims::Create(p->dp, p->tp, p->pp));
  SHARDTRAIN_RETURN_IF_ERROR(
      dims.CheckModelFits(model.layers, model.heads, model.dim, model.vocab));
  SHARDTRAIN_RETURN_IF_ERROR(dims.CheckZero(p->zero));
  SHARDTRAIN_ASSIGN_OR_RETURN(
      model::GptConfig config,
      model::MakeGptConfig(model.layers, model.heads, model.dim, model.context, model.vocab));
  return model::StageLayers(config, p->pp, p->stages).status();
}

absl::Status ParseBatch(const Node& root, const ModelSpec& model, const ParallelSpec& par,
                        BatchSpec* b) {
  SHARDTRAIN_RETURN_IF_ERROR(Require(root, "", "batch"));
  SHARDTRAIN_ASSIGN_OR_RETURN(Node n, Section(root, "batch"));
  for (const char* key : {"global", "micro", "seq_len"}) {
    SHARDTRAIN_RETURN_IF_ERROR(Require(n, "batch", key));
  }
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, "batch", "global", 1, &b->global));
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, "batch", "micro", 1, &b->micro));
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, "batch", "seq_len", 1, &b->seq_len));
  if (b->seq_len > model.context) {
    return FieldError("batch.seq_len", b->seq_len, " exceeds model.context: ", model.context);
  }
  if (par.sequence_parallel && (int64_t{b->micro} * b->seq_len) % par.tp != 0) {
    return FieldError("parallel.sequence_parallel", "parallel.tp ", par.tp,
                      " must divide batch.micro × batch.seq_len = ", b->micro, " × ", b->seq_len,
                      " (each tp rank holds an equal part of the micro-batch's rows)");
  }
  return SplitBatch(b->global, b->micro, par.dp).status();
}

absl::Status ParseOptimizer(const Node& root, OptimizerSpec* o) {
  SHARDTRAIN_ASSIGN_OR_RETURN(Node n, Section(root, "optimizer"));
  SHARDTRAIN_RETURN_IF_ERROR(ReadEnum(n, "optimizer", "name", si::kOptimizers, &o->name));
  SHARDTRAIN_RETURN_IF_ERROR(ReadDouble(n, "optimizer", "lr", 0.0, /*exclusive=*/true, &o->lr));
  o->min_lr = 0.1 * o->lr;
  SHARDTRAIN_RETURN_IF_ERROR(ReadDouble(n, "optimizer", "min_lr", 0.0, false, &o->min_lr));
  if (o->min_lr > o->lr) {
    return FieldError("optimizer.min_lr", si::FormatDouble(o->min_lr),
                      " exceeds optimizer.lr: ", si::FormatDouble(o->lr));
  }
  if (Present(n, "betas")) {
    const Node betas = n["betas"];
    if (!betas.IsSequence() || betas.size() != 2) {
      return FieldError(
          "optimizer.betas", "expected a list of two numbers [beta1, beta2], got ",
          betas.IsSequence() ? absl::StrCat("a list of ", betas.size()) : Describe(betas));
    }
    std::vector<double> values;
    for (size_t i = 0; i < 2; ++i) {
      std::string path = absl::StrCat("optimizer.betas[", i, "]");
      SHARDTRAIN_ASSIGN_OR_RETURN(double v, ParseDouble(betas[i], path));
      if (!(v >= 0.0 && v < 1.0)) {
        return FieldError(path, "must be in [0, 1), got ", si::FormatDouble(v));
      }
      values.push_back(v);
    }
    o->betas = values;
  }
  SHARDTRAIN_RETURN_IF_ERROR(ReadDouble(n, "optimizer", "eps", 0.0, true, &o->eps));
  SHARDTRAIN_RETURN_IF_ERROR(
      ReadDouble(n, "optimizer", "weight_decay", 0.0, false, &o->weight_decay));
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, "optimizer", "warmup_steps", 0, &o->warmup_steps));
  SHARDTRAIN_RETURN_IF_ERROR(ReadEnum(n, "optimizer", "schedule", si::kLrSchedules, &o->schedule));
  SHARDTRAIN_RETURN_IF_ERROR(ReadDouble(n, "optimizer", "grad_clip", 0.0, false, &o->grad_clip));
  return absl::OkStatus();
}

absl::Status ParseCheckpoint(const Node& root, CheckpointSpec* c) {
  SHARDTRAIN_ASSIGN_OR_RETURN(Node n, Section(root, "checkpoint"));
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, "checkpoint", "every", 0, &c->every));
  SHARDTRAIN_RETURN_IF_ERROR(ReadString(n, "checkpoint", "dir", &c->dir));
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, "checkpoint", "keep", 1, &c->keep));
  if (c->every > 0 && c->dir.empty()) {
    return FieldError("checkpoint.dir", "required when checkpoint.every > 0 (every: ", c->every,
                      ")");
  }
  return absl::OkStatus();
}

absl::Status ParseEval(const Node& root, const DataSpec& data, int steps, EvalSpec* e) {
  SHARDTRAIN_ASSIGN_OR_RETURN(Node n, Section(root, "eval"));
  // data.val without eval.every: evaluated after the last step only.
  if (!data.val.empty() && !Present(n, "every")) e->every = steps;
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, "eval", "every", 0, &e->every));
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, "eval", "batches", 1, &e->batches));
  if (e->every > 0 && data.val.empty()) {
    return FieldError("data.val", "required when eval.every > 0 (every: ", e->every, ")");
  }
  return absl::OkStatus();
}

absl::Status ParseResources(const Node& root, const ParallelSpec& par, ResourcesSpec* r) {
  SHARDTRAIN_ASSIGN_OR_RETURN(Node n, Section(root, "resources"));
  SHARDTRAIN_RETURN_IF_ERROR(ReadEnum(n, "resources", "device", si::kDevices, &r->device));
  const int world = par.dp * par.tp * par.pp;
  r->min_workers = world;
  r->max_workers = world;
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, "resources", "min_workers", 1, &r->min_workers));
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, "resources", "max_workers", 1, &r->max_workers));
  std::string world_text = absl::StrCat("world ", world, " (parallel.dp × tp × pp = ", par.dp,
                                        " × ", par.tp, " × ", par.pp, ")");
  if (r->min_workers > world) {
    return FieldError("resources.min_workers", r->min_workers, " exceeds ", world_text);
  }
  if (r->max_workers < world) {
    return FieldError("resources.max_workers", r->max_workers, " is less than ", world_text);
  }
  return absl::OkStatus();
}

absl::Status ParseAll(const Node& root, JobSpec* spec) {
  SHARDTRAIN_RETURN_IF_ERROR(CheckMap(root, "", kTopKeys));

  SHARDTRAIN_RETURN_IF_ERROR(Require(root, "", "name"));
  SHARDTRAIN_RETURN_IF_ERROR(ReadString(root, "", "name", &spec->name));
  bool name_ok = !spec->name.empty() && spec->name.size() <= 64;
  for (char c : spec->name) {
    name_ok = name_ok && ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
                          c == '_' || c == '-');
  }
  if (!name_ok) {
    return FieldError("name", "must be 1 to 64 characters of [a-z0-9._-], got \"",
                      absl::CEscape(spec->name), "\"");
  }

  SHARDTRAIN_RETURN_IF_ERROR(ParseModel(root, &spec->model));
  SHARDTRAIN_RETURN_IF_ERROR(ParseData(root, spec->model, &spec->data));
  SHARDTRAIN_RETURN_IF_ERROR(ParseParallel(root, spec->model, &spec->parallel));
  SHARDTRAIN_RETURN_IF_ERROR(ParseBatch(root, spec->model, spec->parallel, &spec->batch));
  SHARDTRAIN_RETURN_IF_ERROR(ReadEnum(root, "", "precision", si::kPrecisions, &spec->precision));
  SHARDTRAIN_RETURN_IF_ERROR(ParseOptimizer(root, &spec->optimizer));
  SHARDTRAIN_RETURN_IF_ERROR(Require(root, "", "steps"));
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(root, "", "steps", 1, &spec->steps));
  SHARDTRAIN_RETURN_IF_ERROR(ParseCheckpoint(root, &spec->checkpoint));
  SHARDTRAIN_RETURN_IF_ERROR(ParseEval(root, spec->data, spec->steps, &spec->eval));
  if (Present(root, "seed")) {
    SHARDTRAIN_ASSIGN_OR_RETURN(int64_t seed, ParseInt(root["seed"], "seed"));
    if (seed < 0) return FieldError("seed", "must be >= 0, got ", seed);
    spec->seed = static_cast<uint64_t>(seed);
  }
  SHARDTRAIN_RETURN_IF_ERROR(ParseResources(root, spec->parallel, &spec->resources));
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(root, "", "max_restarts", 0, &spec->max_restarts));
  SHARDTRAIN_ASSIGN_OR_RETURN(Node timeouts, Section(root, "timeouts"));
  SHARDTRAIN_RETURN_IF_ERROR(
      ReadInt(timeouts, "timeouts", "collective_s", 1, &spec->timeouts.collective_s));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ParallelDims> JobSpec::Dims() const {
  return ParallelDims::Create(parallel.dp, parallel.tp, parallel.pp);
}

absl::StatusOr<BatchSplit> JobSpec::Split() const {
  return SplitBatch(batch.global, batch.micro, parallel.dp);
}

absl::StatusOr<JobSpec> ParseJobSpec(std::string_view yaml_text,
                                     const std::vector<std::string>& overrides) {
  Node root;
  try {
    root = YAML::Load(std::string(yaml_text));
  } catch (const YAML::Exception& e) {
    if (e.mark.is_null()) {
      return absl::InvalidArgumentError(absl::StrCat("spec: invalid YAML: ", e.msg));
    }
    return absl::InvalidArgumentError(absl::StrCat("spec: invalid YAML at line ", e.mark.line + 1,
                                                   ", column ", e.mark.column + 1, ": ", e.msg));
  }
  if (!root.IsDefined() || root.IsNull()) {
    return absl::InvalidArgumentError("spec: empty document (expected a map of fields)");
  }
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec: expected a map of fields at the top level, got ", Describe(root)));
  }
  try {
    for (const std::string& o : overrides) SHARDTRAIN_RETURN_IF_ERROR(ApplyOverride(root, o));
    JobSpec spec;
    SHARDTRAIN_RETURN_IF_ERROR(ParseAll(root, &spec));
    return spec;
  } catch (const YAML::Exception& e) {
    // Not expected: every access above checks types first.
    return absl::InvalidArgumentError(absl::StrCat("spec: ", e.what()));
  }
}

}  // namespace shardtrain
