#include "worker/checkpoint/manifest.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/model/lora.h"
#include "common/status_macros.h"
#include "worker/checkpoint/crc64.h"

namespace shardtrain::checkpoint {
namespace {

constexpr char kHeaderKeyword[] = "shardtrain-checkpoint-manifest";

// %.17g: a double's text that reads back as the same double.
std::string ExactDouble(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

std::string Hex16(uint64_t x) { return absl::StrCat(absl::Hex(x, absl::kZeroPad16)); }

bool IsPlainFileName(const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name == kManifestFileName) return false;
  for (char ch : name) {
    const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                    (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' || ch == '-';
    if (!ok) return false;
  }
  return true;
}

std::string RangesText(const std::vector<FlatRange>& ranges) {
  if (ranges.empty()) return "-";
  return absl::StrJoin(ranges, ",", [](std::string* out, const FlatRange& r) {
    absl::StrAppend(out, r.begin, ":", r.end);
  });
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  return shape.empty() ? "-" : absl::StrJoin(shape, "x");
}

// Shards (any order) → sorted by rank, checked: one per rank, plain distinct
// names, ranges valid and together covering [0, num_params) exactly once.
absl::Status ValidateShards(const std::vector<ShardFileInfo>& shards, int world,
                            uint64_t num_params) {
  if (static_cast<int64_t>(shards.size()) != world) {
    return absl::InvalidArgumentError(
        absl::StrCat(shards.size(), " shards for a world of ", world));
  }
  std::set<std::string> names;
  std::vector<FlatRange> all;
  for (size_t i = 0; i < shards.size(); ++i) {
    const ShardFileInfo& s = shards[i];
    if (s.rank != static_cast<int>(i)) {
      return absl::InvalidArgumentError(
          absl::StrCat("shard ", i, " belongs to rank ", s.rank, " (one shard per rank expected)"));
    }
    if (!IsPlainFileName(s.file)) {
      return absl::InvalidArgumentError(
          absl::StrCat("shard of rank ", i, " has file name \"", s.file,
                       "\" (want a plain name of [A-Za-z0-9._-], not the manifest's)"));
    }
    if (!names.insert(s.file).second) {
      return absl::InvalidArgumentError(absl::StrCat("file ", s.file, " named by two shards"));
    }
    if (absl::Status st = ValidateRanges(s.ranges, num_params); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("shard of rank ", i, ": ", st.message()));
    }
    for (const FlatRange& r : s.ranges) {
      if (r.size() > 0) all.push_back(r);
    }
  }
  std::sort(all.begin(), all.end(),
            [](const FlatRange& a, const FlatRange& b) { return a.begin < b.begin; });
  uint64_t covered = 0;
  for (const FlatRange& r : all) {
    if (r.begin != covered) {
      return absl::InvalidArgumentError(
          r.begin > covered ? absl::StrCat("no shard holds elements [", covered, ", ", r.begin, ")")
                            : absl::StrCat("element ", r.begin, " is held by two shards"));
    }
    covered = r.end;
  }
  if (covered != num_params) {
    return absl::InvalidArgumentError(
        absl::StrCat("no shard holds elements [", covered, ", ", num_params, ")"));
  }
  return absl::OkStatus();
}

// One parsed line: its keyword and key=value fields.
struct Line {
  std::string keyword;
  std::vector<std::string> words;         // tokens without '='
  std::map<std::string, std::string> kv;  // tokens with '='
};

Line SplitLine(const std::string& text) {
  Line line;
  std::vector<std::string> tokens = absl::StrSplit(text, ' ');
  line.keyword = tokens.empty() ? "" : tokens[0];
  for (size_t i = 1; i < tokens.size(); ++i) {
    const size_t eq = tokens[i].find('=');
    if (eq == std::string::npos) {
      line.words.push_back(tokens[i]);
    } else {
      line.kv[tokens[i].substr(0, eq)] = tokens[i].substr(eq + 1);
    }
  }
  return line;
}

// Parses the text of a validated-checksum manifest; errors are plain
// messages (the caller wraps them into DataLoss naming the file).
class Parser {
 public:
  explicit Parser(std::vector<std::string> lines) : lines_(std::move(lines)) {}

