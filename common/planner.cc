#include "common/planner.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/model/activations.h"
#include "common/model/config.h"
#include "common/model/param_layout.h"
#include "common/model/slice.h"
#include "common/parallel_dims.h"
#include "common/pipeline_schedule.h"
#include "common/shard_range.h"

namespace shardtrain {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

bool IsMixed(Precision p) { return p != Precision::kFp32; }

// Bytes per element of the parameters and gradients the forward/backward
// uses (the compute dtype): 4 in fp32, 2 in bf16/fp16.
int64_t ComputeBytes(Precision p) { return IsMixed(p) ? 2 : 4; }

bool IsBlock(const std::string& unit) { return unit.rfind("block.", 0) == 0; }

// Every problem that makes the layout impossible, each naming its factors:
// the same rules, in the same words, as the job spec (ParallelDims,
// SplitBatch, the model config), since a spec need not come from
// ParseJobSpec and `plan --world` may ask for another world.
std::vector<std::string> LayoutProblems(const JobSpec& spec, int world) {
  const ParallelSpec& par = spec.parallel;
  const ModelSpec& m = spec.model;
  const BatchSpec& b = spec.batch;
  std::vector<std::string> problems;
  auto add = [&problems](const absl::Status& s) {
    if (!s.ok()) problems.emplace_back(s.message());
  };
  if (world < 1) problems.push_back(absl::StrCat("world: ", world, " must be >= 1"));
  // The factors, then the world (checked apart so that the model's fit is
  // reported too when only the world is wrong).
  const ParallelDims::Factors factors{par.dp, par.cp, par.tp, par.pp};
  const absl::StatusOr<ParallelDims> dims = ParallelDims::Create(factors);
  add(dims.status());
  if (dims.ok() && world >= 1) add(ParallelDims::Create(factors, world).status());
  if (dims.ok() && b.seq_len >= 1) add(dims->CheckSequence(b.seq_len));
  const absl::StatusOr<model::ModelConfig> config = m.Config();
  add(config.status());
  if (dims.ok() && config.ok()) {
    const absl::Status fits = dims->CheckModelFits(*config);
    add(fits);
    // The split of the layers, once pp fits them.
    if (fits.ok()) add(model::StageLayers(*config, par.pp, par.stages, par.pp_virtual).status());
  }
  if (par.zero < 0 || par.zero > 3) {
    problems.push_back(absl::StrCat("parallel.zero: ", par.zero, " is not a ZeRO stage 0..3"));
  } else if (dims.ok()) {
    add(dims->CheckZero(par.zero));
  }
  if (par.bucket_mb < 1) {
    problems.push_back(absl::StrCat("parallel.bucket_mb: ", par.bucket_mb, " must be >= 1"));
  }
  if (b.seq_len < 1) {
    problems.push_back(absl::StrCat("batch.seq_len: ", b.seq_len, " must be >= 1"));
  } else if (m.context >= 1 && b.seq_len > m.context) {
    problems.push_back(
        absl::StrCat("batch.seq_len: ", b.seq_len, " exceeds model.context: ", m.context));
  }
  add(SplitBatch(b.global, b.micro, par.dp).status());
  const int64_t rows = int64_t{b.micro} * (b.seq_len / std::max(1, par.cp));
  if (par.sequence_parallel && (par.tp < 2 || rows % std::max(1, par.tp) != 0)) {
    problems.push_back(absl::StrCat("parallel.sequence_parallel: needs parallel.tp > 1 dividing ",
                                    "batch.micro × batch.seq_len",
                                    par.cp > 1 ? " / parallel.cp" : "", " = ", rows, " (tp is ",
                                    par.tp, ")"));
  }
  if (m.recompute_layers == 0 || m.recompute_layers < -1) {
    problems.push_back(
        absl::StrCat("model.recompute_layers: ", m.recompute_layers, " must be >= 1"));
  }
  return problems;
}

// What one pipeline stage's ranks hold: the shard units of its slice
// (ParamLayout(config, slice): tp-local shapes, the embeddings unit on the
// first and last stage, the final norm on the last) before dp sharding.
struct StageShape {
  model::ModelSlice slice;
  int64_t num_params = 0;
  int64_t wte = 0;                    // tp-local wte elements (0 without embeddings)
  std::vector<int64_t> local_numel;   // one per unit
  std::vector<std::string> names;     // their names
  int64_t experts = 0;                // elements of its experts' tensors (ExpertRanges)
  std::vector<int64_t> unit_experts;  // of each unit (an MoE block's tail)
};

StageShape ShapeOfStage(const model::ModelConfig& cfg, const model::ModelSlice& slice) {
  StageShape shape;
  shape.slice = slice;
  const model::ParamLayout layout(cfg, slice);
  shape.num_params = static_cast<int64_t>(layout.num_params());
  const std::vector<std::pair<size_t, size_t>> experts = layout.ExpertRanges();
  for (const model::UnitInfo& u : layout.units()) {
    shape.local_numel.push_back(static_cast<int64_t>(u.numel));
    shape.names.push_back(u.name);
    int64_t x = 0;
    for (const auto& [b, e] : experts) {
      if (b >= u.offset && b < u.offset + u.numel) x += static_cast<int64_t>(e - b);
    }
    shape.unit_experts.push_back(x);
    shape.experts += x;
  }
  if (slice.has_embeddings(cfg)) shape.wte = static_cast<int64_t>(layout.tensors()[0].numel);
  return shape;
}

}  // namespace

