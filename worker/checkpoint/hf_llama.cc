#include "worker/checkpoint/hf_llama.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/model/param_layout.h"
#include "common/process.h"
#include "worker/checkpoint/hf_config.h"
#include "worker/checkpoint/safetensors.h"

namespace shardtrain::checkpoint {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Where the rows of one of our tensors come from: consecutive parts, each a
// Hugging Face tensor of `rows` rows (`rotary`: q or k, its rows permuted
// within heads of hs); rows past the parts (the padded vocabulary) are zero.
struct Part {
  std::string hf;
  int64_t rows = 0;
  bool rotary = false;
};
struct Source {
  std::vector<Part> parts;
  int64_t rows = 0, cols = 1;  // our tensor's (cols 1 for a vector)
};

int64_t HfRow(int64_t r, int hs) { return HfRotaryRow(r, hs); }

// The sources of every tensor of the whole layout, in its order. MoE layers
// (HfFamilyOf: Mixtral's block_sparse_moe or Qwen3-MoE's mlp): the router
// is the `gate` (E, C); an expert's fc is [w1; w3] or [gate_proj; up_proj],
// its proj w2 or down_proj.
std::vector<Source> SourcesOf(const model::ParamLayout& whole) {
  const model::ModelConfig& c = whole.config();
  const int64_t C = c.dim, Q = c.q_dim(), KV = c.kv_dim(), F = c.ffn_dim, V = c.vocab;
  const int64_t hs = c.head_dim(), He = c.moe.expert_ffn_dim;
  const bool mixtral = !c.qk_norm;  // of the MoE families
  const std::string moe = mixtral ? "block_sparse_moe." : "mlp.";
  std::vector<Source> out;
  for (const model::TensorInfo& t : whole.tensors()) {
    Source s;
    s.rows = t.shape[0];
    s.cols = t.shape.size() > 1 ? t.shape[1] : 1;
    const std::string& n = t.name;
    if (n == "wte") {
      s.parts = {{"model.embed_tokens.weight", V}};
    } else if (n == "lm_head") {
      s.parts = {{"lm_head.weight", V}};
    } else if (n == "lnf.weight") {
      s.parts = {{"model.norm.weight", C}};
    } else {  // block.L.<rest>
      const size_t dot = n.find('.', 6);
      const std::string l = n.substr(6, dot - 6), rest = n.substr(dot + 1);
      const std::string p = "model.layers." + l + ".";
      if (rest == "ln1.weight") {
        s.parts = {{p + "input_layernorm.weight", C}};
      } else if (rest == "attn.qkv.weight") {
        s.parts = {{p + "self_attn.q_proj.weight", Q, true},
                   {p + "self_attn.k_proj.weight", KV, true},
                   {p + "self_attn.v_proj.weight", KV}};
      } else if (rest == "attn.q_norm.weight") {  // channels of one head: permuted as q's rows
        s.parts = {{p + "self_attn.q_norm.weight", hs, true}};
      } else if (rest == "attn.k_norm.weight") {
        s.parts = {{p + "self_attn.k_norm.weight", hs, true}};
      } else if (rest == "attn.proj.weight") {
        s.parts = {{p + "self_attn.o_proj.weight", C}};
      } else if (rest == "ln2.weight") {
        s.parts = {{p + "post_attention_layernorm.weight", C}};
      } else if (rest == "mlp.fc.weight") {
        s.parts = {{p + "mlp.gate_proj.weight", F}, {p + "mlp.up_proj.weight", F}};
      } else if (rest == "mlp.proj.weight") {
        s.parts = {{p + "mlp.down_proj.weight", C}};
      } else if (rest == "mlp.router.weight") {
        s.parts = {{p + moe + "gate.weight", c.moe.experts}};
      } else {  // mlp.experts.<e>.fc.weight or .proj.weight
        const std::string e = rest.substr(12, rest.find('.', 12) - 12);
        const std::string x = p + moe + "experts." + e + ".";
        if (rest.size() >= 9 && rest.compare(rest.size() - 9, 9, "fc.weight") == 0) {
          s.parts =
              mixtral ? std::vector<Part>{{x + "w1.weight", He}, {x + "w3.weight", He}}
                      : std::vector<Part>{{x + "gate_proj.weight", He}, {x + "up_proj.weight", He}};
        } else {
          s.parts = {{x + (mixtral ? "w2.weight" : "down_proj.weight"), C}};
        }
      }
    }
    out.push_back(std::move(s));
  }
  return out;
}

// A Hugging Face tensor's shape: (rows, cols), or (rows) for a vector.
std::vector<int64_t> HfShape(const Part& part, int64_t cols) {
  return cols == 1 ? std::vector<int64_t>{part.rows} : std::vector<int64_t>{part.rows, cols};
}

class HfLlamaSource : public WeightsSource {
 public:
  HfLlamaSource(const model::ModelConfig& config, std::unique_ptr<SafetensorsSet> set)
      : whole_(config), sources_(SourcesOf(whole_)), set_(std::move(set)) {}

