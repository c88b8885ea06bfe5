// ParamLayout: where every parameter tensor of the model lives inside ONE
// flat float buffer, grouped into contiguous units that sharding strategies
// (ZeRO/FSDP per unit, checkpoints per tensor range) work on. The tensors
// follow the config's recipe (config.h); a family without biases has no
// bias tensors, not zero ones.
//
// Order (each unit contiguous, no gaps, units in this order):
//   unit "embeddings": wte (Vp, C), wpe (context, C) (learned positions only)
//   unit "block.l" for l = 0..L-1:
//     block.l.ln1.weight (C), block.l.ln1.bias (C),
//     block.l.attn.qkv.weight (Q + 2KV, C), block.l.attn.qkv.bias (Q + 2KV),
//     block.l.attn.q_norm.weight (hs), block.l.attn.k_norm.weight (hs),
//     block.l.attn.proj.weight (C, Q), block.l.attn.proj.bias (C),
//     block.l.ln2.weight (C), block.l.ln2.bias (C),
//     block.l.mlp.fc.weight (FC, C), block.l.mlp.fc.bias (FC),
//     block.l.mlp.proj.weight (C, F), block.l.mlp.proj.bias (C)
//     and in an MoE layer (config.moe_layer(l)):
//     block.l.mlp.router.weight (E, C), block.l.mlp.router.bias (E;
//     moe.router_bias only: no gradient, set between steps),
//     block.l.mlp.experts.e.fc.weight (FCe, C) for each expert e, then
//     every expert's fc.bias (FCe), proj.weight (C, He), proj.bias (C)
//     and with LoRA adapters (config.lora.on()), for each target t in
//     LoraTarget order: block.l.lora.t.A (rank, in), block.l.lora.t.B
//     (out, rank) (common/model/lora.h: LoraTargetSite)
//   unit "final": lnf.weight (C), lnf.bias (C), lm_head (Vp, C) (untied only)
// where ln* are the norms (LayerNorm, or RMSNorm without the bias), Q =
// heads·hs (C unless head_dim is set), KV = kv_heads·hs (C for GPT-2: 3C
// rows of q, k, v), the q/k norms only in qk_norm recipes, F the MLP's hidden width and
// FC = F (GELU) or 2F (SwiGLU's [gate; up]). In an MoE layer F is the
// shared experts' width (config.mlp_dim(l); the mlp.fc and mlp.proj tensors
// are absent without shared experts), He the experts' (FCe = He or 2He);
// an expert's tensors of one kind are consecutive, so the slice's experts'
// fc weights are one (E_local, FCe, C) array. Linear weights are (out, in)
// row-major like torch.nn.Linear. A tied LM head reads wte. Gradients use a
// buffer with the identical layout.
//
// Under LoRA the model's own tensors are frozen (TensorInfo::frozen): they
// keep their names, order and indices, but live in a second flat buffer
// laid out exactly as the model without adapters lays out its parameters
// (so weights load into it unchanged), while the flat buffer this layout
// describes — num_params(), units, GlobalRuns, the ranges and fingerprints
// below — holds the adapters alone: what trains, shards, reduces and is
// checkpointed. A unit without adapters (embeddings, final) is empty.
//
// A layout of a ModelSlice (slice.h) holds only that slice's tensors, in the
// same order and with the same names, each with its tp-local shape: the
// embeddings unit when the slice has_embeddings(), the blocks of its layers,
// the final unit on the last stage. GlobalRuns maps its elements to the whole
// model's layout (checkpoints and initialisation work in those coordinates,
// so a run saved on one layout resumes on any other). Under expert
// parallelism (slice.ep > 1) it holds only its experts' tensors.
#ifndef SHARDTRAIN_COMMON_MODEL_PARAM_LAYOUT_H_
#define SHARDTRAIN_COMMON_MODEL_PARAM_LAYOUT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/config.h"
#include "common/model/slice.h"

