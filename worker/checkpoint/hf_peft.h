// LoRA adapters in and out of Hugging Face PEFT's format (a LoraConfig's
// save_pretrained): adapter_config.json and adapter_model.safetensors, the
// tensors named as PEFT names them on a LlamaForCausalLM,
//   base_model.model.model.layers.L.self_attn.q_proj.lora_A.weight (rank, C)
//   base_model.model.model.layers.L.self_attn.q_proj.lora_B.weight (Q, rank)
// and so on for k_proj, v_proj, o_proj, mlp.gate_proj, up_proj, down_proj
// (model::LoraTarget q, k, v, o, gate, up, down; A is (rank, in), B (out,
// rank), as torch.nn.Linear's). PEFT's LoRA forward, W·x + (lora_alpha / r)
// · lora_B(lora_A(x)), is ours; the only change is the rotary convention of
// hf_llama.h: q's and k's B rows are permuted within each head as q_proj's
// and k_proj's rows are.
#ifndef SHARDTRAIN_WORKER_CHECKPOINT_HF_PEFT_H_
#define SHARDTRAIN_WORKER_CHECKPOINT_HF_PEFT_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "common/model/config.h"

namespace shardtrain::checkpoint {

// adapter_config.json of config.lora: peft_type LORA, task_type CAUSAL_LM,
// r, lora_alpha, lora_dropout 0, target_modules (q_proj, ...), bias none.
std::string PeftAdapterConfigJson(const model::ModelConfig& config);

// Writes `adapters` (the whole LoRA layout's flat buffer: ParamLayout(config)
// with config.lora on, whose tensors are the adapters) into `dir` (which
// must exist) as adapter_config.json and adapter_model.safetensors in
// `dtype` (fp32 or bf16), each file atomically. INVALID_ARGUMENT for a
// model without adapters, a GPT-2 model (PEFT adapts its fused c_attn, not
// q, k and v apart), or adapters of another size.
absl::Status ExportPeftAdapter(const model::ModelConfig& config, absl::Span<const float> adapters,
                               const std::string& dir, DataType dtype);

// The adapters of a PEFT adapter folder (or its adapter_model.safetensors
// with adapter_config.json beside it) for `config`, in the LoRA layout's
// order (ExportPeftAdapter's inverse). NOT_FOUND naming a missing file;
// INVALID_ARGUMENT naming what disagrees with the model, both values given:
// peft_type, r (finetune.lora.rank), lora_alpha (finetune.lora.alpha),
// target_modules (finetune.lora.targets), use_rslora, a missing tensor or
// one of another shape.
absl::StatusOr<std::vector<float>> LoadPeftAdapter(const std::string& path,
                                                   const model::ModelConfig& config);

}  // namespace shardtrain::checkpoint

#endif  // SHARDTRAIN_WORKER_CHECKPOINT_HF_PEFT_H_
