#include "worker/checkpoint/hf_peft.h"

#include <deque>
#include <nlohmann/json.hpp>
#include <vector>

#include "absl/strings/str_cat.h"
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

}  // namespace shardtrain::checkpoint