namespace shardtrain::model {

struct TensorInfo {
  std::string name;
  std::vector<int64_t> shape;
  size_t offset = 0;  // in floats, into the flat buffer
  size_t numel = 0;
  int unit = 0;  // index into ParamLayout::units()
  // Weight decay rule: decay applies to 2-D tensors only (matmul weights and
  // the wte/wpe/lm_head embeddings); never to biases or norm weights/biases.
  bool decay = false;
  int global = 0;                  // index of this tensor in the whole model's layout
  TpSplit split = TpSplit::kNone;  // how tensor parallelism splits it
  // kRowParts: the whole tensor's rows of each part, in order (q, k, v or
  // gate, up); each part splits over tp on its own.
  std::vector<int64_t> parts;
  // True when every tp rank of the slice holds the same values (tp > 1 and
  // not split): gradient norms count it on tp rank 0 only.
  bool replicated = false;
  // A tensor of the model under LoRA adapters (config.lora.on()): no
  // gradient, no optimizer state; `offset` is into the frozen buffer, which
  // is laid out as ParamLayout(BaseConfig(config), slice)'s flat buffer.
  bool frozen = false;
};

// `count` consecutive elements at `local` in a slice's flat buffer that are
// the elements at `global` in the whole model's.
struct FlatRun {
  size_t local = 0, global = 0, count = 0;
};

struct UnitInfo {
  std::string name;  // "embeddings", "block.0".."block.L-1", "final"
  size_t offset = 0;
  size_t numel = 0;
  int first_tensor = 0;  // tensors [first_tensor, first_tensor + num_tensors)
  int num_tensors = 0;
};

// The tensors a block may have (ParamLayout::block_tensor maps them to
// indices; a recipe without biases has no k*B tensors).
enum BlockTensor : int {
  kLn1W = 0,
  kLn1B,
  kQkvW,
  kQkvB,
  kAttnProjW,
  kAttnProjB,
  kLn2W,
  kLn2B,
  kFcW,
  kFcB,
  kFcProjW,
  kFcProjB,
  kQNormW,  // q_norm and k_norm (qk_norm recipes only)
  kKNormW,
  kRouterW,  // an MoE layer's router (E, C)
  kRouterB,  // its choice bias (E; moe.router_bias only)
  kNumBlockTensors
};

// The tensors of each expert of an MoE layer (ParamLayout::expert_tensor).
enum ExpertTensor : int { kExpFcW = 0, kExpFcB, kExpProjW, kExpProjB, kNumExpertTensors };

// Immutable after construction; thread-compatible.
class ParamLayout {
 public:
  explicit ParamLayout(const ModelConfig& config, const ModelSlice& slice = {});