namespace {

struct Estimate {
  v1::MemoryEstimate memory;
  int in_flight = 1;
  int64_t tp_comm = 0, pp_comm = 0, dp_comm = 0, cp_comm = 0, ep_comm = 0;
  int64_t comm() const { return tp_comm + pp_comm + dp_comm + cp_comm + ep_comm; }
};

// Bytes the ring algorithms send per rank, as parallel::Zero counts the ops it
// issues on a unit of n elements split by UnitShardRange (S = n/dp on the
// body, R = n mod dp in the tail) with `eb` bytes per element.
int64_t GatherBytes(int64_t n, int dp, int64_t eb) {  // all-gather + tail broadcast
  const int64_t S = n / dp, R = n - S * dp;
  return (dp - 1) * S * eb + (R > 0 ? (dp - 1) * R * eb / dp : 0);
}
int64_t ReduceScatterBytes(int64_t n, int dp, int64_t eb) {  // + tail all-reduce
  const int64_t S = n / dp, R = n - S * dp;
  return (dp - 1) * S * eb + (R > 0 ? 2 * (dp - 1) * R * eb / dp : 0);
}
int64_t AllReduceBytes(int64_t n, int dp, int64_t eb) { return 2 * (dp - 1) * n * eb / dp; }

// Peak elements of whole units ZeRO-3 holds gathered: the unit in use and the
// next use's unit (prefetched), or, without resharding after forward, every
// unit (all are gathered at the end of the forward).
int64_t GatheredPeak(const StageShape& shape, bool reshard, bool tied_head) {
  const std::vector<std::string>& names = shape.names;
  int64_t all = 0;
  for (int64_t n : shape.local_numel) all += n;
  if (!reshard) return all;
  int emb = -1, fin = -1;
  std::vector<int> blocks;
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == "embeddings")
      emb = static_cast<int>(i);
    else if (names[i] == "final")
      fin = static_cast<int>(i);
    else
      blocks.push_back(static_cast<int>(i));
  }
  const std::vector<int> uses = parallel::UnitUseOrder(emb, blocks, fin, tied_head, nullptr);
  int64_t peak = 0;
  for (size_t i = 0; i < uses.size(); ++i) {
    int64_t live = shape.local_numel[uses[i]];
    if (i + 1 < uses.size() && uses[i + 1] != uses[i]) live += shape.local_numel[uses[i + 1]];
    peak = std::max(peak, live);
  }
  return peak;
}

