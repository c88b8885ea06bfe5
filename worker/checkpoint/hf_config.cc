#include "worker/checkpoint/hf_config.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace shardtrain::checkpoint {
namespace {

using Json = nlohmann::json;

absl::Status Bad(const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("config.json: ", why));
}

// The shortest text that reads back as the same double (YAML's number).
std::string Number(double v) {
  for (int precision = 1; precision < 17; ++precision) {
    const std::string s = absl::StrFormat("%.*g", precision, v);
    if (std::strtod(s.c_str(), nullptr) == v) return s;
  }
  return absl::StrFormat("%.17g", v);
}

absl::StatusOr<model::RopeScaling> RopeScalingOf(const Json& j) {
  if (!j.contains("rope_scaling") || j["rope_scaling"].is_null()) return model::RopeScaling{};
  const Json& r = j["rope_scaling"];
  auto refuse = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("rope_scaling ", r.dump(), ": ", why));
  };
  if (!r.is_object()) return refuse("not an object");
  std::string type;
  for (const char* key : {"type", "rope_type"}) {  // transformers reads both, rope_type first
    if (r.contains(key) && r[key].is_string()) type = r[key].get<std::string>();
  }
  if (type == "default") return model::RopeScaling{};
  if (type != "llama3") {
    return refuse(absl::StrCat("rope_type ", type.empty() ? "missing" : type,
                               " is not implemented (shardtrain's rotary scaling is llama3's); "
                               "not read"));
  }
  model::RopeScaling out;
  double original = 0;
  for (auto [key, field] : {std::pair<const char*, double*>{"factor", &out.factor},
                            {"low_freq_factor", &out.low_freq_factor},
                            {"high_freq_factor", &out.high_freq_factor},
                            {"original_max_position_embeddings", &original}}) {
    if (!r.contains(key) || !r[key].is_number()) return refuse(absl::StrCat(key, " missing"));
    *field = r[key].get<double>();
  }
  if (!(original >= 1 && original <= 1e9) || original != std::floor(original)) {
    return refuse("original_max_position_embeddings is not a positive integer");
  }
  out.original_context = static_cast<int>(original);
  return out;
}

}  // namespace