  absl::StatusOr<Line> Next(const std::string& keyword) {
    if (pos_ >= lines_.size()) return Error(absl::StrCat("missing \"", keyword, "\" line"));
    Line line = SplitLine(lines_[pos_++]);
    if (line.keyword != keyword) {
      return Error(absl::StrCat("line ", pos_, ": expected \"", keyword, "\", found \"",
                                line.keyword, "\""));
    }
    return line;
  }
  bool AtEnd() const { return pos_ >= lines_.size(); }
  size_t line_number() const { return pos_; }

  // Integer value of a single word line ("step 100").
  template <typename T>
  absl::StatusOr<T> Scalar(const std::string& keyword) {
    absl::StatusOr<Line> line = Next(keyword);
    if (!line.ok()) return line.status();
    T v{};
    if (line->words.size() != 1 || !line->kv.empty() || !absl::SimpleAtoi(line->words[0], &v)) {
      return Error(absl::StrCat("line ", pos_, ": bad \"", keyword, "\" value"));
    }
    return v;
  }

  template <typename T>
  absl::Status Int(const Line& line, const std::string& key, T* out) {
    auto it = line.kv.find(key);
    if (it == line.kv.end() || !absl::SimpleAtoi(it->second, out)) {
      return Error(absl::StrCat("line ", pos_, ": missing or bad ", key, "="));
    }
    return absl::OkStatus();
  }
  absl::Status Double(const Line& line, const std::string& key, double* out) {
    auto it = line.kv.find(key);
    if (it == line.kv.end() || !absl::SimpleAtod(it->second, out)) {
      return Error(absl::StrCat("line ", pos_, ": missing or bad ", key, "="));
    }
    return absl::OkStatus();
  }
  absl::Status Hex(const Line& line, const std::string& key, uint64_t* out) {
    auto it = line.kv.find(key);
    if (it == line.kv.end() || it->second.size() != 16 || !absl::SimpleHexAtoi(it->second, out)) {
      return Error(absl::StrCat("line ", pos_, ": missing or bad ", key, "="));
    }
    return absl::OkStatus();
  }
  absl::Status Str(const Line& line, const std::string& key, std::string* out) {
    auto it = line.kv.find(key);
    if (it == line.kv.end()) return Error(absl::StrCat("line ", pos_, ": missing ", key, "="));
    *out = it->second;
    return absl::OkStatus();
  }
  absl::Status Shape(const Line& line, std::vector<int64_t>* out) {
    std::string text;
    if (absl::Status s = Str(line, "shape", &text); !s.ok()) return s;
    out->clear();
    if (text == "-") return absl::OkStatus();
    for (absl::string_view d : absl::StrSplit(text, 'x')) {
      int64_t v = 0;
      if (!absl::SimpleAtoi(d, &v)) return Error(absl::StrCat("line ", pos_, ": bad shape=", text));
      out->push_back(v);
    }
    return absl::OkStatus();
  }
  absl::Status Ranges(const Line& line, std::vector<FlatRange>* out) {
    std::string text;
    if (absl::Status s = Str(line, "ranges", &text); !s.ok()) return s;
    out->clear();
    if (text == "-") return absl::OkStatus();
    for (absl::string_view r : absl::StrSplit(text, ',')) {
      std::vector<std::string> be = absl::StrSplit(r, ':');
      FlatRange fr;
      if (be.size() != 2 || !absl::SimpleAtoi(be[0], &fr.begin) ||
          !absl::SimpleAtoi(be[1], &fr.end)) {
        return Error(absl::StrCat("line ", pos_, ": bad ranges=", text));
      }
      out->push_back(fr);
    }
    return absl::OkStatus();
  }

  static absl::Status Error(const std::string& msg) { return absl::DataLossError(msg); }

