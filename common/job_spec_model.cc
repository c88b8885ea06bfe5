// The job spec's model section (model.*): the family, its shape and
// recipe fields, rope_scaling, recomputation and the attention kernels
// (job_spec_read.h declares ParseModel and AttentionIsAuto for job_spec.cc).
#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "common/job_spec_internal.h"
#include "common/job_spec_read.h"
#include "common/model/config.h"
#include "common/status_macros.h"
#include "yaml-cpp/yaml.h"

namespace shardtrain::spec_read {

namespace si = spec_internal;  // enum spellings, shared with job_spec_yaml.cc

namespace {

// SwiGLU's default width (Meta's Llama rule): 2/3 of GPT's 4·dim, rounded up
// to a multiple of 256.
int DefaultFfnDim(int dim) {
  const int64_t f = (int64_t{8} * dim + 2) / 3;
  return static_cast<int>(std::min<int64_t>((f + 255) / 256 * 256, INT_MAX / 2));
}

// model.rope_scaling: `none` (off), or a map {type: llama3, factor,
// low_freq_factor, high_freq_factor, original_max_position_embeddings} —
// Hugging Face's names; every number required (a preset's are replaced
// whole). Range checks are ValidateModelConfig's, naming the same paths.
absl::Status ReadRopeScaling(const Node& model, model::RopeScaling* out) {
  if (!Present(model, "rope_scaling")) return absl::OkStatus();
  const Node n = model["rope_scaling"];
  const std::string path = "model.rope_scaling";
  if (n.IsScalar() && (n.Scalar() == "none" || n.Scalar() == "null")) {
    *out = model::RopeScaling{};
    return absl::OkStatus();
  }
  if (!n.IsMap()) {
    return FieldError(path,
                      "expected none or a map {type: llama3, factor, low_freq_factor, "
                      "high_freq_factor, original_max_position_embeddings}, got ",
                      Describe(n));
  }
  SHARDTRAIN_RETURN_IF_ERROR(CheckMap(n, path,
                                      {"type", "rope_type", "factor", "low_freq_factor",
                                       "high_freq_factor", "original_max_position_embeddings"}));
  std::string type;
  SHARDTRAIN_RETURN_IF_ERROR(ReadString(n, path, "type", &type));
  SHARDTRAIN_RETURN_IF_ERROR(ReadString(n, path, "rope_type", &type));  // Hugging Face's name
  if (type != "llama3") {
    return FieldError(
        path + ".type",
        type.empty() ? std::string("missing") : absl::StrCat("\"", absl::CEscape(type), "\""),
        ": only llama3 (Llama 3.1/3.2's frequency adjustment) is implemented");
  }
  model::RopeScaling r;
  for (const char* key :
       {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
    SHARDTRAIN_RETURN_IF_ERROR(Require(n, path, key));
  }
  SHARDTRAIN_RETURN_IF_ERROR(ReadDouble(n, path, "factor", 0.0, /*exclusive=*/true, &r.factor));
  SHARDTRAIN_RETURN_IF_ERROR(
      ReadDouble(n, path, "low_freq_factor", 0.0, /*exclusive=*/true, &r.low_freq_factor));
  SHARDTRAIN_RETURN_IF_ERROR(
      ReadDouble(n, path, "high_freq_factor", 0.0, /*exclusive=*/true, &r.high_freq_factor));
  SHARDTRAIN_RETURN_IF_ERROR(
      ReadInt(n, path, "original_max_position_embeddings", 1, &r.original_context));
  *out = r;
  return absl::OkStatus();
}

inline const si::EnumTable<model::RouterScoring> kScorings = {
    {"softmax", model::RouterScoring::kSoftmax}, {"sigmoid", model::RouterScoring::kSigmoid}};

// model.moe: `none` (off), or a map {experts, top_k, expert_ffn_dim,
// shared_experts, scoring, norm_topk_prob, first_dense_layers,
// router_bias}; experts and
// top_k required, expert_ffn_dim defaulting to the dense MLP's width
// (ffn_dim). Replaces a preset's whole. Cross-field checks are
// ValidateModelConfig's (model.moe.top_k naming model.moe.experts).
absl::Status ReadMoe(const Node& model, int ffn_dim, model::MoeConfig* out) {
  if (!Present(model, "moe")) return absl::OkStatus();
  const Node n = model["moe"];
  const std::string path = "model.moe";
  if (n.IsScalar() && (n.Scalar() == "none" || n.Scalar() == "null")) {
    *out = model::MoeConfig{};
    return absl::OkStatus();
  }
  if (!n.IsMap()) {
    return FieldError(path,
                      "expected none or a map {experts, top_k, expert_ffn_dim, shared_experts, "
                      "scoring, norm_topk_prob, first_dense_layers}, got ",
                      Describe(n));
  }
  SHARDTRAIN_RETURN_IF_ERROR(
      CheckMap(n, path,
               {"experts", "top_k", "expert_ffn_dim", "shared_experts", "scoring", "norm_topk_prob",
                "first_dense_layers", "router_bias"}));
  for (const char* key : {"experts", "top_k"}) SHARDTRAIN_RETURN_IF_ERROR(Require(n, path, key));
  model::MoeConfig m;
  m.expert_ffn_dim = ffn_dim;
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, path, "experts", 1, &m.experts));
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, path, "top_k", 1, &m.top_k));
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, path, "expert_ffn_dim", 1, &m.expert_ffn_dim));
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, path, "shared_experts", 0, &m.shared_experts));
  SHARDTRAIN_RETURN_IF_ERROR(ReadEnum(n, path, "scoring", kScorings, &m.scoring));
  SHARDTRAIN_RETURN_IF_ERROR(ReadBool(n, path, "norm_topk_prob", &m.norm_topk_prob));
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, path, "first_dense_layers", 0, &m.first_dense_layers));
  SHARDTRAIN_RETURN_IF_ERROR(ReadBool(n, path, "router_bias", &m.router_bias));
  *out = m;
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseRouter(const Node& root, RouterSpec* r) {
  SHARDTRAIN_ASSIGN_OR_RETURN(Node n, Section(root, "router"));
  SHARDTRAIN_RETURN_IF_ERROR(
      ReadDouble(n, "router", "aux_loss_coef", 0.0, /*exclusive=*/false, &r->aux_loss_coef));
  SHARDTRAIN_RETURN_IF_ERROR(
      ReadDouble(n, "router", "z_loss_coef", 0.0, /*exclusive=*/false, &r->z_loss_coef));
  SHARDTRAIN_RETURN_IF_ERROR(
      ReadDouble(n, "router", "bias_update_rate", 0.0, /*exclusive=*/false, &r->bias_update_rate));
  SHARDTRAIN_RETURN_IF_ERROR(
      ReadDouble(n, "router", "capacity_factor", 0.0, /*exclusive=*/false, &r->capacity_factor));
  return absl::OkStatus();
}

