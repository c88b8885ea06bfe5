// ActivationTable: every activation and scratch tensor a rank needs for
// micro-batches of up to (B, T) tokens, by name and size — the one table an
// engine allocates its buffers from and the planner accounts memory with (as
// llm.c's fill_in_activation_sizes feeds both its malloc and its printout).
//
// Kinds:
//   kSaved    written by the forward pass and read by the backward pass of
//             the same micro-batch: a pipeline stage keeps one set per
//             micro-batch in flight;
//   kScratch  temporaries (the forward projection output, the backward
//             gradients of activations): one set whatever the schedule.
//
// Per block l ("block.<l>.<name>"), with BT = B·T, C = dim and, for a rank's
// share under tensor parallelism tp, Qt = Q / tp (the attention's width, Q =
// NH·hs: C unless head_dim is set), QKVt = (Q + 2·KV) / tp (q, k, v of its
// heads), Ft = F / tp (the MLP's hidden width) and FCt = Ft (GELU) or 2·Ft
// (SwiGLU's gate and up):
//   ln1, ln2 (BT·C) and their mean (LayerNorm only), rstd (BT each); qkv
//   (BT·QKVt, q and k normalised under qk_norm and rotated under rotary
//   positions); qk_pre (BT·(NH+KVH)/tp·hs: q and k before their norms) and
//   qk_rstd (BT·(NH+KVH)/tp), qk_norm only; atty (BT·Qt); att
//   (B·(NH/tp)·T·T softmax probabilities); residual2, residual3 (BT·C); fch
//   (BT·FCt), fch_act (BT·Ft: GELU or SwiGLU of fch; in an MoE layer of
//   the shared experts' width, absent without them)                  saved
// An MoE layer (config.moe_layer(l)) adds, with E experts, K = top_k,
// R = BT·K·ep rows on the experts' side (every (token, slot) pair this
// rank's experts may receive, dropless), Het = He / tp, FCet = Het (GELU)
// or 2·Het: router_logits, router_scores (BT·E), router_gates (BT·K),
// router_experts (BT·K int32), moe_index (2·BT·K + 2·E + 1 int32: the
// permutation, BuildPermutation's row_of_pair, pair_of_row, offsets and
// counts), moe_xp (R·C), moe_h_pre (R·FCet), moe_h (R·Het), moe_y (R·C;
// partial sums over tp)                                             saved
// Model ends: encoded (BT·C: the embeddings on the first stage, the input
//   received from the previous stage on the others); lnf (BT·C), lnf_mean
//   (LayerNorm only), lnf_rstd (BT), logits (BT·Vp/tp), losses, lse (BT) on
//   the last stage                                                  saved
// Scratch: proj_out (BT·max(C, Qt)), dresidual, dln (BT·C each), datty (BT·Qt), dqkv
//   (BT·QKVt), dfch (BT·FCt), dfch_act (BT·Ft), att_scratch (B·(NH/tp)·T·T);
//   with MoE layers moe_out (BT·C: the experts' combined output), moe_dxp,
//   moe_dy (R·C), moe_dh (R·Het), moe_dh_pre (R·FCet), moe_dscores,
//   moe_dlogits (BT·E), moe_dgates (BT·K), and under expert parallelism
//   moe_xfer (R·C: the exchange's staging) (FCt and Ft: the widest layer's)
//                                                                   scratch
// A pipeline stage keeps one set of the saved tensors per micro-batch in
// flight (Engine::slots()). An interleaved stage (ModelSlice::chunks = v)
// keeps sets per model chunk: chunk c's blocks and its input ("encoded" for
// chunk 0, "encoded.<c>" after it; the model's end with the last chunk),
// each chunk's contiguous (chunk_saved), as many of each as the schedule
// holds of that chunk at once.
//
// Sequence parallelism (ActivationPolicy::sequence_parallel, tp > 1; Korthikanti
// et al. 2022): the tensors outside the tp region — ln1, ln2, residual2,
// residual3, their statistics, encoded, lnf_mean, lnf_rstd and dresidual —
// hold BTl = BT/tp rows, this rank's contiguous part of the B·T rows.
// Scratch adds sp_full (BT·C: a LayerNorm output or a gradient gathered
// from every rank's rows) and sp_local (BTl·C: a reduce-scattered
// output); lnf stays BT·C (the LM head's gathered input, saved).
//
// Context parallelism (ActivationPolicy::cp > 1; T is then this rank's
// seq_len / cp rows): attention passes key/value blocks around the cp ring
// and recomputes its probabilities in backward (as flash attention does),
// so a block's att is the attention's row logsumexp (B·(NH/tp)·T, fp32)
// instead of its probabilities, and scratch adds the ring's buffers:
// cp_kv and cp_dkv (2·BT·KVt each: the block in use and the one arriving,
// KVt = 2·KV/tp), cp_out (BT·Ct: one block's output before the merge),
// cp_rows (B·(NH/tp)·T fp32: one block's logsumexp, or backward's row dot
// products) and cp_scores (B·(NH/tp)·T·T, beside att_scratch: a block's
// probabilities and their gradients). Selective recomputation has nothing
// left to refill under cp (the logsumexp is kept).
//
// Flash attention (ActivationPolicy::flash_attention: the CUDA engine in
// bf16 or fp16 with a head size of 64 or 128, FlashAttentionApplies): the
// probabilities are recomputed tile by tile in backward, so att is the row
// logsumexp (B·(NH/tp)·T, fp32) as under cp, att_scratch backward's row dot
// products (same size, fp32), and selective recomputation refills nothing.
//
// Recomputation (ActivationPolicy, the job's model.recompute) moves tensors
// of the first `recompute_layers` blocks of the slice (all by default) from
// the saved set to one shared scratch set, "recompute.<name>", that the
// engine refills in backward:
//   selective  att (the T² softmax probabilities) is recomputed from the
//              saved qkv: "recompute.att" (B·(NH/tp)·T·T) is scratch;
//   full       only the block's output residual3 (the next block's input)
//              stays saved; ln1 .. fch_act, residual2 and the statistics
//              are recomputed from the block's input into "recompute.*",
//              one block's worth of scratch.
//
// Bytes: the LayerNorm statistics (mean, rstd), losses and lse are fp32 in
// every precision; all other tensors are stored in the compute type (4 bytes
// in fp32, 2 in bf16 / fp16). Offsets are in bytes within their kind, each
// tensor aligned to 16 bytes, so the engine carves its buffers and the
// planner sums them from the same numbers.
// Thread-compatible: an immutable value.
#ifndef SHARDTRAIN_COMMON_MODEL_ACTIVATIONS_H_
#define SHARDTRAIN_COMMON_MODEL_ACTIVATIONS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/dtype.h"
#include "common/model/config.h"
#include "common/model/slice.h"