 private:
  std::vector<std::string> lines_;
  size_t pos_ = 0;
};

absl::StatusOr<Manifest> ParseBody(const std::string& body) {
  std::vector<std::string> lines = absl::StrSplit(body, '\n');
  if (!lines.empty() && lines.back().empty()) lines.pop_back();  // after the final '\n'
  Parser p(std::move(lines));
  Manifest m;
  {
    absl::StatusOr<int> version = p.Scalar<int>(kHeaderKeyword);
    if (!version.ok()) return absl::DataLossError("not a shardtrain checkpoint manifest");
    if (*version != kManifestVersion) {
      return absl::DataLossError(absl::StrCat("unsupported version ", *version,
                                              " (this build reads ", kManifestVersion, ")"));
    }
  }
  {
    auto step = p.Scalar<int64_t>("step");
    if (!step.ok()) return step.status();
    m.step = *step;
    auto world = p.Scalar<int>("world");
    if (!world.ok()) return world.status();
    m.world = *world;
    auto zero = p.Scalar<int>("zero_stage");
    if (!zero.ok()) return zero.status();
    m.zero_stage = *zero;
  }
  absl::StatusOr<Line> cfg = p.Next("config");
  if (!cfg.ok()) return cfg.status();
  {
    // GPT-2's six numbers, and a family's recipe after them (arch= ...;
    // absent: GPT-2, as every manifest before families).
    model::LlamaShape shape;
    int padded_vocab = 0;
    SHARDTRAIN_RETURN_IF_ERROR(p.Int(*cfg, "layers", &shape.layers));
    SHARDTRAIN_RETURN_IF_ERROR(p.Int(*cfg, "heads", &shape.heads));
    SHARDTRAIN_RETURN_IF_ERROR(p.Int(*cfg, "dim", &shape.dim));
    SHARDTRAIN_RETURN_IF_ERROR(p.Int(*cfg, "context", &shape.context));
    SHARDTRAIN_RETURN_IF_ERROR(p.Int(*cfg, "vocab", &shape.vocab));
    SHARDTRAIN_RETURN_IF_ERROR(p.Int(*cfg, "padded_vocab", &padded_vocab));
    absl::StatusOr<model::ModelConfig> config;
    if (cfg->kv.count("arch") == 0) {
      config =
          model::MakeGptConfig(shape.layers, shape.heads, shape.dim, shape.context, shape.vocab);
    } else {
      std::string arch;
      int tie = 0;
      SHARDTRAIN_RETURN_IF_ERROR(p.Str(*cfg, "arch", &arch));
      if (arch != "llama") return Parser::Error(absl::StrCat("unknown arch=", arch));
      SHARDTRAIN_RETURN_IF_ERROR(p.Int(*cfg, "kv_heads", &shape.kv_heads));
      SHARDTRAIN_RETURN_IF_ERROR(p.Int(*cfg, "ffn_dim", &shape.ffn_dim));
      SHARDTRAIN_RETURN_IF_ERROR(p.Int(*cfg, "tie_embeddings", &tie));
      SHARDTRAIN_RETURN_IF_ERROR(p.Double(*cfg, "norm_eps", &shape.norm_eps));
      SHARDTRAIN_RETURN_IF_ERROR(p.Double(*cfg, "rope_theta", &shape.rope_theta));
      if (cfg->kv.count("rope_factor") != 0) {  // rope scaling on (absent: off)
        model::RopeScaling& r = shape.rope_scaling;
        SHARDTRAIN_RETURN_IF_ERROR(p.Double(*cfg, "rope_factor", &r.factor));
        SHARDTRAIN_RETURN_IF_ERROR(p.Double(*cfg, "rope_low_freq_factor", &r.low_freq_factor));
        SHARDTRAIN_RETURN_IF_ERROR(p.Double(*cfg, "rope_high_freq_factor", &r.high_freq_factor));
        SHARDTRAIN_RETURN_IF_ERROR(p.Int(*cfg, "rope_original_context", &r.original_context));
      }
      if (cfg->kv.count("head_dim") != 0) {
        SHARDTRAIN_RETURN_IF_ERROR(p.Int(*cfg, "head_dim", &shape.head_dim));
      }
      if (cfg->kv.count("qk_norm") != 0) {
        int qk = 0;
        SHARDTRAIN_RETURN_IF_ERROR(p.Int(*cfg, "qk_norm", &qk));
        shape.qk_norm = qk != 0;
      }
      shape.tie_embeddings = tie != 0;
      config = model::MakeLlamaConfig(shape);
    }
    if (config.ok() && cfg->kv.count("experts") != 0) {  // MoE layers (absent: none)
      model::MoeConfig& moe = config->moe;
      int scoring = 0, norm = 0;
      SHARDTRAIN_RETURN_IF_ERROR(p.Int(*cfg, "experts", &moe.experts));
      SHARDTRAIN_RETURN_IF_ERROR(p.Int(*cfg, "top_k", &moe.top_k));
      SHARDTRAIN_RETURN_IF_ERROR(p.Int(*cfg, "expert_ffn_dim", &moe.expert_ffn_dim));
      SHARDTRAIN_RETURN_IF_ERROR(p.Int(*cfg, "shared_experts", &moe.shared_experts));
      SHARDTRAIN_RETURN_IF_ERROR(p.Int(*cfg, "sigmoid_router", &scoring));
      SHARDTRAIN_RETURN_IF_ERROR(p.Int(*cfg, "norm_topk_prob", &norm));
      SHARDTRAIN_RETURN_IF_ERROR(p.Int(*cfg, "first_dense_layers", &moe.first_dense_layers));
      moe.scoring = scoring != 0 ? model::RouterScoring::kSigmoid : model::RouterScoring::kSoftmax;
      moe.norm_topk_prob = norm != 0;
      if (cfg->kv.count("router_bias") != 0) {
        int bias = 0;
        SHARDTRAIN_RETURN_IF_ERROR(p.Int(*cfg, "router_bias", &bias));
        moe.router_bias = bias != 0;
      }
      if (absl::Status s = model::ValidateModelConfig(*config); !s.ok()) config = s;
    }
    if (config.ok() && cfg->kv.count("lora_rank") != 0) {  // adapters (absent: none)
      model::LoraConfig& lora = config->lora;
      SHARDTRAIN_RETURN_IF_ERROR(p.Int(*cfg, "lora_rank", &lora.rank));
      SHARDTRAIN_RETURN_IF_ERROR(p.Double(*cfg, "lora_alpha", &lora.alpha));
      SHARDTRAIN_RETURN_IF_ERROR(p.Int(*cfg, "lora_targets", &lora.targets));
      if (absl::Status s = model::ValidateLora(*config); !s.ok()) config = s;
    }
    if (!config.ok()) return Parser::Error(absl::StrCat("config: ", config.status().message()));
    m.config = *config;
    m.config.padded_vocab = padded_vocab;  // ValidateManifest checks it
  }
  absl::StatusOr<Line> layout = p.Next("layout");
  if (!layout.ok()) return layout.status();
  uint64_t num_tensors = 0;
  SHARDTRAIN_RETURN_IF_ERROR(p.Int(*layout, "num_params", &m.num_params));
  SHARDTRAIN_RETURN_IF_ERROR(p.Hex(*layout, "fingerprint", &m.layout_fingerprint));
  SHARDTRAIN_RETURN_IF_ERROR(p.Int(*layout, "tensors", &num_tensors));
  if (num_tensors > body.size()) return absl::DataLossError("bad tensors= count");
  for (uint64_t i = 0; i < num_tensors; ++i) {
    absl::StatusOr<Line> line = p.Next("tensor");
    if (!line.ok()) return line.status();
    ManifestTensor t;
    SHARDTRAIN_RETURN_IF_ERROR(p.Str(*line, "name", &t.name));
    SHARDTRAIN_RETURN_IF_ERROR(p.Shape(*line, &t.shape));
    SHARDTRAIN_RETURN_IF_ERROR(p.Int(*line, "offset", &t.offset));
    SHARDTRAIN_RETURN_IF_ERROR(p.Int(*line, "numel", &t.numel));
    m.tensors.push_back(std::move(t));
  }
  if (m.world < 1 || m.world > static_cast<int64_t>(body.size())) {
    return absl::DataLossError(absl::StrCat("bad world ", m.world));
  }
  for (int r = 0; r < m.world; ++r) {
    absl::StatusOr<Line> line = p.Next("shard");
    if (!line.ok()) return line.status();
    ShardFileInfo s;
    SHARDTRAIN_RETURN_IF_ERROR(p.Int(*line, "rank", &s.rank));
    SHARDTRAIN_RETURN_IF_ERROR(p.Str(*line, "file", &s.file));
    SHARDTRAIN_RETURN_IF_ERROR(p.Int(*line, "bytes", &s.bytes));
    SHARDTRAIN_RETURN_IF_ERROR(p.Hex(*line, "crc64", &s.checksum));
    SHARDTRAIN_RETURN_IF_ERROR(p.Ranges(*line, &s.ranges));
    m.shards.push_back(std::move(s));
  }
  if (!p.AtEnd()) {
    return absl::DataLossError(absl::StrCat("unexpected line ", p.line_number() + 1));
  }
  if (absl::Status s = ValidateManifest(m); !s.ok()) return absl::DataLossError(s.message());
  return m;
}

}  // namespace

absl::Status ValidateManifest(const Manifest& m) {
  if (m.step < 0) return absl::InvalidArgumentError(absl::StrCat("step ", m.step, " < 0"));
  if (m.world < 1) return absl::InvalidArgumentError(absl::StrCat("world ", m.world, " < 1"));
  if (m.zero_stage < 0 || m.zero_stage > 3) {
    return absl::InvalidArgumentError(absl::StrCat("zero_stage ", m.zero_stage, " not in 0..3"));
  }
  if (absl::Status s = model::ValidateModelConfig(m.config); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("config: ", s.message()));
  }
  const model::ParamLayout layout(m.config);
  if (m.num_params != layout.num_params() || m.layout_fingerprint != layout.Fingerprint()) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_params/fingerprint ", m.num_params, "/", Hex16(m.layout_fingerprint),
                     " are not those of the layout of ", model::ToString(m.config), " (",
                     layout.num_params(), "/", Hex16(layout.Fingerprint()), ")"));
  }
  const std::vector<model::TensorInfo> trained = TrainedTensors(layout);
  if (m.tensors.size() != trained.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(m.tensors.size(), " tensors, the layout has ", trained.size()));
  }
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    const ManifestTensor& t = m.tensors[i];
    const model::TensorInfo& want = trained[i];
    if (t.name != want.name || t.shape != want.shape || t.offset != want.offset ||
        t.numel != want.numel) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", i, " (", t.name, ") differs from the layout's ", want.name));
    }
  }
  return ValidateShards(m.shards, m.world, m.num_params);
}