  // Every tensor present with the model's shape.
  absl::Status Check() const {
    for (const Source& s : sources_) {
      for (const Part& p : s.parts) {
        const SafetensorsEntry* e = set_->Find(p.hf);
        const std::vector<int64_t> want = HfShape(p, s.cols);
        if (e == nullptr) {
          return absl::InvalidArgumentError(absl::StrCat(p.hf, ": missing from the checkpoint in ",
                                                         set_->dir(), " (shape ", ShapeText(want),
                                                         " for the model)"));
        }
        if (e->shape != want) {
          return absl::InvalidArgumentError(absl::StrCat(p.hf, ": shape ", ShapeText(e->shape),
                                                         " in the file, ", ShapeText(want),
                                                         " for the model"));
        }
      }
    }
    return absl::OkStatus();
  }

  absl::Status Read(size_t global, size_t n, float* out) override {
    if (global > whole_.num_params() || n > whole_.num_params() - global) {
      return absl::OutOfRangeError(absl::StrCat("elements [", global, ", ", global + n,
                                                ") outside the model's ", whole_.num_params()));
    }
    const size_t end = global + n;
    const int hs = whole_.config().head_dim();
    for (size_t k = 0; k < sources_.size(); ++k) {
      const model::TensorInfo& t = whole_.tensors()[k];
      const size_t lo = std::max(global, t.offset), hi = std::min(end, t.offset + t.numel);
      if (lo >= hi) continue;
      const Source& s = sources_[k];
      // Row by row of the part [lo, hi) of this tensor: a run of identity
      // rows is one read.
      int64_t e = int64_t(lo - t.offset);
      const int64_t stop = int64_t(hi - t.offset);
      while (e < stop) {
        const int64_t row = e / s.cols, col = e % s.cols;
        int64_t part_first = 0;
        const Part* part = nullptr;
        for (const Part& p : s.parts) {
          if (row < part_first + p.rows) {
            part = &p;
            break;
          }
          part_first += p.rows;
        }
        float* dst = out + (t.offset + size_t(e) - global);
        if (part == nullptr) {  // padded vocabulary rows: zero
          const int64_t k_end = stop;
          std::fill(dst, dst + (k_end - e), 0.0f);
          e = k_end;
          continue;
        }
        const int64_t r = row - part_first;
        int64_t count;
        int64_t first;
        if (part->rotary) {
          count = std::min(stop - e, s.cols - col);  // to the end of the row
          first = HfRow(r, hs) * s.cols + col;
        } else {  // to the end of the part
          count = std::min(stop - e, (part_first + part->rows) * s.cols - e);
          first = r * s.cols + col;
        }
        if (absl::Status st = set_->Read(part->hf, first, count, dst); !st.ok()) return st;
        e += count;
      }
    }
    return absl::OkStatus();
  }