absl::StatusOr<model::RopeScaling> HfRopeScaling(const std::string& text) {
  const Json j = Json::parse(text, nullptr, false);
  if (!j.is_object()) return Bad("not a JSON object");
  return RopeScalingOf(j);
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ModelFieldsFromHfConfig(
    const std::string& text) {
  const Json j = Json::parse(text, nullptr, false);
  if (!j.is_object()) return Bad("not a JSON object");
  std::string arch;
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string()) {
    arch = j["architectures"][0].get<std::string>();
  }
  std::vector<std::pair<std::string, std::string>> out;
  // An integer field (>= 1), or `fallback` when absent (0: required).
  auto integer = [&](const char* key, const char* ours, int64_t fallback) -> absl::Status {
    int64_t v = fallback;
    if (j.contains(key) && j[key].is_number_integer()) {
      v = j[key].get<int64_t>();
    } else if (j.contains(key) || fallback == 0) {
      return Bad(absl::StrCat(key, j.contains(key) ? " is not an integer" : " missing",
                              " (it gives model.", ours, ")"));
    }
    if (v < 1 || v > (int64_t{1} << 30)) {
      return Bad(absl::StrCat(key, " ", v, " is out of range (it gives model.", ours, ")"));
    }
    out.emplace_back(ours, absl::StrCat(v));
    return absl::OkStatus();
  };
  auto number = [&](const char* key, double fallback) {
    return j.contains(key) && j[key].is_number() ? j[key].get<double>() : fallback;
  };
  if (arch == "GPT2LMHeadModel") {
    out.emplace_back("arch", "gpt2");
    for (auto [key, ours] : {std::pair<const char*, const char*>{"n_layer", "layers"},
                             {"n_head", "heads"},
                             {"n_embd", "dim"},
                             {"n_positions", "context"},
                             {"vocab_size", "vocab"}}) {
      if (absl::Status s = integer(key, ours, 0); !s.ok()) return s;
    }
    return out;
  }
  const bool mixtral = arch == "MixtralForCausalLM", qwen3_moe = arch == "Qwen3MoeForCausalLM";
  if (arch != "LlamaForCausalLM" && arch != "MistralForCausalLM" && arch != "Qwen3ForCausalLM" &&
      !mixtral && !qwen3_moe) {
    return Bad(absl::StrCat("architectures ", arch.empty() ? "missing" : arch,
                            ": a model's shape is read from GPT2LMHeadModel, LlamaForCausalLM, "
                            "MistralForCausalLM, Qwen3ForCausalLM, MixtralForCausalLM and "
                            "Qwen3MoeForCausalLM configs"));
  }
  out.emplace_back("arch", "llama");
  for (auto [key, ours] : {std::pair<const char*, const char*>{"num_hidden_layers", "layers"},
                           {"num_attention_heads", "heads"},
                           {"hidden_size", "dim"},
                           {"max_position_embeddings", "context"},
                           {"vocab_size", "vocab"},
                           {"intermediate_size", "ffn_dim"}}) {
    if (absl::Status s = integer(key, ours, 0); !s.ok()) return s;
  }
  const int64_t heads = j["num_attention_heads"].get<int64_t>();
  const int64_t dim = j["hidden_size"].get<int64_t>();
  if (absl::Status s = integer("num_key_value_heads", "kv_heads", heads); !s.ok()) return s;
  // head_dim: set when it is not hidden_size / num_attention_heads (Qwen3).
  if (j.contains("head_dim") && !j["head_dim"].is_null()) {
    if (!j["head_dim"].is_number_integer() || j["head_dim"].get<int64_t>() < 1 ||
        j["head_dim"].get<int64_t>() > (1 << 20)) {
      return Bad(absl::StrCat("head_dim ", j["head_dim"].dump(), " is not a positive integer"));
    }
    if (j["head_dim"].get<int64_t>() * heads != dim) {
      out.emplace_back("head_dim", absl::StrCat(j["head_dim"].get<int64_t>()));
    }
  }
  out.emplace_back("qk_norm", arch == "Qwen3ForCausalLM" || qwen3_moe ? "true" : "false");
  // MoE layers: Mixtral's (every layer; intermediate_size is the experts',
  // gates renormalised) or Qwen3-MoE's (the layers of mlp_only_layers,
  // which must be the leading ones, dense).
  std::string moe = "none";
  if (mixtral || qwen3_moe) {
    std::vector<std::pair<std::string, std::string>> got;
    std::swap(got, out);  // `integer` appends to out: read the three apart
    for (auto [key, ours] :
         {std::pair<const char*, const char*>{mixtral ? "num_local_experts" : "num_experts",
                                              "moe.experts"},
          {"num_experts_per_tok", "moe.top_k"},
          {mixtral ? "intermediate_size" : "moe_intermediate_size", "moe.expert_ffn_dim"}}) {
      if (absl::Status s = integer(key, ours, 0); !s.ok()) return s;
    }
    std::swap(got, out);
    int dense = 0;
    if (qwen3_moe) {
      if (j.contains("decoder_sparse_step") && !(j["decoder_sparse_step"].is_number_integer() &&
                                                 j["decoder_sparse_step"].get<int64_t>() == 1)) {
        return Bad(absl::StrCat("decoder_sparse_step ", j["decoder_sparse_step"].dump(),
                                ": every layer from the first MoE one is MoE here (1)"));
      }
      if (j.contains("mlp_only_layers") && j["mlp_only_layers"].is_array()) {
        for (const Json& v : j["mlp_only_layers"]) {
          if (!v.is_number_integer() || v.get<int64_t>() != dense) {
            return Bad(absl::StrCat("mlp_only_layers ", j["mlp_only_layers"].dump(),
                                    ": the dense layers must be the leading ones (0, 1, ...)"));
          }
          ++dense;
        }
      }
    }
    const bool norm =
        mixtral || (j.contains("norm_topk_prob") && j["norm_topk_prob"].is_boolean() &&
                    j["norm_topk_prob"].get<bool>());
    moe = absl::StrCat("{experts: ", got[0].second, ", top_k: ", got[1].second,
                       ", expert_ffn_dim: ", got[2].second,
                       ", norm_topk_prob: ", norm ? "true" : "false",
                       ", first_dense_layers: ", dense, "}");
  }
  out.emplace_back("moe", moe);
  out.emplace_back("rope_theta", Number(number("rope_theta", 10000.0)));
  out.emplace_back("norm_eps", Number(number("rms_norm_eps", 1e-6)));
  const bool tied = j.contains("tie_word_embeddings") && j["tie_word_embeddings"].is_boolean() &&
                    j["tie_word_embeddings"].get<bool>();
  out.emplace_back("tie_embeddings", tied ? "true" : "false");
  absl::StatusOr<model::RopeScaling> r = RopeScalingOf(j);
  if (!r.ok()) return Bad(std::string(r.status().message()));
  out.emplace_back(
      "rope_scaling",
      !r->on() ? std::string("none")
               : absl::StrCat("{type: llama3, factor: ", Number(r->factor),
                              ", low_freq_factor: ", Number(r->low_freq_factor),
                              ", high_freq_factor: ", Number(r->high_freq_factor),
                              ", original_max_position_embeddings: ", r->original_context, "}"));
  return out;
}

absl::StatusOr<std::optional<std::string>> HfRouterAuxLossCoef(const std::string& text) {
  // ModelFieldsFromHfConfig validates the fields read here.
  SHARDTRAIN_ASSIGN_OR_RETURN(auto fields, ModelFieldsFromHfConfig(text));
  const Json j = Json::parse(text, nullptr, false);
  const bool moe =
      absl::c_any_of(fields, [](const auto& f) { return f.first == "moe" && f.second != "none"; });
  if (!moe || !j.contains("router_aux_loss_coef")) return std::nullopt;
  const Json& c = j["router_aux_loss_coef"];
  if (!c.is_number() || c.get<double>() < 0) {
    return Bad(absl::StrCat("router_aux_loss_coef ", c.dump(), " is not a number >= 0"));
  }
  const int64_t dense = j.contains("mlp_only_layers") && j["mlp_only_layers"].is_array()
                            ? static_cast<int64_t>(j["mlp_only_layers"].size())
                            : 0;
  const int64_t moe_layers = j["num_hidden_layers"].get<int64_t>() - dense;
  if (moe_layers < 1) return std::nullopt;
  return Number(c.get<double>() * static_cast<double>(j["num_experts_per_tok"].get<int64_t>()) /
                static_cast<double>(moe_layers));
}

std::string HfConfigPathOf(const std::string& init_path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(init_path, ec)) return (fs::path(init_path) / "config.json").string();
  return (fs::path(init_path).parent_path() / "config.json").string();
}

}  // namespace shardtrain::checkpoint