absl::StatusOr<Manifest> MakeManifest(const model::ParamLayout& layout, int64_t step, int world,
                                      int zero_stage, std::vector<ShardFileInfo> shards) {
  std::sort(shards.begin(), shards.end(),
            [](const ShardFileInfo& a, const ShardFileInfo& b) { return a.rank < b.rank; });
  Manifest m;
  m.step = step;
  m.config = layout.config();
  m.num_params = layout.num_params();
  m.layout_fingerprint = layout.Fingerprint();
  for (const model::TensorInfo& t : TrainedTensors(layout)) {
    m.tensors.push_back(ManifestTensor{t.name, t.shape, t.offset, t.numel});
  }
  m.world = world;
  m.zero_stage = zero_stage;
  m.shards = std::move(shards);
  if (absl::Status s = ValidateManifest(m); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint manifest of step ", step, ": ", s.message()));
  }
  return m;
}

std::string SerializeManifest(const Manifest& m) {
  std::string out;
  absl::StrAppend(&out, kHeaderKeyword, " ", kManifestVersion, "\n");
  absl::StrAppend(&out, "step ", m.step, "\n", "world ", m.world, "\n", "zero_stage ", m.zero_stage,
                  "\n");
  absl::StrAppend(&out, "config layers=", m.config.layers, " heads=", m.config.heads,
                  " dim=", m.config.dim, " context=", m.config.context, " vocab=", m.config.vocab,
                  " padded_vocab=", m.config.padded_vocab);
  if (m.config.arch != model::Arch::kGpt2) {
    absl::StrAppend(&out, " arch=", model::ArchName(m.config.arch), " kv_heads=", m.config.kv_heads,
                    " ffn_dim=", m.config.ffn_dim,
                    " tie_embeddings=", m.config.tie_embeddings ? 1 : 0,
                    " norm_eps=", ExactDouble(m.config.norm_eps),
                    " rope_theta=", ExactDouble(m.config.rope_theta));
    if (const model::RopeScaling& r = m.config.rope_scaling; r.on()) {
      absl::StrAppend(&out, " rope_factor=", ExactDouble(r.factor),
                      " rope_low_freq_factor=", ExactDouble(r.low_freq_factor),
                      " rope_high_freq_factor=", ExactDouble(r.high_freq_factor),
                      " rope_original_context=", r.original_context);
    }
    if (m.config.head_size > 0) absl::StrAppend(&out, " head_dim=", m.config.head_size);
    if (m.config.qk_norm) absl::StrAppend(&out, " qk_norm=1");
  }
  if (const model::MoeConfig& moe = m.config.moe; moe.on()) {
    absl::StrAppend(&out, " experts=", moe.experts, " top_k=", moe.top_k,
                    " expert_ffn_dim=", moe.expert_ffn_dim, " shared_experts=", moe.shared_experts,
                    " sigmoid_router=", moe.scoring == model::RouterScoring::kSigmoid ? 1 : 0,
                    " norm_topk_prob=", moe.norm_topk_prob ? 1 : 0,
                    " first_dense_layers=", moe.first_dense_layers);
    if (moe.router_bias) absl::StrAppend(&out, " router_bias=1");
  }
  if (const model::LoraConfig& lora = m.config.lora; lora.on()) {
    absl::StrAppend(&out, " lora_rank=", lora.rank, " lora_alpha=", ExactDouble(lora.alpha),
                    " lora_targets=", lora.targets);
  }
  out += "\n";
  absl::StrAppend(&out, "layout num_params=", m.num_params,
                  " fingerprint=", Hex16(m.layout_fingerprint), " tensors=", m.tensors.size(),
                  "\n");
  for (const ManifestTensor& t : m.tensors) {
    absl::StrAppend(&out, "tensor name=", t.name, " shape=", ShapeText(t.shape),
                    " offset=", t.offset, " numel=", t.numel, "\n");
  }
  for (const ShardFileInfo& s : m.shards) {
    absl::StrAppend(&out, "shard rank=", s.rank, " file=", s.file, " bytes=", s.bytes,
                    " crc64=", Hex16(s.checksum), " ranges=", RangesText(s.ranges), "\n");
  }
  absl::StrAppend(&out, "crc64 ", Hex16(Crc64(out.data(), out.size())), "\n");
  return out;
}