namespace shardtrain::model {

enum class ActivationKind { kSaved, kScratch };

// What a block keeps for backward (model.recompute).
enum class Recompute { kNone, kSelective, kFull };

struct ActivationPolicy {
  Recompute recompute = Recompute::kNone;
  // The first K blocks of each stage's slice recompute; -1: all of them.
  int recompute_layers = -1;
  // Sequence parallelism (parallel.sequence_parallel; tp > 1): the
  // residual stream, the LayerNorms and their statistics hold only this tp
  // rank's BT/tp rows (see the table below).
  bool sequence_parallel = false;
  // Context parallelism (parallel.cp): the engine's T is this rank's share
  // of the sequence, and attention runs as a ring (see the table below).
  int cp = 1;
  // The CUDA engine's flash attention runs the blocks' attention (see the
  // table below; never with cp > 1, whose ring has its own kernels).
  bool flash_attention = false;

  // Whether block `i` of a slice (0-based within the slice) recomputes.
  bool Recomputes(int i) const {
    return recompute != Recompute::kNone && (recompute_layers < 0 || i < recompute_layers);
  }
};

// Whether the CUDA engine's flash attention serves a model computing in
// `compute` with heads of head_dim channels: bf16 or fp16 (its tensor-core
// tiles take 16-bit operands; fp32 would need TF32) and 64 or 128 channels.
inline bool FlashAttentionApplies(DataType compute, int head_dim) {
  return (compute == DataType::kBFloat16 || compute == DataType::kFloat16) &&
         (head_dim == 64 || head_dim == 128);
}

// The tensors of block `l` ("block.<l>.<name>") in the order the table
// lays them out; the statistics are the names ending in _mean and _rstd.
inline constexpr const char* kBlockActivations[] = {
    "ln1",       "ln1_mean", "ln1_rstd",      "qkv",           "qk_pre",       "qk_rstd",
    "atty",      "att",      "residual2",     "ln2",           "ln2_mean",     "ln2_rstd",
    "fch",       "fch_act",  "router_logits", "router_scores", "router_gates", "router_experts",
    "moe_index", "moe_xp",   "moe_h_pre",     "moe_h",         "moe_y",        "residual3"};
// The block tensors holding 32-bit integers (4 bytes, whatever the
// compute type): an MoE layer's chosen experts and its permutation.
inline bool IntBlockActivation(const std::string& name) {
  return name == "router_experts" || name == "moe_index";
}

struct ActivationTensor {
  std::string name;  // "block.3.qkv", "logits", "dqkv", ...
  int64_t numel = 0;
  ActivationKind kind = ActivationKind::kSaved;
  DataType dtype = DataType::kFloat32;  // fp32 statistics, or the compute type
  int64_t offset = 0;                   // in bytes, within the kind's contiguous part (see below)
  int64_t bytes() const { return numel * int64_t(DataTypeSize(dtype)); }
};

class ActivationTable {
 public:
  // Preconditions (the callers validate them): B, T >= 1; slice within the
  // config's layers; tp divides heads. `compute`: the type of every tensor
  // but the fp32 statistics.
  ActivationTable(const ModelConfig& config, int B, int T, const ModelSlice& slice = {},
                  DataType compute = DataType::kFloat32, const ActivationPolicy& policy = {});