  ReadStats Stats() const override { return set_->Stats(); }

 private:
  const model::ParamLayout whole_;
  const std::vector<Source> sources_;
  std::unique_ptr<SafetensorsSet> set_;
};

std::string FormatNumber(double v) {
  if (v == std::floor(v) && std::abs(v) < 1e15) return absl::StrCat(int64_t(v));
  for (int precision = 1; precision <= 17; ++precision) {
    const std::string s = absl::StrFormat("%.*g", precision, v);
    double back = 0;
    if (absl::SimpleAtod(s, &back) && back == v) return s;
  }
  return absl::StrFormat("%.17g", v);
}

std::string RopeScalingText(const model::RopeScaling& r) {
  if (!r.on()) return "none";
  return absl::StrCat("{type: llama3, factor: ", FormatNumber(r.factor),
                      ", low_freq_factor: ", FormatNumber(r.low_freq_factor),
                      ", high_freq_factor: ", FormatNumber(r.high_freq_factor),
                      ", original_max_position_embeddings: ", r.original_context, "}");
}

}  // namespace

const char* HfArchitecture(const model::ModelConfig& c) {
  if (c.moe.on()) return c.qk_norm ? "Qwen3MoeForCausalLM" : "MixtralForCausalLM";
  return c.qk_norm ? "Qwen3ForCausalLM" : "LlamaForCausalLM";
}

namespace {

// What the Hugging Face MoE families here hold: no ungated shared experts,
// softmax scoring; Mixtral also renormalised gates and no dense layers.
absl::Status CheckHfMoe(const model::ModelConfig& c) {
  if (!c.moe.on()) return absl::OkStatus();
  const model::MoeConfig& m = c.moe;
  if (m.shared_experts > 0 || m.scoring != model::RouterScoring::kSoftmax || m.router_bias) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.moe: shared_experts ", m.shared_experts, ", scoring ",
        m.scoring == model::RouterScoring::kSigmoid ? "sigmoid" : "softmax",
        m.router_bias ? ", router_bias true" : "",
        ": the Hugging Face MoE families read and written here (Mixtral, Qwen3-MoE) have no "
        "ungated shared experts or choice bias and score by softmax"));
  }
  if (!c.qk_norm && (!m.norm_topk_prob || m.first_dense_layers > 0)) {
    return absl::InvalidArgumentError(
        "model.moe: Mixtral renormalises its top-k gates (norm_topk_prob true) and has no dense "
        "layers (first_dense_layers 0)");
  }
  return absl::OkStatus();
}

}  // namespace