// Memory and bytes sent per step for one rank of stage `s` under ZeRO `zero`.
Estimate EstimateStage(const JobSpec& spec, const model::ModelConfig& cfg, const StageShape& shape,
                       int s, int zero, int m) {
  const std::vector<std::string>& names = shape.names;
  // Gradients are reduced, and ZeRO shards, over the replica group: the dp
  // ranks and, under context parallelism, their cp ranks (dp · cp).
  const int dp = spec.parallel.dp * spec.parallel.cp, tp = spec.parallel.tp, pp = spec.parallel.pp;
  const int cp = spec.parallel.cp;
  const bool mixed = IsMixed(spec.precision);
  StateBytesPerElement per = EngineStateBytes(spec.precision);
  per.int8_moments = spec.optimizer.state == OptimizerState::kInt8;
  const int64_t pb = per.params;                    // param bytes/element (the compute dtype)
  const int64_t gb = per.grads;                     // gradients: fp32 on every engine
  const int64_t ab = ComputeBytes(spec.precision);  // activations sent between ranks
  // A rank's rows: batch.seq_len / cp tokens of each sequence.
  const int64_t BT = int64_t{spec.batch.micro} * spec.LocalSeqLen(), BTC = BT * cfg.dim;
  const int64_t Ls = shape.slice.total_layers(cfg);
  const bool first = s == 0, last = s == pp - 1;
  const bool reshard = spec.parallel.reshard_after_forward;

  Estimate e;
  v1::MemoryEstimate& mem = e.memory;
  const bool through_host = StateThroughHost(spec);
  // Under expert parallelism ZeRO shards each MoE block's experts (its
  // tail) over the edp = dp · cp / ep ranks holding the same experts, the
  // rest over dp · cp (parallel::Zero's parts).
  const int edp = dp / spec.parallel.ep;
  auto over_parts = [&](size_t unit, auto f) {
    const int64_t x = shape.unit_experts[unit];
    return f(shape.local_numel[unit] - x, dp) + (x > 0 ? f(x, edp) : decltype(f(x, edp)){});
  };
  int64_t emb = 0, largest_block = 0, host = 0;
  for (size_t i = 0; i < shape.local_numel.size(); ++i) {
    const int64_t n = shape.local_numel[i];
    const int64_t x = shape.unit_experts[i];
    ModelStateBytes b;
    for (const auto& [count, group] : {std::pair<int64_t, int>{n - x, dp}, {x, edp}}) {
      const ModelStateBytes part = through_host
                                       ? GpuThroughHostBytes(count, group, zero, per, &host)
                                       : ZeroMemoryBytes(count, group, zero, per);
      b.params += part.params;
      b.grads += part.grads;
      b.optimizer += part.optimizer;
    }
    mem.set_params_bytes(mem.params_bytes() + b.params);
    mem.set_grads_bytes(mem.grads_bytes() + b.grads);
    mem.set_optimizer_bytes(mem.optimizer_bytes() + b.optimizer);
    if (names[i] == "embeddings" && cfg.tie_embeddings) emb = n;
    // An untied LM head's gradient is made in the final unit's backward,
    // like a block's.
    if (IsBlock(names[i]) || (!cfg.tie_embeddings && names[i] == "final")) {
      largest_block = std::max(largest_block, n);
    }
  }

  // Activations and backward scratch: the engine's own table for this
  // stage's slice of the model (common/model/activations.h), its saved
  // tensors once per micro-batch alive at once, as the stage's schedule
  // holds them (PeakInFlight, the engine's slots): 1 without a pipeline;
  // GPipe all m forwards before the first backward, 1F1B at most pp - s on
  // stage s; interleaved, each chunk's own peak of its chunk's sets.
  // Stored in the compute dtype (as llm.c's floatX), statistics in fp32.
  const model::ActivationTable acts(cfg, spec.batch.micro, spec.LocalSeqLen(), shape.slice,
                                    mixed ? DataType::kBFloat16 : DataType::kFloat32,
                                    spec.Activations());
  const int v = spec.parallel.pp_virtual;
  const std::vector<parallel::PipelineAction> actions =
      parallel::PipelineActions(spec.parallel.schedule, s, pp, m, v);
  const std::vector<int> chunk_sets = parallel::PeakInFlightPerChunk(actions, v);
  e.in_flight = 0;
  for (int n : chunk_sets) e.in_flight += n;
  mem.set_activations_bytes(acts.bytes(chunk_sets));

  // Working set of ZeRO-2/3 (parallel::Zero): whole-unit gradients alive in
  // backward — a tied head's embeddings' from the LM head to the end, the unit
  // computing and, with dp > 1, the one before it still being
  // reduce-scattered — plus, for ZeRO-3, the gathered parameters
  // (GatheredPeak). Reported as the sum of the two peaks, which bounds their
  // simultaneous peak.
  // Through the host (GPU ranks), a unit's device gradient lives only until
  // it is copied out, and the gathered units are fp32 masters.
  int64_t working = 0;
  if (zero >= 2) {
    working += gb * (emb + (dp > 1 && !through_host ? 2 : 1) * largest_block);
  }
  // A gathered unit: its parameters in the compute type, and under mixed
  // precision also its fp32 master, from which the engine refreshes the
  // compute copy (held only while the unit is in use:
  // ModelEngineOptions::release_compute_copy).
  if (zero == 3)
    working += (pb + per.optimizer - 8) * GatheredPeak(shape, reshard, cfg.tie_embeddings);
  mem.set_working_bytes(working);
  // Communication buffers. Collectives run in place on the model's buffers;
  // ZeRO-2/3 with gradient accumulation receive each micro-batch's
  // reduce-scatter into a shard-sized buffer before adding it. On CPU ranks
  // the Gloo backend (worker/comm/gloo_communicator.cc) also keeps fp32
  // scratch sized by its largest op: a ring all-reduce of c elements one
  // block of c/dp + 1, a reduce-scatter of blocks of S three blocks. DDP
  // all-reduces buckets of bucket_mb, ZeRO-1 whole units, ZeRO-2/3
  // reduce-scatter units (S = numel/dp).
  if (dp > 1) {
    int64_t bytes = 0, largest = 0, local = 0;
    for (int64_t n : shape.local_numel) {
      largest = std::max(largest, n);
      local += n;
    }
    if (zero >= 2 && m > 1) {
      int64_t shard = 0;
      for (size_t i = 0; i < shape.local_numel.size(); ++i) {
        shard +=
            over_parts(i, [&](int64_t n, int g) { return BusiestShard(n, g, ShardAlign(per)); });
      }
      (through_host ? host : bytes) += shard * gb;
    }
    // parallel.reduce_dtype bf16: DDP's bf16 copy of the gradient.
    if (zero == 0 && spec.parallel.reduce_dtype == ReduceDtype::kBf16) bytes += 2 * local;
    if (spec.resources.device == DeviceKind::kCpu) {
      constexpr int64_t kF32 = 4;
      const int64_t bucket = std::min(int64_t{spec.parallel.bucket_mb} * kMiB / kF32, local);
      if (zero == 0) bytes += (bucket / dp + 1) * kF32;
      if (zero == 1) bytes += (largest / dp + 1) * kF32;
      if (zero >= 2) bytes += 3 * (largest / dp) * kF32;
    }
    mem.set_comm_buffer_bytes(bytes);
  }
  const bool offload = spec.parallel.offload == OffloadMode::kOptimizer || through_host;
  if (offload) mem.set_host_bytes(through_host ? host : mem.optimizer_bytes());
  // LoRA: the frozen model of the slice, whole on every rank, in the
  // engine's compute type (fp32 on CPU workers) or with its linear layers
  // quantized (finetune.base_dtype), as the engines hold it.
  if (cfg.lora.on()) {
    mem.set_frozen_bytes(model::FrozenModelBytes(
        model::ParamLayout(model::BaseConfig(cfg), shape.slice), spec.FrozenFormat()));
  }
  mem.set_total_bytes(mem.frozen_bytes() + mem.params_bytes() + mem.grads_bytes() +
                      (offload ? 0 : mem.optimizer_bytes()) + mem.activations_bytes() +
                      mem.comm_buffer_bytes() + mem.working_bytes());

  // Bytes this rank sends per optimizer step: the ring model of the ops
  // parallel::Zero issues per unit (GatherBytes, ReduceScatterBytes,
  // AllReduceBytes above) and DDP's all-reduce of the whole gradient.
  // Gradients: ZeRO 0/1 accumulate micro-batches locally and all-reduce once
  // per step; ZeRO 2/3 keep only a gradient shard, so they reduce-scatter
  // after every micro-batch's backward. Parameters: ZeRO 1/2 all-gather the
  // updated shards once per step; ZeRO-3 gathers every unit before each
  // micro-batch's forward and again before its backward (once when
  // reshard_after_forward is false, or for units used back to back: the
  // embeddings from the LM head's forward to its backward). ZeRO 1-3 also
  // all-gather one double per rank (the gradient norm).
  int64_t comm = 0;
  if (dp > 1) {
    int64_t local = 0;
    for (size_t i = 0; i < shape.local_numel.size(); ++i) {
      local += shape.local_numel[i];
      // Gathers per micro-batch under ZeRO-3: each unit once for its
      // forward and once for its backward (the embeddings: for the encoder,
      // then for a tied LM head's forward and backward back to back; once
      // only with an untied head), or once in all without resharding.
      const bool untied_embeddings = !cfg.tie_embeddings && shape.names[i] == "embeddings";
      const int gathers = reshard && !untied_embeddings ? 2 : 1;
      comm += over_parts(i, [&](int64_t n, int g) -> int64_t {
        switch (zero) {
          case 0:
            return 0;
          case 1:
            return AllReduceBytes(n, g, gb) + GatherBytes(n, g, pb);
          case 2:
            return m * ReduceScatterBytes(n, g, gb) + GatherBytes(n, g, pb);
          default:
            return m * (ReduceScatterBytes(n, g, gb) + gathers * GatherBytes(n, g, pb));
        }
      });
    }
    if (zero == 0) {
      // Under expert parallelism the experts' gradients are summed over the
      // dp · cp / ep ranks that hold the same experts, the rest over dp · cp.
      const int64_t rb = spec.parallel.reduce_dtype == ReduceDtype::kBf16 ? 2 : gb;
      comm += AllReduceBytes(local - shape.experts, dp, rb) +
              (edp > 1 ? AllReduceBytes(shape.experts, edp, rb) : 0);
    }
    if (zero >= 1) comm += (dp - 1) * 8;
  }
  e.dp_comm = comm;
  // Tensor parallel, per micro-batch (ring all-reduces over tp, each sending
  // 2(tp-1)/tp of its bytes): per block two all-reduces of B·T·C
  // activations in forward (after the row-parallel attention and MLP
  // projections) and two in backward (the input gradients of the
  // column-parallel QKV and fc); the vocabulary-parallel embedding's
  // forward all-reduce of B·T·C on the first stage; on the last, the LM
  // head's input gradient (B·T·C, backward) and the vocabulary-parallel
  // cross-entropy's three all-reduces of B·T fp32 values (the row maxima,
  // the sums of exponentials, the target logits). Full recomputation
  // repeats each recomputing block's attention-projection all-reduce.
  //
  // Sequence parallelism (h: one all-gather or reduce-scatter of B·T·C,
  // (tp-1)·B·T·C/tp elements sent; an all-reduce is 2h): per block in
  // forward 2 all-gathers (the LayerNorm outputs into the column-parallel
  // layers) and 2 reduce-scatters (the row-parallel outputs), in backward
  // their conjugates (2 reduce-scatters, 2 all-gathers) and 2 all-gathers
  // more (the LayerNorm outputs gathered again for the weight gradients, as
  // Megatron-LM does: only 1/tp of them is kept) — 10h where tp alone sends
  // 8h; a full refill 2 all-gathers and a reduce-scatter (3h, not 2h); the
  // embedding's reduce-scatter and its gradient's all-gather, the final
  // norm's all-gather and its gradient's reduce-scatter (2h each, as
  // before); and once per step the all-reduce of the norms' gradients
  // (fp32, 2C per LayerNorm, C per RMSNorm), which each rank computes on its
  // rows only.
  if (tp > 1) {
    const bool sp = spec.parallel.sequence_parallel;
    const int64_t refills = spec.model.recompute == Recompute::kFull
                                ? RecomputedLayers(spec.Activations(), static_cast<int>(Ls))
                                : 0;
    const int64_t ends = (first ? 1 : 0) + (last ? 1 : 0);
    const int64_t activations =
        sp ? (10 * Ls + 3 * refills + 2 * ends) * ((tp - 1) * (BTC / tp) * ab)
           : (4 * Ls + refills + ends) * AllReduceBytes(BTC, tp, ab);
    e.tp_comm = m * (activations + (last ? 3 * AllReduceBytes(BT, tp, 4) : 0));
    const int64_t norm_params = cfg.norm == model::NormKind::kLayerNorm ? 2 * cfg.dim : cfg.dim;
    if (sp) e.tp_comm += AllReduceBytes(norm_params * (2 * Ls + (last ? 1 : 0)), tp, 4);
  }
  // Pipeline: per micro-batch, activations (B·T·C) to the next stage and
  // their gradient back to the previous one; once per step the first and
  // last stages sum a tied head's wte gradient (an all-reduce of two ranks:
  // each sends its tp-local wte gradient once).
  // Under sequence parallelism each tp rank exchanges its rows only.
  // Interleaved, every chunk's forward and backward exchange, but at the
  // pipeline's two ends (the first chunk of stage 0, the last of the last).
  const int64_t io = spec.parallel.sequence_parallel ? BTC / tp : BTC;
  e.pp_comm = m * ((last ? v - 1 : v) + (first ? v - 1 : v)) * io * ab;
  if (pp > 1 && (first || last) && cfg.tie_embeddings) {
    e.pp_comm += AllReduceBytes(shape.wte, 2, gb);
  }
  // Context parallelism's ring (engine/model_engine.h), per block and
  // micro-batch, in blocks of B·T/cp rows of this rank's keys and values
  // (2·KV/tp columns): forward cp − 1 passes of a block; backward cp − 1
  // passes of a block and cp of its gradient; a full refill the forward's
  // again.
  if (cp > 1) {
    const int64_t refills = spec.model.recompute == Recompute::kFull
                                ? RecomputedLayers(spec.Activations(), static_cast<int>(Ls))
                                : 0;
    const int64_t block = BT * 2 * cfg.kv_heads * cfg.head_dim() / tp * ab;
    e.cp_comm = m * block * (Ls * (3 * int64_t{cp} - 2) + refills * (cp - 1));
  }
  // Expert parallelism (engine/model_engine.h's MoE layers), per MoE layer
  // and micro-batch: the kept pairs per (rank, expert) out (E/ep fp32 to
  // each other rank), then this rank's B·T·K pairs of C to their experts'
  // ranks and back, (ep − 1)/ep of them off this rank with routing in
  // balance (dropless), in forward; their gradients both ways in backward;
  // a full refill the forward's again.
  if (spec.parallel.ep > 1) {
    const int64_t ep = spec.parallel.ep, K = cfg.moe.top_k, El = cfg.moe.experts / ep;
    int64_t moe_layers = 0, refilled = 0;
    const int64_t k = spec.model.recompute == Recompute::kFull
                          ? RecomputedLayers(spec.Activations(), static_cast<int>(Ls))
                          : 0;
    for (int i = 0; i < Ls; ++i) {
      if (!cfg.moe_layer(shape.slice.Layer(cfg, i))) continue;
      ++moe_layers;
      if (i < k) ++refilled;
    }
    const int64_t rows = BT * K * (ep - 1) / ep * cfg.dim * ab;
    const int64_t counts = (ep - 1) * El * 4;
    e.ep_comm = m * ((moe_layers + refilled) * (counts + 2 * rows) + moe_layers * 2 * rows);
  }
  return e;
}

}  // namespace

