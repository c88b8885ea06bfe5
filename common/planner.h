#ifndef SHARDTRAIN_COMMON_PLANNER_H_
#define SHARDTRAIN_COMMON_PLANNER_H_

// The planner: the plan of a job as a pure function of (validated spec,
// world). No I/O, threads or RPC; the coordinator stores the result with the
// job and `shardtrain plan` prints it.
//
// What a plan fixes (see shardtrain::v1::Plan in proto/shardtrain/v1/types.proto):
//   - rank -> (dp, tp, pp) coordinates and the dp, tp and pp groups, as
//     ParallelDims lays them out (common/parallel_dims.h), and each rank's
//     share of the batch (SplitBatch);
//   - the parameter layout (common/model/param_layout.h) and, per shard unit,
//     each dp rank's element range, as the workers split it
//     (common/shard_range.h: floor(numel/dp) each, the last rank also the
//     remainder). The ranges are contiguous in rank order, disjoint, and
//     cover [0, numel);
//   - pipeline stages (parallel.stages, or model::StageLayers' split
//     balanced by parameter count), micro-batch count and bubble fraction;
//   - per stage, for each of its ranks: the parameters of its slice
//     (ParamLayout(config, SliceOf(stage, tp))), predicted memory (model
//     state under ZeRO over dp, activations of the micro-batches in flight:
//     GPipe m, 1F1B min(m, pp - stage)) and bytes sent per optimizer step,
//     split into tp, pp and dp collectives; the plan's totals are the
//     busiest stage's.
//
// Thread-compatible: pure functions over values.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/job_spec.h"
#include "common/model/activations.h"
#include "common/model/config.h"
#include "common/model/slice.h"
#include "shardtrain/v1/types.pb.h"