std::string HfLlamaConfigJson(const model::ModelConfig& c, DataType dtype) {
  // q/k norms are Qwen3's block (the same otherwise); MoE layers Mixtral's
  // or Qwen3-MoE's.
  const bool moe = c.moe.on();
  Json j = {
      {"architectures", {HfArchitecture(c)}},
      {"model_type", moe         ? (c.qk_norm ? "qwen3_moe" : "mixtral")
                     : c.qk_norm ? "qwen3"
                                 : "llama"},
      {"hidden_size", c.dim},
      {"intermediate_size", c.ffn_dim},
      {"num_hidden_layers", c.layers},
      {"num_attention_heads", c.heads},
      {"num_key_value_heads", c.kv_heads},
      {"head_dim", c.head_dim()},
      {"vocab_size", c.vocab},
      {"max_position_embeddings", c.context},
      {"rms_norm_eps", c.norm_eps},
      {"rope_theta", c.rope_theta},
      {"rope_scaling", nullptr},
      {"tie_word_embeddings", c.tie_embeddings},
      {"hidden_act", "silu"},
      {"attention_bias", false},
      {"mlp_bias", false},
      {"use_sliding_window", false},
      {"attention_dropout", 0.0},
      {"initializer_range", 0.02},
      {"torch_dtype", dtype == DataType::kBFloat16 ? "bfloat16" : "float32"},
  };
  if (const model::RopeScaling& r = c.rope_scaling; r.on()) {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", r.factor},
                         {"low_freq_factor", r.low_freq_factor},
                         {"high_freq_factor", r.high_freq_factor},
                         {"original_max_position_embeddings", r.original_context}};
  }
  if (c.vocab == 128256) {  // Llama 3's vocabulary: <|begin_of_text|>, <|end_of_text|>
    j["bos_token_id"] = 128000;
    j["eos_token_id"] = 128001;
  }
  if (moe && !c.qk_norm) {  // Mixtral: intermediate_size is the experts'
    j["intermediate_size"] = c.moe.expert_ffn_dim;
    j["num_local_experts"] = c.moe.experts;
    j["num_experts_per_tok"] = c.moe.top_k;
    j["output_router_logits"] = false;
  } else if (moe) {  // Qwen3-MoE: the leading dense layers keep intermediate_size
    std::vector<int> dense(c.moe.first_dense_layers);
    for (int l = 0; l < c.moe.first_dense_layers; ++l) dense[l] = l;
    j["num_experts"] = c.moe.experts;
    j["num_experts_per_tok"] = c.moe.top_k;
    j["moe_intermediate_size"] = c.moe.expert_ffn_dim;
    j["norm_topk_prob"] = c.moe.norm_topk_prob;
    j["decoder_sparse_step"] = 1;
    j["mlp_only_layers"] = dense;
    j["output_router_logits"] = false;
  }
  return j.dump(2) + "\n";
}

