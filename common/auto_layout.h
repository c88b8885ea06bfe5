// AutoLayout: the search behind `shardtrain plan --auto`. Given a job spec,
// a number of ranks and a memory budget per rank, it plans every data ×
// tensor × pipeline layout (and ZeRO stage) the model allows on those ranks,
// drops those whose busiest rank needs more memory than the budget, and
// ranks the rest by a simple predicted step time. Pure: each candidate is
// MakePlan (planner.h) of the spec with the layout's fields replaced.
//
// Candidates: every dp × cp × tp × pp = ranks — cp as the spec has it when
// it sets parallel.cp > 1; otherwise 1, and for a long sequence (seq_len >=
// 2048) on CPU ranks every cp that divides the ranks with 2·cp dividing
// seq_len and >= 128 tokens per rank (context parallelism trades ring bytes
// for activation memory ∝ 1/cp: it wins where memory forces it) — with tp
// dividing model.heads, 4·dim
// and the padded vocabulary and pp <= model.layers (ParallelDims::
// CheckModelFits); ZeRO 0..3, 3 only with pp = 1 (ParallelDims::CheckZero);
// schedule 1F1B; layers split balanced by parameter count. The spec's global
// batch and sequence length are kept; so is batch.micro unless global is not
// a multiple of micro·dp, in which case the largest micro below it that
// divides is taken (the candidate says so). A dp that divides no micro
// batch of the global batch is skipped.
//
// Activation recomputation: a layout that does not fit with the spec's
// model.recompute is planned again with more recomputation, cheapest first —
// selective, then full on the first K blocks of each stage for K = 1, 2, ...
// up to every block — and kept with the first that fits (the candidate says
// which, and what it would need without). One that fits with none of them
// is reported with full recomputation of every block, its smallest need.
//
// Cost model (no overlap of compute and communication; a rough guide to
// rank layouts, not a prediction of wall time):
//   compute = 6 · params · tokens per step / (ranks · flops_per_rank)
//             / (1 − bubble) · (1 + recompute),
//             bubble = (pp − 1) / (m + pp − 1), recompute = the forward
//             FLOPs recomputation adds on the busiest stage over its
//             training FLOPs (planner.h BusiestRecompute)
//   tp      = tp bytes sent per step by the busiest rank / tp_bandwidth
//   pp      = pp bytes / link_bandwidth
//   dp      = dp bytes / link_bandwidth
//   step    = compute + tp + pp + dp
// where params counts the whole model (padded vocabulary included) and the
// bytes are the plan's (v1::Plan tp/pp/dp_comm_bytes_per_step).
//
// Thread-compatible: pure functions over values.
#ifndef SHARDTRAIN_COMMON_AUTO_LAYOUT_H_
#define SHARDTRAIN_COMMON_AUTO_LAYOUT_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/job_spec.h"

namespace shardtrain {

struct CostModel {
  double flops_per_rank = 100e12;  // FLOP/s each rank sustains
  double tp_bandwidth = 300e9;     // bytes/s each rank sends inside a tp group (NVLink-class)
  double link_bandwidth = 25e9;    // bytes/s each rank sends between nodes (pp, dp)
  // Ranks of one node: an ep group spanning tp · ep <= this consecutive
  // ranks sends its all-to-all at tp_bandwidth (inside the node), a wider
  // one at link_bandwidth.
  int ranks_per_node = 8;
};

struct AutoLayoutOptions {
  int ranks = 0;                // >= 1
  int64_t memory_per_rank = 0;  // bytes, >= 1
  CostModel cost;
};

// One planned layout and its predicted cost.
struct LayoutCandidate {
  int dp = 1, cp = 1, tp = 1, pp = 1, zero = 0;
  int ep = 1;                   // parallel.ep (MoE models: experts over ep ranks of dp × cp)
  int micro = 0;                // batch.micro used
  bool micro_adjusted = false;  // micro differs from the spec's
  int accum = 0;                // m: micro-batches per step per replica
  double bubble = 0;            // (pp − 1) / (m + pp − 1)
  int64_t peak_memory = 0;      // bytes on the busiest rank (max over stages)
  // model.recompute and recompute_layers used (-1: every block), the extra
  // FLOPs' share, and peak_memory with the spec's own mode when it differs.
  Recompute recompute = Recompute::kNone;
  int recompute_layers = -1;
  double recompute_share = 0;
  int64_t memory_without = 0;  // 0: the spec's own mode was kept
  // cp_s: the context-parallel ring's bytes over the link; ep_s: the MoE
  // layers' all-to-all bytes, inside a node or over the link
  // (CostModel::ranks_per_node).
  double compute_s = 0, tp_s = 0, pp_s = 0, dp_s = 0, cp_s = 0, ep_s = 0;
  double step_s() const { return compute_s + tp_s + pp_s + dp_s + cp_s + ep_s; }
  // The model FLOP/s each rank does at the predicted step: 6 · the
  // parameters a token uses · tokens per step / ranks / step_s (what MFU
  // and Megatron's "TFLOP/s per GPU" count, attention left out).
  double model_flops_per_rank = 0;
  // The layout as `--set` overrides of the spec: parallel.dp, tp, pp, zero,
  // schedule=1f1b, parallel.cp and parallel.ep when they differ from the spec's,
  // parallel.stages=[] when the spec
  // named stages, batch.micro when adjusted, model.recompute (and recompute_layers) when
  // recomputation was turned on.
  std::vector<std::string> Overrides(const JobSpec& spec) const;
};

struct AutoLayoutResult {
  std::vector<LayoutCandidate> fitting;  // fastest first (ties: less memory, then fewer pp, tp)
  std::vector<LayoutCandidate> too_big;  // over the budget, least memory first
  int64_t num_params = 0;                // of the whole model
};

// INVALID_ARGUMENT when options.ranks < 1 or memory_per_rank < 1, or when
// no layout at all exists on that many ranks (the message says why: no dp
// divides the global batch, ...). A result with no fitting candidate is not
// an error: the caller reports it (with too_big's smallest need).
absl::StatusOr<AutoLayoutResult> AutoLayout(const JobSpec& spec, const AutoLayoutOptions& options);

// The ranked table (at most `top` rows), the cost model and the chosen
// layout as --set overrides; or, when nothing fits, the smallest layouts'
// needs. What `shardtrain plan --auto` prints.
std::string AutoLayoutText(const JobSpec& spec, const AutoLayoutOptions& options,
                           const AutoLayoutResult& result, int top = 10);

// "4GiB", "80 GiB", "512MiB", "1.5GB", "1000000" (bytes): binary units
// KiB MiB GiB TiB, decimal KB MB GB TB, B or none for bytes; case-sensitive
// units, a positive finite number. INVALID_ARGUMENT naming `what` otherwise.
absl::StatusOr<int64_t> ParseByteSize(std::string_view text, std::string_view what);

}  // namespace shardtrain

#endif  // SHARDTRAIN_COMMON_AUTO_LAYOUT_H_