absl::StatusOr<Manifest> ParseManifest(const std::string& text, const std::string& name) {
  auto loss = [&name](const std::string& why) {
    return absl::DataLossError(absl::StrCat("checkpoint manifest ", name, ": ", why));
  };
  // The last line must be the checksum line; anything else means the file
  // was cut short (or is not a manifest).
  if (text.empty() || text.back() != '\n') return loss("truncated (no final newline)");
  const size_t last_start = text.rfind('\n', text.size() - 2);
  const size_t crc_line = last_start == std::string::npos ? 0 : last_start + 1;
  const std::string last = text.substr(crc_line, text.size() - 1 - crc_line);
  uint64_t stored = 0;
  if (last.size() != 6 + 16 || last.compare(0, 6, "crc64 ") != 0 ||
      !absl::SimpleHexAtoi(last.substr(6), &stored)) {
    return loss("truncated (no checksum line)");
  }
  if (Crc64(text.data(), crc_line) != stored) return loss("checksum mismatch (corrupted)");
  absl::StatusOr<Manifest> m = ParseBody(text.substr(0, crc_line));
  if (!m.ok()) return loss(std::string(m.status().message()));
  return m;
}

std::string ManifestPath(const std::string& step_dir) {
  return JoinPath(step_dir, kManifestFileName);
}

absl::Status WriteManifest(CheckpointStorage& storage, const std::string& path,
                           const Manifest& manifest) {
  if (absl::Status s = ValidateManifest(manifest); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint manifest ", path, ": ", s.message()));
  }
  const std::string text = SerializeManifest(manifest);
  return storage.WriteFileAtomic(path, std::string_view(text));
}

absl::StatusOr<Manifest> ReadManifest(CheckpointStorage& storage, const std::string& path) {
  absl::StatusOr<std::string> text = storage.Read(path);
  if (!text.ok()) return text.status();
  return ParseManifest(*text, path);
}

absl::Status CheckCompatible(const Manifest& manifest, const model::ParamLayout& layout) {
  if (manifest.config != layout.config() ||
      manifest.layout_fingerprint != layout.GlobalFingerprint()) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint of step ", manifest.step, " was saved for model ",
                     model::ToString(manifest.config), ", the job's model is ",
                     model::ToString(layout.config())));
  }
  return absl::OkStatus();
}

}  // namespace shardtrain::checkpoint