absl::Status CheckHfLlamaConfig(const std::string& text, const model::ModelConfig& c) {
  const Json j = Json::parse(text, nullptr, false);
  auto bad = [](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: ", why));
  };
  if (!j.is_object()) return bad("not a JSON object");
  std::string arch;
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string()) {
    arch = j["architectures"][0].get<std::string>();
  }
  if (arch != "LlamaForCausalLM" && arch != "MistralForCausalLM" && arch != "Qwen3ForCausalLM" &&
      arch != "MixtralForCausalLM" && arch != "Qwen3MoeForCausalLM") {
    return bad(absl::StrCat("architectures ", arch.empty() ? "missing" : arch,
                            ": shardtrain reads LlamaForCausalLM, MistralForCausalLM, "
                            "Qwen3ForCausalLM, MixtralForCausalLM and Qwen3MoeForCausalLM for "
                            "model.arch: llama"));
  }
  const bool qwen3 = arch == "Qwen3ForCausalLM" || arch == "Qwen3MoeForCausalLM";
  if (qwen3 != c.qk_norm) {
    return bad(absl::StrCat("architectures ", arch, " (", qwen3 ? "with" : "without",
                            " q/k norms), the spec's model.qk_norm ",
                            c.qk_norm ? "true" : "false"));
  }
  const bool moe = arch == "MixtralForCausalLM" || arch == "Qwen3MoeForCausalLM";
  if (moe != c.moe.on()) {
    return bad(absl::StrCat("architectures ", arch, " (", moe ? "with" : "without",
                            " MoE layers), the spec's model.moe ",
                            c.moe.on() ? "has experts" : "none"));
  }
  if (absl::Status s = CheckHfMoe(c); !s.ok()) return s;
  if (j.contains("use_sliding_window") && j["use_sliding_window"].is_boolean() &&
      j["use_sliding_window"].get<bool>()) {
    return bad("use_sliding_window true: shardtrain attends over the whole context");
  }
  // An integer field against the spec's; `fallback` when absent (-1: required).
  auto int_field = [&](const char* key, int want, const char* ours, int fallback) -> absl::Status {
    int64_t v = fallback;
    if (j.contains(key) && j[key].is_number_integer()) {
      v = j[key].get<int64_t>();
    } else if (fallback < 0) {
      return bad(absl::StrCat(key, " missing (the spec's ", ours, " is ", want, ")"));
    }
    if (v != want) return bad(absl::StrCat(key, " ", v, ", the spec's ", ours, " ", want));
    return absl::OkStatus();
  };
  std::vector<std::tuple<const char*, int, const char*, int>> fields = {
      {"hidden_size", c.dim, "model.dim", -1},
      {"num_hidden_layers", c.layers, "model.layers", -1},
      {"num_attention_heads", c.heads, "model.heads", -1},
      {"num_key_value_heads", c.kv_heads, "model.kv_heads", c.heads},
      {"vocab_size", c.vocab, "model.vocab", -1},
      {"head_dim", c.head_dim(), c.head_size > 0 ? "model.head_dim" : "model.dim / model.heads",
       c.head_dim()}};
  const model::MoeConfig& m = c.moe;
  if (arch == "MixtralForCausalLM") {  // its intermediate_size is the experts'
    fields.insert(fields.end(),
                  {{"intermediate_size", m.expert_ffn_dim, "model.moe.expert_ffn_dim", -1},
                   {"num_local_experts", m.experts, "model.moe.experts", -1},
                   {"num_experts_per_tok", m.top_k, "model.moe.top_k", -1}});
  } else if (moe) {
    fields.insert(fields.end(),
                  {{"moe_intermediate_size", m.expert_ffn_dim, "model.moe.expert_ffn_dim", -1},
                   {"num_experts", m.experts, "model.moe.experts", -1},
                   {"num_experts_per_tok", m.top_k, "model.moe.top_k", -1},
                   {"decoder_sparse_step", 1, "(every layer from the first MoE one: 1)", 1}});
    if (m.first_dense_layers > 0) {
      fields.push_back({"intermediate_size", c.ffn_dim, "model.ffn_dim", -1});
    }
  } else {
    fields.push_back({"intermediate_size", c.ffn_dim, "model.ffn_dim", -1});
  }
  for (auto [key, want, ours, fallback] : fields) {
    if (absl::Status s = int_field(key, want, ours, fallback); !s.ok()) return s;
  }
  if (arch == "Qwen3MoeForCausalLM") {
    const bool norm = j.contains("norm_topk_prob") && j["norm_topk_prob"].is_boolean() &&
                      j["norm_topk_prob"].get<bool>();
    if (norm != m.norm_topk_prob) {
      return bad(absl::StrCat("norm_topk_prob ", norm ? "true" : "false",
                              ", the spec's model.moe.norm_topk_prob ",
                              m.norm_topk_prob ? "true" : "false"));
    }
    // mlp_only_layers: the leading dense layers (model.moe.first_dense_layers).
    std::vector<int> dense;
    if (j.contains("mlp_only_layers") && j["mlp_only_layers"].is_array()) {
      for (const Json& v : j["mlp_only_layers"])
        dense.push_back(v.is_number_integer() ? v.get<int>() : -1);
    }
    std::vector<int> want(m.first_dense_layers);
    for (int l = 0; l < m.first_dense_layers; ++l) want[l] = l;
    if (dense != want) {
      return bad(absl::StrCat("mlp_only_layers [", absl::StrJoin(dense, ", "),
                              "]: the dense layers here are the first model.moe."
                              "first_dense_layers (",
                              m.first_dense_layers, ")"));
    }
  }
  auto number = [&](const char* key, double fallback) {
    return j.contains(key) && j[key].is_number() ? j[key].get<double>() : fallback;
  };
  const double eps = number("rms_norm_eps", 1e-6), theta = number("rope_theta", 10000.0);
  if (std::abs(eps - c.norm_eps) > 1e-12 * std::abs(c.norm_eps)) {
    return bad(absl::StrCat("rms_norm_eps ", FormatNumber(eps), ", the spec's model.norm_eps ",
                            FormatNumber(c.norm_eps)));
  }
  if (std::abs(theta - c.rope_theta) > 1e-9 * std::abs(c.rope_theta)) {
    return bad(absl::StrCat("rope_theta ", FormatNumber(theta), ", the spec's model.rope_theta ",
                            FormatNumber(c.rope_theta)));
  }
  const bool tied = j.contains("tie_word_embeddings") && j["tie_word_embeddings"].is_boolean()
                        ? j["tie_word_embeddings"].get<bool>()
                        : false;
  if (tied != c.tie_embeddings) {
    return bad(absl::StrCat("tie_word_embeddings ", tied ? "true" : "false",
                            ", the spec's model.tie_embeddings ",
                            c.tie_embeddings ? "true" : "false"));
  }
  absl::StatusOr<model::RopeScaling> scaling = HfRopeScaling(text);
  if (!scaling.ok()) return bad(std::string(scaling.status().message()));
  if (*scaling != c.rope_scaling) {
    return bad(absl::StrCat("rope_scaling ", RopeScalingText(*scaling),
                            ", the spec's model.rope_scaling ", RopeScalingText(c.rope_scaling)));
  }
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    if (j.contains(key) && j[key].is_boolean() && j[key].get<bool>()) {
      return bad(absl::StrCat(key, " true: the Llama block here has no biases"));
    }
  }
  const std::string act = j.contains("hidden_act") && j["hidden_act"].is_string()
                              ? j["hidden_act"].get<std::string>()
                              : "silu";
  if (act != "silu") return bad(absl::StrCat("hidden_act ", act, ": SwiGLU here uses silu"));
  if (arch == "MistralForCausalLM" && j.contains("sliding_window") &&
      j["sliding_window"].is_number_integer() &&
      j["sliding_window"].get<int64_t>() < int64_t{c.context}) {
    return bad(absl::StrCat("sliding_window ", j["sliding_window"].get<int64_t>(),
                            " is shorter than the spec's model.context ", c.context,
                            ": shardtrain attends over the whole context"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<WeightsSource>> OpenHfLlama(const std::string& path,
                                                           const model::ModelConfig& config) {
  if (config.arch != model::Arch::kLlama) {
    return absl::InvalidArgumentError(absl::StrCat("a Hugging Face Llama checkpoint for a ",
                                                   model::ArchName(config.arch), " model"));
  }
  absl::StatusOr<std::unique_ptr<SafetensorsSet>> set = SafetensorsSet::Open(path);
  if (!set.ok()) return set.status();
  const std::string config_path = (*set)->dir() + "/config.json";
  std::string text;
  if (absl::Status s = ReadFile(config_path, &text); !s.ok()) {
    return absl::NotFoundError(absl::StrCat(config_path,
                                            " is missing: a Hugging Face Llama "
                                            "checkpoint's config.json lies beside its weights"));
  }
  if (absl::Status s = CheckHfLlamaConfig(text, config); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat((*set)->dir(), "/", s.message()));
  }
  auto source = std::make_unique<HfLlamaSource>(config, *std::move(set));
  if (absl::Status s = source->Check(); !s.ok()) return s;
  return source;
}

int64_t HfRotaryRow(int64_t r, int hs) {
  const int64_t head = r / hs, j = r % hs;
  return head * hs + (j % 2 == 0 ? j / 2 : hs / 2 + j / 2);
}

absl::Status ExportHfLlama(const model::ModelConfig& config, absl::Span<const float> params,
                           const std::string& dir, const HfExportOptions& options) {
  if (config.arch != model::Arch::kLlama) {
    return absl::InvalidArgumentError("ExportHfLlama: not a Llama model");
  }
  if (absl::Status s = CheckHfMoe(config); !s.ok()) return s;
  const model::ParamLayout whole(config);
  if (params.size() != whole.num_params()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ExportHfLlama: ", params.size(), " parameters for a layout of ", whole.num_params()));
  }
  const std::vector<Source> sources = SourcesOf(whole);
  const int hs = config.head_dim();
  // Each Hugging Face tensor, in the order transformers writes them.
  struct Out {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<float> data;
  };
  auto materialize = [&](size_t k) {
    std::vector<Out> outs;
    const model::TensorInfo& t = whole.tensors()[k];
    const Source& s = sources[k];
    int64_t first_row = 0;
    for (const Part& p : s.parts) {
      Out o{p.hf, HfShape(p, s.cols), std::vector<float>(size_t(p.rows * s.cols))};
      for (int64_t r = 0; r < p.rows; ++r) {
        const int64_t to = p.rotary ? HfRow(r, hs) : r;
        const float* src = params.data() + t.offset + size_t((first_row + r) * s.cols);
        std::copy(src, src + s.cols, o.data.begin() + to * s.cols);
      }
      first_row += p.rows;
      outs.push_back(std::move(o));
    }
    return outs;
  };
  // Shards: consecutive tensors up to max_shard_bytes each (a tensor larger
  // than that is a shard of its own). First their sizes, to name the files.
  std::vector<std::vector<size_t>> shards(1);  // tensor indices of the layout
  int64_t bytes = 0, total = 0;
  const int64_t eb = int64_t(DataTypeSize(options.dtype));
  for (size_t k = 0; k < whole.tensors().size(); ++k) {
    int64_t b = 0;
    for (const Part& p : sources[k].parts) b += p.rows * sources[k].cols * eb;
    if (bytes > 0 && bytes + b > options.max_shard_bytes) {
      shards.emplace_back();
      bytes = 0;
    }
    shards.back().push_back(k);
    bytes += b;
    total += b;
  }
  const int n = static_cast<int>(shards.size());
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"source", "shardtrain"}};
  Json weight_map = Json::object();
  for (int i = 0; i < n; ++i) {
    const std::string file =
        n == 1 ? "model.safetensors" : absl::StrFormat("model-%05d-of-%05d.safetensors", i + 1, n);
    std::vector<Out> outs;
    for (size_t k : shards[i]) {
      for (Out& o : materialize(k)) outs.push_back(std::move(o));
    }
    std::vector<TensorToWrite> list;
    for (const Out& o : outs) {
      list.push_back({o.name, o.shape, o.data});
      weight_map[o.name] = file;
    }
    if (absl::Status s = WriteSafetensorsFile(dir + "/" + file, list, options.dtype, metadata);
        !s.ok()) {
      return s;
    }
  }
  if (n > 1) {
    const Json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    if (absl::Status s =
            WriteFileAtomically(dir + "/model.safetensors.index.json", index.dump(2) + "\n");
        !s.ok()) {
      return s;
    }
  }
  if (absl::Status s =
          WriteFileAtomically(dir + "/config.json", HfLlamaConfigJson(config, options.dtype));
      !s.ok()) {
    return s;
  }
  Json generation = {{"_from_model_config", true}};
  if (config.vocab == 128256) {
    generation["bos_token_id"] = 128000;
    generation["eos_token_id"] = 128001;
  }
  return WriteFileAtomically(dir + "/generation_config.json", generation.dump(2) + "\n");
}

absl::StatusOr<int64_t> ParseShardSize(const std::string& text) {
  std::string digits = text, unit;
  while (!digits.empty() && std::isalpha(static_cast<unsigned char>(digits.back()))) {
    unit.insert(unit.begin(), digits.back());
    digits.pop_back();
  }
  double v = 0;
  const std::map<std::string, double> units = {
      {"", 1},     {"B", 1},        {"KB", 1e3},        {"MB", 1e6},
      {"GB", 1e9}, {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}};
  const auto u = units.find(unit);
  if (u == units.end() || !absl::SimpleAtod(digits, &v) || !(v > 0) || v * u->second > 1e18) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-shard-size: expected a size like 5GB, 500MB or 2GiB, got \"", text, "\""));
  }
  return static_cast<int64_t>(v * u->second);
}

}  // namespace shardtrain::checkpoint