namespace shardtrain {

// Bytes per element of each kind of model state.
struct StateBytesPerElement {
  int64_t params = 4;
  int64_t grads = 4;
  int64_t optimizer = 8;  // what AdamW keeps beside the parameters
  // optimizer.state int8: of `optimizer`, m and v (8) take 2 bytes per
  // element and 8 per block of kInt8StateBlock instead, and ZeRO shards
  // hold whole blocks (parallel::UnitShardRange's align).
  bool int8_moments = false;
};
// The 8-bit AdamW state's block (worker/optim/quant8.h kQuant8BlockSize).
inline constexpr int64_t kInt8StateBlock = 2048;
// Shards of whole blocks of this many elements under `per` (1 without 8-bit
// moments).
inline int64_t ShardAlign(const StateBytesPerElement& per) {
  return per.int8_moments ? kInt8StateBlock : 1;
}
// Elements the busiest dp rank (the last) owns of a unit of n elements split
// by parallel::UnitShardRange (shards of whole blocks of `align`).
int64_t BusiestShard(int64_t n, int dp, int64_t align = 1);
// Bytes of AdamW's state beside the parameters for n elements (one block
// grid from the first): per.optimizer · n in fp32, with 8-bit moments
// (per.optimizer − 6) · n + 8 · ceil(n / kInt8StateBlock).
int64_t OptimizerStateBytes(int64_t n, const StateBytesPerElement& per);
// The ZeRO paper's mixed-precision Adam (Rajbhandari et al. 2020, §3, K = 12):
// fp16 parameters and gradients, 2 + 2; fp32 master, m and v, 12.
inline constexpr StateBytesPerElement kZeroPaperMixed{2, 2, 12};
// What shardtrain's engines keep under `precision`: fp32 4 + 4 + 8 (params,
// grads, m + v); bf16 / fp16 the compute copy of the parameters 2, the
// gradients 4 (every engine accumulates them in fp32), the fp32 master, m
// and v 12: 18 bytes per element where the paper counts 16.
StateBytesPerElement EngineStateBytes(Precision precision);

// Bytes of model state (parameters, gradients, optimizer state) one dp rank
// holds for `num_params` elements under a ZeRO stage, the ZeRO paper's model
// (§3 and Fig. 1) with `per` bytes per element of each kind. Stage 1 shards
// the optimizer state over dp, 2 also the gradients, 3 also the parameters;
// a sharded part holds the busiest (last) dp rank's share,
// floor(num_params / dp) + num_params mod dp. So with kZeroPaperMixed, per
// element: Z0 16, Z1 4 + 12/dp, Z2 2 + 14/dp, Z3 16/dp.
// MakePlan applies it per shard unit (so the rounding is per unit), with
// EngineStateBytes(spec.precision).
// Preconditions: num_params >= 0, dp >= 1, 0 <= stage <= 3.
struct ModelStateBytes {
  int64_t params = 0;
  int64_t grads = 0;
  int64_t optimizer = 0;
  int64_t Total() const { return params + grads + optimizer; }
};
ModelStateBytes ZeroMemoryBytes(int64_t num_params, int dp, int stage,
                                const StateBytesPerElement& per);

// GPU ranks keep their model state through the host when they run ZeRO
// through Gloo or offload the optimizer (parallel::Zero's and Ddp's host
// paths): true for resources.device cuda with parallel.offload optimizer
// (over NCCL: DDP, which reduces on the GPUs and steps a host copy), or
// with parallel.zero >= 1 and parallel.comm not nccl (NCCL keeps ZeRO's
// shards on the devices).
bool StateThroughHost(const JobSpec& spec);
// Where that state lies, for `num_params` elements under `stage`: returned,
// the device's (ZeRO-2/3 engines give released units back: ModelEngineOptions::
// release_state, release_compute_copy) — params: up to ZeRO-2 the compute
// copy (the fp32 master itself in fp32) and the fp32 master beside a 16-bit
// copy, none under ZeRO-3; grads: whole under ZeRO-0/1, else none
// (ZeRO-2/3's units in use are MakePlan's working set: a unit's gradient
// from just before its backward until it is copied out, the embeddings'
// through the whole backward, and ZeRO-3's gathered units, fp32 master and
// compute copy); optimizer:
// AdamW's m and v of the shard, which live on the host. Added to *host: m
// and v, fp32 host copies of the whole parameters and gradients (the
// collectives' and the host step's), the gradient shard (stages 2-3) and the
// parameter shard (3). Stage 0 (DDP with the optimizer offloaded): the shard
// is the whole.
ModelStateBytes GpuThroughHostBytes(int64_t num_params, int dp, int stage,
                                    const StateBytesPerElement& per, int64_t* host);

// FLOPs one rank of a pipeline stage's slice computes per micro-batch of
// B·T tokens (N = B·T, Ct = C/tp, Ls the slice's layers, Vp the padded
// vocabulary):
//   train      the forward and backward, 6N + 12·L·C·T per token (Kaplan,
//              PaLM's MFU): 6·N·(12·Ls·C·Ct + LM head Vp·C/tp on the last
//              stage) + 12·Ls·N·T·Ct (the attention's scores and weighted
//              sum, 4·T·Ct per token forward, tripled);
//   recompute  the forward FLOPs model.recompute adds, per recomputing
//              block: selective the attention core again, 4·N·T·Ct; full
//              the block up to its GELU, 2·N·C·Ct·(3 + 1 + 4) (qkv, the
//              attention's projection, fc) + 4·N·T·Ct.
// Under context parallelism (policy.cp > 1) T is the whole sequence and the
// rank holds N = B·T/cp rows, each attending T keys; the ring's backward
// recomputes every block's attention core (4·N·T·Ct per block) whatever
// model.recompute says, so selective adds nothing to it.
struct MicroBatchFlops {
  double train = 0;
  double recompute = 0;
};
MicroBatchFlops StageFlops(const model::ModelConfig& config, int B, int T,
                           const model::ModelSlice& slice, const model::ActivationPolicy& policy);

// StageFlops of the stage where `spec`'s model.recompute adds the most
// (tp rank 0's slice; all tp ranks compute alike); {0, 0} when the spec's
// model does not make a config.
MicroBatchFlops BusiestRecompute(const JobSpec& spec);

// The number of blocks of a slice of `layers` blocks that recompute.
int RecomputedLayers(const model::ActivationPolicy& policy, int layers);

// Bytes of one rank's checkpoint shard file holding `elements` parameters
// in `ranges` flat ranges (worker/checkpoint/shard_file.h's format: a
// header, 16 bytes per range, fp32 params, AdamW m and v, the scalars, a
// checksum). The checkpoint format's test holds it to EncodeShard.
int64_t ShardFileBytes(int64_t elements, int64_t ranges);
// Bytes of the final weights file of a model of `num_params` parameters and
// `config`'s recipe (worker/checkpoint/weights_file.h's format).
int64_t WeightsFileBytes(int64_t num_params, const model::ModelConfig& config);
// The parameters of spec's model, padded vocabulary rows included: the
// plan's num_params, except under LoRA (whose plan counts the adapters, the
// parameters that train) the model's own, which its final weights hold.
int64_t ModelNumParams(const JobSpec& spec);
// Bytes of spec's final weights file (under LoRA the merged model).
int64_t FinalWeightsBytes(const JobSpec& spec);

// The plan of `spec` on `world` ranks.
//
// Returns INVALID_ARGUMENT when the layout is impossible, naming every
// factor, all problems joined by "; ", in the job spec's words (the rules
// of common/parallel_dims.h and the model config), e.g.
//   "parallel.dp × parallel.tp × parallel.pp = 2 × 1 × 3 = 6 ≠ world 4"
//   "parallel.tp: 3 does not divide model.heads: 4"
//   "parallel.pp: 3 exceeds model.layers: 2"
//   "batch.global: 30 is not divisible by batch.micro × parallel.dp = 8 × 4 = 32 (...)"
// The spec need not come from ParseJobSpec: everything the plan depends on
// is checked again here. job_id, generation and RankPlan::worker_id are left
// empty (the coordinator fills them in).
//
// Estimates (memory_per_rank, comm_bytes_per_step) are those of the busiest
// rank: ranks of one pipeline stage are alike, and the stage with the largest
// total memory (respectively the most bytes sent) is reported.
absl::StatusOr<v1::Plan> MakePlan(const JobSpec& spec, int world);

// "1.50 GiB", "12.0 MiB", "3.0 KiB", "12 B".
std::string FormatPlanBytes(int64_t bytes);

// Human-readable multi-line text of a plan (what `shardtrain plan` prints):
// header (world = dp·tp·pp, ZeRO, batch split, bubble), the per-stage
// table (layers, params, in-flight micro-batches, memory, tp/pp/dp bytes
// sent), rank table, memory
// per rank for the job's ZeRO stage and a comparison of stages 0-3, bytes
// sent per step, and the shard units with each dp rank's range (the middle
// units elided when there are more than 8). `plan` must be MakePlan(spec, w).
std::string PlanText(const JobSpec& spec, const v1::Plan& plan);

// PlanText's comparison of fine-tuning choices for a spec that fine-tunes
// (finetune.lora, or model.init): full training with fp32 and 8-bit AdamW
// state, LoRA on the model as the engine holds it, on int8 and on NF4
// weights (QLoRA), on the spec's layout: trained parameters, frozen model,
// model state, activations and total per rank. Empty for other specs.
std::string FinetuneComparison(const JobSpec& spec, const v1::Plan& plan);

}  // namespace shardtrain

#endif  // SHARDTRAIN_COMMON_PLANNER_H_
