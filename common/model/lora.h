// LoRA's targets in a model (model::LoraConfig in config.h): their names,
// the shape of the linear layer each adapts, and where its output lands in
// the engine's fused tensors. Pure.
#ifndef SHARDTRAIN_COMMON_MODEL_LORA_H_
#define SHARDTRAIN_COMMON_MODEL_LORA_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/config.h"

namespace shardtrain::model {

// "q", "k", "v", "o", "gate", "up", "down".
const char* LoraTargetName(LoraTarget t);
// The target of that name; NotFound listing the names otherwise.
absl::StatusOr<LoraTarget> LoraTargetByName(std::string_view name);
// The names of config.targets, comma-separated in target order ("q, v").
std::string LoraTargetList(uint32_t targets);

// The linear layer a target adapts in a block of `config`: its input width
// (in), its output width (out), and the first column of its output within
// the block's fused GEMM (qkv: q at 0, k at Q, v at Q + KV; fc: gate at 0,
// up at F under SwiGLU, up at 0 for GELU) of `row` columns (Q + 2KV, 2F or
// F, C). A target the family has not (gate without SwiGLU) has out 0.
struct LoraSite {
  int64_t in = 0, out = 0;
  int64_t first_col = 0, row = 0;
};
LoraSite LoraTargetSite(const ModelConfig& config, LoraTarget t);

// Whether tensor parallelism splits the target's output (q, k, v, gate, up:
// column-parallel layers, whose B splits by rows and whose A every tp rank
// holds whole) or its input (o, down: row-parallel, A splits by columns and
// B is whole) — Megatron's split of the base weight, which the adapter
// follows.
bool LoraColumnParallel(LoraTarget t);

// The site on one rank of `tp` (the tp-local fused GEMM): a column-parallel
// target's out, first_col and row divided by tp, a row-parallel one's in.
LoraSite LoraTargetSite(const ModelConfig& config, LoraTarget t, int tp);

// The adapters' parameters: rank · (in + out) per target and block.
int64_t LoraParams(const ModelConfig& config);

// The FLOPs per token a training step spends on `weights` matrix weights a
// token runs through and `adapters` adapter parameters, 2 per multiply-add:
// 6 per weight (the forward, the input's and the weight's gradient), or
// under LoRA (config.lora.on()) 4 per weight — frozen, it gets no gradient
// of its own — and 6 per adapter parameter.
double MatmulTrainingFlops(const ModelConfig& config, double weights, double adapters);

// config.lora against the model (config.lora.on() only): rank >= 1 and at
// most every target's in and out, alpha > 0 and finite, at least one
// target, each one the family has (gate: SwiGLU only), and no MoE layers
// (adapters on MoE models are not supported yet).
// InvalidArgument naming finetune.lora.<field> and both values.
absl::Status ValidateLora(const ModelConfig& config);

}  // namespace shardtrain::model

#endif  // SHARDTRAIN_COMMON_MODEL_LORA_H_
