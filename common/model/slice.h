// ModelSlice: the part of the GPT one rank runs under tensor (tp) and
// pipeline (pp) parallelism, and the one rule that splits layers into
// pipeline stages. The parameter layout (param_layout.h), the activation
// table (activations.h), every engine, checkpoints and the planner take a
// slice; the default slice is the whole model on one rank.
//
// Tensor parallelism (Megatron-style) splits, over the tp ranks of a slice:
//   wte (Vp, C)                   rows: vocabulary-parallel (Vp / tp rows each)
//   attn.qkv.weight (C + 2KV, C), .bias  the rows of heads [r·NH/tp, (r+1)·NH/tp)
//                                 of q and of key/value heads [r·KVH/tp,
//                                 (r+1)·KVH/tp) of each of k and v
//                                 (column-parallel)
//   attn.proj.weight (C, C)       columns (row-parallel; its bias is replicated)
//   mlp.fc.weight (F, C), .bias   rows (column-parallel); SwiGLU's (2F, C) is
//                                 [gate; up], the rows of each split
//   mlp.proj.weight (C, F)        columns (row-parallel; its bias is replicated)
//   lm_head (Vp, C)               rows, like wte (an untied head)
// and replicates everything else (wpe, the norms, the row-parallel biases):
// every tp rank holds the same values and computes the same gradients.
//
// Pipeline parallelism gives each stage a contiguous run of layers; the
// first stage also runs the encoder (wte, wpe), the last the final norm, the
// LM head and the loss. An interleaved pipeline (parallel.pp_virtual = v)
// gives each stage v runs ("model chunks") of equal length instead: chunk c
// of stage s is virtual stage c·pp + s of v·pp, so stage 0's chunk 0 starts
// with the encoder and stage pp − 1's chunk v − 1 ends with the head. A tied LM head reads wte, so
// with pp > 1 the last stage holds the embeddings unit too (wte and wpe, the same shapes as on the
// first stage, wpe unused there): the two copies start equal and their
// gradients are summed across the two stages before every update. An untied
// head (lm_head) lives in the last stage's final unit.
//
// Thread-compatible: plain values and pure functions.
#ifndef SHARDTRAIN_COMMON_MODEL_SLICE_H_
#define SHARDTRAIN_COMMON_MODEL_SLICE_H_

#include <vector>

#include "absl/status/statusor.h"
#include "common/model/config.h"

namespace shardtrain::model {

struct ModelSlice {
  int first_layer = 0;
  int num_layers = -1;  // of each chunk; -1: to the last layer (one chunk only)
  bool first_stage = true;
  bool last_stage = true;
  int tp = 1;       // tensor-parallel degree
  int tp_rank = 0;  // this rank's index in [0, tp)
  // Expert parallelism: an MoE layer's experts split in ep contiguous
  // groups, this rank holding group ep_rank (E / ep experts from
  // ep_rank · E / ep); 1: every expert.
  int ep = 1;
  int ep_rank = 0;
  // Model chunks: chunk c holds layers [first_layer + c·chunk_stride,
  // + num_layers); 1 chunk without an interleaved pipeline.
  int chunks = 1;
  int chunk_stride = 0;

  // The end of chunk 0's layer range for `config` (first_layer + num_layers).
  int end_layer(const ModelConfig& config) const {
    return num_layers < 0 ? config.layers : first_layer + num_layers;
  }
  // Layers of one chunk, and of the whole slice.
  int chunk_layers(const ModelConfig& config) const { return end_layer(config) - first_layer; }
  int total_layers(const ModelConfig& config) const { return chunks * chunk_layers(config); }
  // The model's layer number of the slice's i-th layer (0 <= i <
  // total_layers), in increasing order.
  int Layer(const ModelConfig& config, int i) const {
    const int n = chunk_layers(config);
    return first_layer + (i / n) * chunk_stride + i % n;
  }
  // The slice's index of model layer l, or -1 when the slice does not hold it.
  int LocalLayer(const ModelConfig& config, int l) const {
    const int n = chunk_layers(config), d = l - first_layer;
    if (d < 0) return -1;
    const int c = chunks > 1 ? d / chunk_stride : 0, j = chunks > 1 ? d % chunk_stride : d;
    return c < chunks && j < n ? c * n + j : -1;
  }
  // True when the slice holds the embeddings unit: the first stage (the
  // encoder) and, when the LM head is tied to wte, the last.
  bool has_embeddings(const ModelConfig& config) const {
    return first_stage || (last_stage && config.tie_embeddings);
  }
  // The whole model on one rank.
  bool whole() const {
    return first_stage && last_stage && tp == 1 && ep == 1 && first_layer == 0 && chunks == 1;
  }
  // The experts of an MoE layer this slice holds: [first_expert,
  // first_expert + local_experts).
  int local_experts(const ModelConfig& config) const { return config.moe.experts / ep; }
  int first_expert(const ModelConfig& config) const { return ep_rank * local_experts(config); }
};

// How a tensor is split over tp (see the header comment).
enum class TpSplit {
  kNone,      // replicated
  kRows,      // dim 0 in tp contiguous parts
  kRowParts,  // dim 0 is parts ([q; k; v], [gate; up]), each split in tp contiguous parts
  kCols,      // dim 1 in tp contiguous parts
};

// The number of layers of each of the pp stages. `requested` (the job's
// parallel.stages) empty: balanced by parameter count — contiguous runs of
// layers, each stage >= 1 layer, minimising the largest stage's parameters
// (a block's, plus wte and wpe on the first stage and the final norm and the
// tied wte on the last), ties to the earliest split. Otherwise it must have pp entries,
// each >= 1, summing to config.layers. INVALID_ARGUMENT naming
// parallel.stages or parallel.pp otherwise.
// chunks > 1 (an interleaved pipeline, parallel.pp_virtual): the layers of
// each of the pp · chunks virtual stages, all equal — config.layers must be
// a multiple of pp · chunks and `requested` empty (INVALID_ARGUMENT naming
// parallel.pp_virtual otherwise).
absl::StatusOr<std::vector<int>> StageLayers(const ModelConfig& config, int pp,
                                             const std::vector<int>& requested = {},
                                             int chunks = 1);

// The slice of pipeline stage `stage` and tensor rank tp_rank of tp;
// stage_layers from StageLayers (with `chunks` > 1: pp · chunks equal
// virtual stages, the slice chunk c being virtual stage c·pp + stage).
// Preconditions (the callers validate them): stage and tp_rank in range.
ModelSlice SliceOf(const std::vector<int>& stage_layers, int stage, int tp, int tp_rank,
                   int chunks = 1);

// Context parallelism's chunks: the position in its sequence of each of the
// seq_len / cp rows that cp rank `cp_rank` holds. The sequence is cut into
// 2·cp chunks of c = seq_len / (2·cp) tokens and the rank holds chunks
// cp_rank and 2·cp − 1 − cp_rank, in that order (an early and a late one:
// under causal attention every rank then has the same work). Preconditions
// (abort otherwise): cp >= 1, 0 <= cp_rank < cp, 2·cp divides seq_len (cp =
// 1: the identity 0 .. seq_len − 1).
std::vector<int> ContextChunkPositions(int seq_len, int cp, int cp_rank);

}  // namespace shardtrain::model

#endif  // SHARDTRAIN_COMMON_MODEL_SLICE_H_
