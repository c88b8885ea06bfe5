#include "worker/checkpoint/hf_peft.h"

#include <deque>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/model/lora.h"
#include "common/model/param_layout.h"
#include "common/process.h"
#include "worker/checkpoint/hf_llama.h"
#include "worker/checkpoint/safetensors.h"

namespace shardtrain::checkpoint {
namespace {

// PEFT's module name of each target in a LlamaForCausalLM's decoder layer.
const char* PeftModule(model::LoraTarget t) {
  constexpr const char* kModules[model::kNumLoraTargets] = {
      "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
      "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
  return kModules[t];
}

}  // namespace

std::string PeftAdapterConfigJson(const model::ModelConfig& config) {
  nlohmann::ordered_json j;
  std::vector<std::string> modules;
  for (int t = 0; t < model::kNumLoraTargets; ++t) {
    if (!config.lora.has(model::LoraTarget(t))) continue;
    const std::string m = PeftModule(model::LoraTarget(t));
    modules.push_back(m.substr(m.find('.') + 1));
  }
  j["peft_type"] = "LORA";
  j["task_type"] = "CAUSAL_LM";
  j["base_model_name_or_path"] = nullptr;
  j["r"] = config.lora.rank;
  const double alpha = config.lora.alpha;  // an integer where it is one, as PEFT writes it
  if (alpha == static_cast<double>(static_cast<int64_t>(alpha))) {
    j["lora_alpha"] = static_cast<int64_t>(alpha);
  } else {
    j["lora_alpha"] = alpha;
  }
  j["lora_dropout"] = 0.0;
  j["target_modules"] = modules;
  j["bias"] = "none";
  j["fan_in_fan_out"] = false;
  j["use_rslora"] = false;
  j["init_lora_weights"] = true;
  j["inference_mode"] = true;
  j["modules_to_save"] = nullptr;
  return j.dump(2) + "\n";
}

absl::Status ExportPeftAdapter(const model::ModelConfig& config, absl::Span<const float> adapters,
                               const std::string& dir, DataType dtype) {
  if (!config.lora.on()) {
    return absl::InvalidArgumentError("ExportPeftAdapter: the model has no LoRA adapters");
  }
  if (config.arch != model::Arch::kLlama) {
    return absl::InvalidArgumentError(
        "PEFT's GPT-2 adapters sit on the fused c_attn, not on q, k and v apart: export the "
        "job's final weights (the merged model) instead");
  }
  const model::ParamLayout layout(config);
  if (adapters.size() != layout.num_params()) {
    return absl::InvalidArgumentError(absl::StrCat("ExportPeftAdapter: ", adapters.size(),
                                                   " values, the adapters have ",
                                                   layout.num_params()));
  }
  const int hs = config.head_dim(), r = config.lora.rank;
  std::deque<std::vector<float>> storage;  // the permuted B of q and k (stable addresses)
  std::vector<TensorToWrite> tensors;
  for (int l = 0; l < config.layers; ++l) {
    for (int ti = 0; ti < model::kNumLoraTargets; ++ti) {
      const auto t = model::LoraTarget(ti);
      const int A = layout.lora_tensor(l, t, false);
      if (A < 0) continue;
      const std::string name =
          absl::StrCat("base_model.model.model.layers.", l, ".", PeftModule(t), ".lora_");
      const model::TensorInfo &a = layout.tensors()[A], &b = layout.tensors()[A + 1];
      tensors.push_back({name + "A.weight", a.shape, adapters.subspan(a.offset, a.numel)});
      absl::Span<const float> bdata = adapters.subspan(b.offset, b.numel);
      if (t == model::kLoraQ || t == model::kLoraK) {  // rotate_half's row order
        std::vector<float>& p = storage.emplace_back(bdata.size());
        for (int64_t row = 0; row < b.shape[0]; ++row) {
          std::copy(bdata.begin() + row * r, bdata.begin() + (row + 1) * r,
                    p.begin() + HfRotaryRow(row, hs) * r);
        }
        bdata = p;
      }
      tensors.push_back({name + "B.weight", b.shape, bdata});
    }
  }
  if (absl::Status s =
          WriteFileAtomically(dir + "/adapter_config.json", PeftAdapterConfigJson(config));
      !s.ok()) {
    return s;
  }
  return WriteSafetensorsFile(dir + "/adapter_model.safetensors", tensors, dtype,
                              {{"format", "pt"}});
}

absl::StatusOr<std::vector<float>> LoadPeftAdapter(const std::string& path,
                                                   const model::ModelConfig& config) {
  if (!config.lora.on() || config.arch != model::Arch::kLlama) {
    return absl::InvalidArgumentError(
        "model.adapter: PEFT adapters load into a Llama-family model with finetune.lora");
  }
  const std::string dir = std::filesystem::is_directory(path)
                              ? path
                              : std::filesystem::path(path).parent_path().string();
  std::string text;
  if (absl::Status s = ReadFile(dir + "/adapter_config.json", &text); !s.ok()) {
    return absl::NotFoundError(absl::StrCat("model.adapter: ", dir,
                                            "/adapter_config.json is missing (a PEFT adapter "
                                            "folder holds it beside adapter_model.safetensors)"));
  }
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.adapter: ", dir, "/adapter_config.json: ", what));
  };
  if (!j.is_object()) return bad("not a JSON object");
  if (j.value("peft_type", std::string()) != "LORA") {
    return bad(absl::StrCat("peft_type ",
                            j.contains("peft_type") ? j["peft_type"].dump() : "absent",
                            ", only LORA loads"));
  }
  if (j.value("use_rslora", false)) return bad("use_rslora true: the scale here is alpha / r");
  const int64_t r = j.value("r", int64_t{0});
  if (r != config.lora.rank) {
    return bad(absl::StrCat("r ", r, ", the spec's finetune.lora.rank ", config.lora.rank));
  }
  const double alpha =
      j.contains("lora_alpha") && j["lora_alpha"].is_number() ? j["lora_alpha"].get<double>() : 0.0;
  if (alpha != config.lora.alpha) {
    return bad(
        absl::StrCat("lora_alpha ", alpha, ", the spec's finetune.lora.alpha ", config.lora.alpha));
  }
  uint32_t targets = 0;
  std::vector<std::string> listed;
  if (j.contains("target_modules") && j["target_modules"].is_array()) {
    for (const auto& m : j["target_modules"]) {
      const std::string name = m.is_string() ? m.get<std::string>() : m.dump();
      listed.push_back(name);
      bool known = false;
      for (int t = 0; t < model::kNumLoraTargets; ++t) {
        const std::string mod = PeftModule(model::LoraTarget(t));
        if (mod.substr(mod.find('.') + 1) == name) {
          targets |= 1u << t;
          known = true;
        }
      }
      if (!known)
        return bad(absl::StrCat("target_modules names ", name, ", not a Llama projection"));
    }
  }
  if (targets != config.lora.targets) {
    return bad(absl::StrCat("target_modules [", absl::StrJoin(listed, ", "),
                            "], the spec's finetune.lora.targets [",
                            model::LoraTargetList(config.lora.targets), "]"));
  }
  absl::StatusOr<std::unique_ptr<SafetensorsSet>> set =
      SafetensorsSet::Open(dir + "/adapter_model.safetensors");
  if (!set.ok()) return set.status();
  const model::ParamLayout layout(config);
  std::vector<float> out(layout.num_params());
  const int hs = config.head_dim();
  for (int l = 0; l < config.layers; ++l) {
    for (int ti = 0; ti < model::kNumLoraTargets; ++ti) {
      const auto t = model::LoraTarget(ti);
      const int A = layout.lora_tensor(l, t, false);
      if (A < 0) continue;
      for (const int k : {A, A + 1}) {
        const model::TensorInfo& info = layout.tensors()[k];
        const std::string name =
            absl::StrCat("base_model.model.model.layers.", l, ".", PeftModule(t), ".lora_",
                         k == A ? "A" : "B", ".weight");
        const SafetensorsEntry* entry = (*set)->Find(name);
        if (entry == nullptr) {
          return absl::InvalidArgumentError(
              absl::StrCat("model.adapter: ", name, ": missing from ", dir));
        }
        if (entry->shape != info.shape) {
          return absl::InvalidArgumentError(
              absl::StrCat("model.adapter: ", name, ": shape [", absl::StrJoin(entry->shape, ", "),
                           "] in the file, [", absl::StrJoin(info.shape, ", "), "] for the model"));
        }
        float* dst = out.data() + info.offset;
        if (absl::Status s = (*set)->Read(name, 0, int64_t(info.numel), dst); !s.ok()) return s;
        if (k == A + 1 && (t == model::kLoraQ || t == model::kLoraK)) {  // back to our row order
          const std::vector<float> hf(dst, dst + info.numel);
          for (int64_t row = 0; row < info.shape[0]; ++row) {
            std::copy(hf.begin() + HfRotaryRow(row, hs) * r,
                      hf.begin() + (HfRotaryRow(row, hs) + 1) * r, dst + row * r);
          }
        }
      }
    }
  }
  return out;
}

}  // namespace shardtrain::checkpoint
