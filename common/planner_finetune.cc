// The plan's fine-tuning comparison (planner.h: FinetuneComparison): the
// spec's model and layout fine-tuned five ways, each planned by MakePlan.
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/planner.h"

namespace shardtrain {
namespace {

// "8.03 B", "41.9 M", "12.3 K", "512".
std::string Count(double n) {
  if (n >= 1e9) return absl::StrFormat("%.3g B", n / 1e9);
  if (n >= 1e6) return absl::StrFormat("%.3g M", n / 1e6);
  if (n >= 1e3) return absl::StrFormat("%.3g K", n / 1e3);
  return absl::StrFormat("%.0f", n);
}

}  // namespace

std::string FinetuneComparison(const JobSpec& spec, const v1::Plan& plan) {
  if (!spec.finetune.lora.on() && spec.model.init.empty()) return "";
  // The spec's adapters where it has them, else PEFT's defaults.
  LoraSpec lora = spec.finetune.lora;
  if (!lora.on()) lora.rank = 8;
  struct Choice {
    std::string name;
    bool adapters;
    BaseDtype base;
    OptimizerState state;
  };
  const OptimizerState own = spec.optimizer.state;
  const std::vector<Choice> choices = {
      {"full, AdamW fp32 state", false, BaseDtype::kBf16, OptimizerState::kFp32},
      {"full, 8-bit AdamW", false, BaseDtype::kBf16, OptimizerState::kInt8},
      {spec.FrozenFormat().compute_bytes == 4 ? "LoRA on the fp32 model" : "LoRA on the bf16 model",
       true, BaseDtype::kBf16, own},
      {"LoRA on int8 weights", true, BaseDtype::kInt8, own},
      {"QLoRA (NF4 weights)", true, BaseDtype::kNf4, own},
  };
  const double model_params = double(ModelNumParams(spec));
  std::string out = absl::StrFormat(
      "\nfine-tuning compared (per rank, this layout; LoRA rank %d on %d target(s); B/PARAM: "
      "frozen model + model state per parameter of the model):\n",
      lora.rank, static_cast<int>(lora.targets.size()));
  out +=
      "CHOICE                        TRAINED PARAMS  FROZEN MODEL  MODEL STATE  ACTIVATIONS  "
      "TOTAL MEM  B/PARAM\n";
  for (const Choice& c : choices) {
    JobSpec alt = spec;
    alt.finetune.lora = c.adapters ? lora : LoraSpec{};
    alt.finetune.base_dtype = c.base;
    alt.optimizer.state = c.state;
    const bool chosen = alt.finetune.lora.on() == spec.finetune.lora.on() &&
                        c.base == spec.finetune.base_dtype && c.state == own;
    absl::StatusOr<v1::Plan> p = MakePlan(alt, plan.world());
    if (!p.ok()) {
      absl::StrAppendFormat(&out, "%s%-28s  refused: %s\n", chosen ? "*" : " ", c.name,
                            std::string(p.status().message()));
      continue;
    }
    const v1::MemoryEstimate& e = p->memory_per_rank();
    const int64_t state = e.params_bytes() + e.grads_bytes() + e.optimizer_bytes();
    absl::StrAppendFormat(&out, "%s%-28s  %14s  %12s  %11s  %11s  %9s  %7.2f\n", chosen ? "*" : " ",
                          c.name, Count(double(p->num_params())), FormatPlanBytes(e.frozen_bytes()),
                          FormatPlanBytes(state), FormatPlanBytes(e.activations_bytes()),
                          FormatPlanBytes(e.total_bytes()),
                          double(e.frozen_bytes() + state) / model_params);
  }
  return out;
}

}  // namespace shardtrain