absl::StatusOr<v1::Plan> MakePlan(const JobSpec& spec, int world) {
  std::vector<std::string> problems = LayoutProblems(spec, world);
  if (!problems.empty()) return absl::InvalidArgumentError(absl::StrJoin(problems, "; "));

  const ParallelSpec& par = spec.parallel;
  const int dp = par.dp, tp = par.tp, pp = par.pp;
  // The trained model: under LoRA its layout's flat buffer is the adapters.
  // (A spec ParseJobSpec accepted has one; a caller's variant, such as the
  // fine-tuning comparison's adapters on an MoE model, may not.)
  const absl::StatusOr<model::ModelConfig> trained = spec.TrainedConfig();
  if (!trained.ok()) return trained.status();
  const model::ModelConfig& cfg = *trained;
  const model::ParamLayout layout(cfg);
  const ParallelDims dims =
      *ParallelDims::Create(ParallelDims::Factors{dp, par.cp, tp, pp, par.ep}, world);
  const int replicas = dims.replicas();  // what ZeRO shards over: dp · cp
  const BatchSplit split = *spec.Split();
  const int m = split.accum;

  v1::Plan plan;
  plan.set_world(world);
  plan.set_dp(dp);
  plan.set_cp(par.cp);
  plan.set_ep(par.ep);
  plan.set_tp(tp);
  plan.set_pp(pp);
  plan.set_zero_stage(par.zero);
  plan.set_micro_batch(spec.batch.micro);
  plan.set_grad_accum_steps(m);
  plan.set_seq_len(spec.batch.seq_len);
  plan.set_global_batch(spec.batch.global);
  plan.set_schedule(std::string(EnumName(par.schedule)));
  plan.set_pp_virtual(par.pp_virtual);
  plan.set_bubble_fraction(pp == 1 ? 0.0 : parallel::BubbleFraction(pp, m, par.pp_virtual));
  // The layout's count: it includes the padded wte rows (Vp - V), which are
  // allocated, sharded and communicated like any other parameter.
  plan.set_num_params(static_cast<int64_t>(layout.num_params()));

  for (int r = 0; r < world; ++r) {
    const MeshCoord c = dims.Coord(r);
    v1::RankPlan* rp = plan.add_ranks();
    rp->set_rank(r);
    rp->set_tp(c.tp);
    rp->set_dp(c.dp);
    rp->set_pp(c.pp);
    rp->set_cp(c.cp);
    rp->set_first_sample(split.first_sample(c.dp));
    rp->set_num_samples(split.per_replica());
  }

  // Groups, each kind's numbered in rank order of their first member.
  std::vector<GroupKind> kinds = {GroupKind::kDp, GroupKind::kTp, GroupKind::kPp};
  if (par.cp > 1) kinds.insert(kinds.end(), {GroupKind::kCp, GroupKind::kReplica});
  if (par.ep > 1) kinds.insert(kinds.end(), {GroupKind::kEp, GroupKind::kExpertDp});
  for (GroupKind kind : kinds) {
    int index = 0;
    for (const std::vector<int>& ranks : dims.Groups(kind)) {
      v1::Group* g = plan.add_groups();
      g->set_kind(std::string(GroupKindName(kind)));
      g->set_index(index++);
      for (int r : ranks) g->add_ranks(r);
    }
  }

  for (const model::TensorInfo& t : model::TrainedTensors(layout)) {
    v1::ParamTensor* pt = plan.add_layout();
    pt->set_name(t.name);
    for (int64_t d : t.shape) pt->add_shape(d);
    pt->set_offset(static_cast<int64_t>(t.offset));
    pt->set_unit(layout.units()[t.unit].name);
    pt->set_decay(t.decay);
  }

  for (const model::UnitInfo& u : layout.units()) {
    v1::ShardUnit* su = plan.add_units();
    su->set_name(u.name);
    su->set_offset(static_cast<int64_t>(u.offset));
    su->set_numel(static_cast<int64_t>(u.numel));
    for (int i = 0; i < replicas; ++i) {
      const parallel::ShardRange r = parallel::UnitShardRange(
          u.numel, replicas, i,
          spec.optimizer.state == OptimizerState::kInt8 ? size_t{kInt8StateBlock} : 1);
      su->add_shard_offsets(static_cast<int64_t>(r.begin));
      su->add_shard_sizes(static_cast<int64_t>(r.size()));
    }
  }

  // Stages: the job's parallel.stages, or balanced by parameter count.
  const std::vector<int> stage_layers = *model::StageLayers(cfg, pp, par.stages, par.pp_virtual);
  int64_t comm = -1;
  for (int s = 0; s < pp; ++s) {
    model::ModelSlice slice = model::SliceOf(stage_layers, s, tp, 0, par.pp_virtual);
    slice.ep = par.ep;  // a rank's experts: E / ep of each MoE layer
    const StageShape shape = ShapeOfStage(cfg, slice);
    const Estimate e = EstimateStage(spec, cfg, shape, s, par.zero, m);
    v1::PipelineStage* st = plan.add_stages();
    st->set_stage(s);
    st->set_first_layer(slice.first_layer);
    st->set_num_layers(slice.num_layers);
    st->set_chunks(slice.chunks);
    st->set_chunk_stride(slice.chunk_stride);
    st->set_num_params(shape.num_params);
    *st->mutable_memory() = e.memory;
    st->set_in_flight(e.in_flight);
    st->set_tp_comm_bytes(e.tp_comm);
    st->set_pp_comm_bytes(e.pp_comm);
    st->set_dp_comm_bytes(e.dp_comm);
    st->set_cp_comm_bytes(e.cp_comm);
    st->set_ep_comm_bytes(e.ep_comm);
    if (s == 0 || e.memory.total_bytes() > plan.memory_per_rank().total_bytes()) {
      *plan.mutable_memory_per_rank() = e.memory;
    }
    if (e.comm() > comm) {
      comm = e.comm();
      plan.set_tp_comm_bytes_per_step(e.tp_comm);
      plan.set_pp_comm_bytes_per_step(e.pp_comm);
      plan.set_dp_comm_bytes_per_step(e.dp_comm);
      plan.set_cp_comm_bytes_per_step(e.cp_comm);
      plan.set_ep_comm_bytes_per_step(e.ep_comm);
    }
  }
  plan.set_comm_bytes_per_step(comm);

  // One checkpoint: every parameter once, over the ranks' shards, one range
  // each (DDP's even split) or one per shard unit (ZeRO). A rank's shard is
  // about its stage slice's 1/dp (ZeRO's remainders and tp's replicated
  // tensors, saved by one tp rank, make it a few elements more or less).
  const int64_t ranges = par.zero > 0 ? plan.units_size() : 1;
  int64_t busiest = 0;
  for (const v1::PipelineStage& st : plan.stages()) {
    busiest = std::max<int64_t>(busiest, (st.num_params() + replicas - 1) / replicas);
  }
  plan.set_checkpoint_bytes(ShardFileBytes(plan.num_params(), ranges * world) +
                            (world - 1) * ShardFileBytes(0, 0));
  plan.set_checkpoint_bytes_per_rank(ShardFileBytes(busiest, ranges));
  return plan;
}

}  // namespace shardtrain