  // In allocation order: the saved tensors (layers in order, then the
  // model's ends), then the scratch ones. Each kind is contiguous: a
  // tensor's offset is within its kind.
  const std::vector<ActivationTensor>& tensors() const { return tensors_; }
  // The tensor with this name; aborts when there is none (a programming
  // error: the names are fixed above).
  const ActivationTensor& at(const std::string& name) const;
  // The tensor with this name, or nullptr.
  const ActivationTensor* find(const std::string& name) const;
  // Block l's tensor `name` (a kBlockActivations entry): its saved
  // "block.<l>.<name>", or the shared "recompute.<name>" a recomputing block
  // refills; nullptr where the recipe keeps none (RMSNorm's mean).
  const ActivationTensor* find_block(int l, const std::string& name) const;

  DataType compute() const { return compute_; }
  int64_t saved_bytes() const { return saved_; }  // per micro-batch in flight (every chunk)
  int64_t scratch_bytes() const { return scratch_; }
  // What an engine keeping `slots` micro-batches in flight allocates.
  int64_t bytes(int slots) const { return saved_ * slots + scratch_; }
  // Model chunks (1 without an interleaved pipeline), and the bytes [first,
  // second) of chunk c's saved set within the saved part.
  int chunks() const { return static_cast<int>(chunk_saved_.size()); }
  std::pair<int64_t, int64_t> chunk_saved(int c) const { return chunk_saved_[c]; }
  // What an engine keeping chunk_slots[c] sets of each chunk c allocates.
  int64_t bytes(const std::vector<int>& chunk_slots) const;

 private:
  // A tensor of the compute type, or (stat) an fp32 statistic.
  void Add(std::string name, int64_t numel, ActivationKind kind, bool stat = false);
  const DataType compute_;
  std::vector<ActivationTensor> tensors_;
  int64_t saved_ = 0, scratch_ = 0;  // bytes
  std::vector<std::pair<int64_t, int64_t>> chunk_saved_;
};

}  // namespace shardtrain::model

#endif  // SHARDTRAIN_COMMON_MODEL_ACTIVATIONS_H_