  const ModelConfig& config() const { return config_; }
  const ModelSlice& slice() const { return slice_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::vector<UnitInfo>& units() const { return units_; }
  size_t num_params() const { return num_params_; }

  // Index of the tensor with this name, NotFound otherwise.
  absl::StatusOr<int> FindTensor(const std::string& name) const;
  // Tensor index helpers (layer: the model's layer number, within the
  // slice). -1 where the slice or the recipe has no such tensor: wte/wpe
  // without the embeddings unit (wpe without learned positions), lnf and
  // the untied lm_head off the last stage, biases of a recipe without them.
  int wte() const { return wte_; }
  int wpe() const { return wpe_; }
  int block_tensor(int layer, BlockTensor t) const {
    const int k = block_index_[config_.moe_layer(layer)][t];
    return k < 0 ? -1 : block_first_[slice_.LocalLayer(config_, layer)] + k;
  }
  // Expert `e` of the slice's local_experts() (the model's expert
  // first_expert() + e) of MoE layer `layer`: its tensor t, -1 where the
  // recipe has none (biases). The local experts' tensors of one kind are
  // consecutive and contiguous.
  int expert_tensor(int layer, ExpertTensor t, int e) const {
    const int k = expert_index_[t];
    return k < 0 ? -1
                 : block_first_[slice_.LocalLayer(config_, layer)] + per_block_[1] +
                       k * local_experts_ + e;
  }
  int local_experts() const { return local_experts_; }
  // LoRA target t's adapter A (b false) or B (b true) of layer `layer`
  // (within the slice); -1 when t is not a target (or LoRA is off).
  int lora_tensor(int layer, LoraTarget t, bool b) const {
    return lora_slot_[t] < 0
               ? -1
               : lora_first_[slice_.LocalLayer(config_, layer)] + 2 * lora_slot_[t] + (b ? 1 : 0);
  }
  // Elements of the frozen buffer (0 without LoRA): the slice's share of
  // the model without adapters.
  size_t num_frozen() const { return num_frozen_; }
  int lnf_w() const { return lnf_w_; }
  int lnf_b() const { return lnf_b_; }
  // The weight the LM head reads: wte when tied, lm_head otherwise (-1 off
  // the last stage).
  int lm_head() const { return lm_head_; }
  // The slice's layers: num_layers() of them (every chunk's), the i-th
  // being model layer layer(i).
  int num_layers() const { return num_layers_; }
  int layer(int i) const { return slice_.Layer(config_, i); }

  // The runs of local elements [begin, end) in the whole model's layout, in
  // local order (which is also increasing global order), adjacent runs
  // merged. Precondition: begin <= end <= num_params().
  std::vector<FlatRun> GlobalRuns(size_t begin, size_t end) const;
  std::vector<FlatRun> GlobalRuns() const { return GlobalRuns(0, num_params_); }
  // The ranges [first, second) of this slice's flat buffer that another rank
  // of the mesh holds identically and speaks for: the replicated tensors on
  // tp ranks > 0, and the embeddings unit on a last stage that is not also
  // the first (the tied copy; the first stage's is the one that counts).
  // Gradient norms leave them out, and checkpoints do not save them twice.
  // Sorted, disjoint; empty for a whole model.
  std::vector<std::pair<size_t, size_t>> ReplicaRanges() const;
  // The ranges whose gradients are partial sums over the tp group, to be
  // summed over it: under sequence parallelism the norms' weights and
  // biases (ln1, ln2 of every block, the final norm: each tp rank computes
  // them on its rows only); with tp > 1 the q/k norms' weights (each rank
  // normalises its own heads). Sorted, disjoint.
  std::vector<std::pair<size_t, size_t>> TpPartialRanges(bool sequence_parallel) const;
  // The ranges of the experts' tensors (every MoE layer's, of this slice's
  // experts): under expert parallelism other ranks hold other experts at
  // the same local offsets, so these are reduced over the ranks holding the
  // same experts, not over every replica. Sorted, disjoint; empty without
  // MoE layers.
  std::vector<std::pair<size_t, size_t>> ExpertRanges() const;
  // Elements of the whole model (ParamLayout(config()).num_params()).
  size_t global_num_params() const { return global_num_params_; }
  // Offset in floats of a tensor.
  size_t offset(int tensor) const { return tensors_[tensor].offset; }
  // The flat buffer's offset of the unit holding a tensor (its first
  // element's under LoRA too, where a frozen tensor's offset is elsewhere).
  size_t unit_offset(int tensor) const { return units_[tensors_[tensor].unit].offset; }

  // 64-bit fingerprint of names, shapes and offsets; stored in weights files
  // and checkpoints to detect layout changes. Checkpoints store the whole
  // model's (GlobalFingerprint), whatever slice wrote them.
  uint64_t Fingerprint() const;
  uint64_t GlobalFingerprint() const;

 private:
  ModelConfig config_;
  ModelSlice slice_;
  int num_layers_ = 0, local_experts_ = 0;
  std::vector<int> block_first_;  // per local layer: the index of its first tensor
  std::vector<int> lora_first_;   // per local layer: the index of its first adapter
  int lora_slot_[kNumLoraTargets] = {-1, -1, -1, -1, -1, -1, -1};
  size_t num_frozen_ = 0;
  // Per kind of block (0 dense, 1 MoE): its tensors before the experts', and
  // a BlockTensor's index within it, or -1.
  int per_block_[2] = {0, 0};
  int block_index_[2][kNumBlockTensors];
  int expert_index_[kNumExpertTensors];  // an ExpertTensor's kind index, or -1
  int wte_ = -1, wpe_ = -1, lnf_w_ = -1, lnf_b_ = -1, lm_head_ = -1;
  size_t global_num_params_ = 0;
  uint64_t global_fingerprint_ = 0;
  std::vector<size_t> global_offsets_;  // per tensor: its offset in the whole layout
  std::vector<TensorInfo> tensors_;
  std::vector<UnitInfo> units_;
  size_t num_params_ = 0;
};

// The block's weight a LoRA target adapts (its rows model::LoraTargetSite's
// [first_col, first_col + out) of that fused weight): q, k, v attn.qkv; o
// attn.proj; gate, up mlp.fc; down mlp.proj.
inline BlockTensor LoraTargetTensor(LoraTarget t) {
  switch (t) {
    case kLoraQ:
    case kLoraK:
    case kLoraV:
      return kQkvW;
    case kLoraO:
      return kAttnProjW;
    case kLoraGate:
    case kLoraUp:
      return kFcW;
    case kLoraDown:
      return kFcProjW;
  }
  return kQkvW;
}

// The tensors of the layout's flat buffer, in order: every tensor, or under
// LoRA the adapters (those not frozen).
std::vector<TensorInfo> TrainedTensors(const ParamLayout& layout);

}  // namespace shardtrain::model

#endif  // SHARDTRAIN_COMMON_MODEL_PARAM_LAYOUT_H_