// model.attention absent or "auto": the job gets flash where its kernels
// serve it, materialized elsewhere (ResolveAttention).
bool AttentionIsAuto(const Node& model) {
  return !Present(model, "attention") ||
         (model["attention"].IsScalar() && model["attention"].Scalar() == "auto");
}

absl::Status ParseModel(const Node& root, ModelSpec* m) {
  SHARDTRAIN_RETURN_IF_ERROR(Require(root, "", "model"));
  SHARDTRAIN_ASSIGN_OR_RETURN(Node n, Section(root, "model"));
  SHARDTRAIN_RETURN_IF_ERROR(ReadString(n, "model", "preset", &m->preset));
  bool llama_fields_given = false;  // the preset's, or the ones set below
  if (!m->preset.empty()) {
    absl::StatusOr<model::ModelConfig> preset = model::ModelPreset(m->preset);
    if (!preset.ok()) return FieldError("model.preset", preset.status().message());
    m->arch = preset->arch;
    m->layers = preset->layers;
    m->heads = preset->heads;
    m->dim = preset->dim;
    m->context = preset->context;
    m->vocab = preset->vocab;
    if (preset->arch == model::Arch::kLlama) {
      m->kv_heads = preset->kv_heads;
      m->ffn_dim = preset->ffn_dim;
      m->rope_theta = preset->rope_theta;
      m->norm_eps = preset->norm_eps;
      m->tie_embeddings = preset->tie_embeddings;
      m->rope_scaling = preset->rope_scaling;
      m->head_dim = preset->head_size;
      m->qk_norm = preset->qk_norm;
      llama_fields_given = true;
    }
    m->moe = preset->moe;
  } else {
    for (const char* key : {"layers", "heads", "dim", "context", "vocab"}) {
      SHARDTRAIN_RETURN_IF_ERROR(
          Require(n, "model", key,
                  " (or set model.preset, or only model.init: a Hugging Face checkpoint whose "
                  "config.json the CLI reads)"));
    }
  }
  const model::Arch preset_arch = m->arch;
  SHARDTRAIN_RETURN_IF_ERROR(ReadEnum(n, "model", "arch", si::kArchs, &m->arch));
  if (!m->preset.empty() && m->arch != preset_arch) {
    return FieldError("model.arch", model::ArchName(m->arch), " conflicts with model.preset ",
                      m->preset, " (a ", model::ArchName(preset_arch), " model)");
  }
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, "model", "layers", 1, &m->layers));
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, "model", "heads", 1, &m->heads));
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, "model", "dim", 1, &m->dim));
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, "model", "context", 1, &m->context));
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, "model", "vocab", 1, &m->vocab));
  if (m->arch == model::Arch::kGpt2) {
    for (const char* key : {"kv_heads", "ffn_dim", "rope_theta", "rope_scaling", "norm_eps",
                            "tie_embeddings", "head_dim", "qk_norm"}) {
      if (Present(n, key)) {
        return FieldError(absl::StrCat("model.", key),
                          "only for model.arch: llama (GPT-2 has kv_heads = heads, ffn_dim = "
                          "4·dim, learned positions, LayerNorm eps 1e-5 and a tied LM head)");
      }
    }
    const ModelSpec defaults;
    m->kv_heads = defaults.kv_heads;
    m->ffn_dim = defaults.ffn_dim;
    m->rope_theta = defaults.rope_theta;
    m->norm_eps = defaults.norm_eps;
    m->tie_embeddings = defaults.tie_embeddings;
    m->rope_scaling = defaults.rope_scaling;
    m->head_dim = defaults.head_dim;
    m->qk_norm = defaults.qk_norm;
  } else {
    if (!llama_fields_given) {
      m->kv_heads = m->heads;
      m->ffn_dim = DefaultFfnDim(m->dim);
    }
    SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, "model", "kv_heads", 1, &m->kv_heads));
    SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, "model", "ffn_dim", 1, &m->ffn_dim));
    SHARDTRAIN_RETURN_IF_ERROR(
        ReadDouble(n, "model", "rope_theta", 0.0, /*exclusive=*/true, &m->rope_theta));
    SHARDTRAIN_RETURN_IF_ERROR(
        ReadDouble(n, "model", "norm_eps", 0.0, /*exclusive=*/true, &m->norm_eps));
    SHARDTRAIN_RETURN_IF_ERROR(ReadBool(n, "model", "tie_embeddings", &m->tie_embeddings));
    SHARDTRAIN_RETURN_IF_ERROR(ReadRopeScaling(n, &m->rope_scaling));
    SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, "model", "head_dim", 1, &m->head_dim));
    SHARDTRAIN_RETURN_IF_ERROR(ReadBool(n, "model", "qk_norm", &m->qk_norm));
  }
  SHARDTRAIN_RETURN_IF_ERROR(
      ReadMoe(n, m->arch == model::Arch::kGpt2 ? 4 * m->dim : m->ffn_dim, &m->moe));
  SHARDTRAIN_RETURN_IF_ERROR(ReadString(n, "model", "init", &m->init));
  SHARDTRAIN_RETURN_IF_ERROR(ReadString(n, "model", "adapter", &m->adapter));
  SHARDTRAIN_RETURN_IF_ERROR(ReadEnum(n, "model", "recompute", si::kRecomputes, &m->recompute));
  SHARDTRAIN_RETURN_IF_ERROR(ReadInt(n, "model", "recompute_layers", 1, &m->recompute_layers));
  if (m->recompute_layers > 0 && m->recompute == Recompute::kNone) {
    return FieldError("model.recompute_layers",
                      "needs model.recompute: selective or full (it is none)");
  }
  // auto (the default) is resolved once the whole spec is read
  // (ResolveAttention).
  if (!AttentionIsAuto(n)) {
    SHARDTRAIN_RETURN_IF_ERROR(
        ReadEnum(n, "model", "attention", si::kAttentionKinds, &m->attention));
  }
  return m->Config().status();
}

}  // namespace shardtrain::spec_read
