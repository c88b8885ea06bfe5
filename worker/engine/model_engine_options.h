// What a ModelEngine is made with (model_engine.h): the slice, the pipeline
// slots, the parallel groups, the activation policy, what gives memory back,
// the MoE layers' balancing; and the checks every engine makes of them.
#ifndef SHARDTRAIN_WORKER_ENGINE_MODEL_ENGINE_OPTIONS_H_
#define SHARDTRAIN_WORKER_ENGINE_MODEL_ENGINE_OPTIONS_H_

#include <vector>

#include "absl/status/status.h"
#include "common/model/activations.h"
#include "common/model/config.h"
#include "common/model/slice.h"
#include "common/model/weight_quant.h"
#include "worker/engine/context_parallel.h"
#include "worker/engine/expert_parallel.h"
#include "worker/engine/tensor_parallel.h"

namespace shardtrain::engine {

// How MoE layers balance and drop (the job's `router` section; nothing
// without MoE layers). Per micro-batch and MoE layer, the objective the
// backward differentiates adds aux_loss_coef · the Switch/GShard loss and
// z_loss_coef · the router z-loss (engine/cpu/moe_layers.h) to the mean
// cross-entropy; capacity_factor > 0 keeps at most ceil(capacity_factor ·
// N·K / E) (token, slot) pairs per expert of a micro-batch's N tokens and
// drops the rest (0: dropless).
struct MoeOptions {
  double aux_loss_coef = 0.01;
  double z_loss_coef = 0;
  double capacity_factor = 0;
};

struct ModelEngineOptions {
  model::ModelSlice slice;  // default: the whole model
  int slots = 1;            // micro-batches whose saved activations are kept at once
  // An interleaved slice (slice.chunks > 1): the slots of each chunk
  // (slice.chunks entries, each >= 1); empty: `slots` for every chunk.
  std::vector<int> chunk_slots;
  // The slice's tp group (rank slice.tp_rank of slice.tp); required when
  // slice.tp > 1, must outlive the engine.
  TensorParallel* tp = nullptr;
  // Context parallelism: the engine's T is this rank's seq_len / cp tokens
  // of each sequence (common/model/slice.h: ContextChunkPositions, at
  // activations.cp ranks), attention a ring over this group. Required when
  // activations.cp > 1 (size activations.cp), must outlive the engine.
  ContextParallel* cp = nullptr;
  // Expert parallelism (slice.ep > 1): the slice holds experts
  // [slice.first_expert, + E / ep) of each MoE layer, and the (token, slot)
  // pairs go to their expert's rank and back over this group (size
  // slice.ep, rank slice.ep_rank; must outlive the engine).
  ExpertParallel* ep = nullptr;
  // What each block keeps for backward and what it recomputes
  // (model.recompute; common/model/activations.h).
  model::ActivationPolicy activations;
  // The parameter and gradient buffers give memory back when released
  // (ZeRO-2/3: Buffer::Release / Acquire). Host memory always does; a GPU
  // engine allocates them with virtual memory management when set.
  bool release_state = false;
  // The 16-bit compute copy of a unit is held only while the unit is in use
  // (ZeRO-3: OnUnitUse maps and refreshes it, OnUnitDone gives it back), so
  // the device never holds the whole model in the compute type.
  bool release_compute_copy = false;
  MoeOptions moe;  // MoE layers only
  // How a LoRA engine holds its frozen model (finetune.base_dtype; LoRA
  // only): quant kNone keeps it in the compute type (compute_bytes is the
  // engine's, not read here).
  model::FrozenFormat frozen;
};

// The checks every engine makes of its shape and slice: B >= 1, 1 <= T <=
// context, slots >= 1, a slice within the model whose tp divides heads,
// kv_heads, ffn_dim and the padded vocabulary, with its group when tp > 1;
// under cp > 1 its group, T · cp within the context and divisible by 2·cp;
// LoRA adapters (config.lora) that fit the model (model::ValidateLora), on
// tp 1. InvalidArgument naming the field otherwise.
absl::Status ValidateModelEngine(const model::ModelConfig& config, int B, int T,
                                 const ModelEngineOptions& options);

}  // namespace shardtrain::engine

#endif  // SHARDTRAIN_WORKER_ENGINE_MODEL_ENGINE_OPTIONS_H_
