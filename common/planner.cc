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
#include "common/parallel_dims.h"
#include "common/shard_range.h"

namespace shardtrain {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr double kGiB = double(int64_t{1} << 30);

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

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
  const absl::StatusOr<ParallelDims> dims = ParallelDims::Create(par.dp, par.tp, par.pp);
  add(dims.status());
  if (dims.ok() && world >= 1) add(ParallelDims::Create(par.dp, par.tp, par.pp, world).status());
  const absl::Status config =
      model::MakeGptConfig(m.layers, m.heads, m.dim, m.context, m.vocab).status();
  add(config);
  if (dims.ok() && config.ok()) add(dims->CheckModelFits(m.layers, m.heads, m.dim));
  if (par.zero < 0 || par.zero > 3) {
    problems.push_back(absl::StrCat("parallel.zero: ", par.zero, " is not a ZeRO stage 0..3"));
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
  return problems;
}

// What one pipeline stage's ranks hold: the shard units resident there and,
// for each, the elements of it a rank keeps before dp sharding.
struct StageShape {
  int first_layer = 0;
  int num_layers = 0;
  std::vector<int64_t> local_numel;  // one per resident unit
  std::vector<std::string> names;    // their names
};

// Units resident on stage s of pp: its blocks; "embeddings" on the first
// stage and, since the LM head is tied to wte, on the last one too; "final"
// on the last. Tensor parallelism is approximated by dividing each block
// unit by tp (in Megatron only the matmul weights and their biases are
// split; LayerNorm parameters are replicated), embeddings and the final norm
// are replicated over tp.
StageShape ShapeOfStage(const model::ParamLayout& layout, const v1::PipelineStage& st, int pp,
                        int tp) {
  StageShape shape;
  shape.first_layer = st.first_layer();
  shape.num_layers = st.num_layers();
  const bool first = st.stage() == 0, last = st.stage() == pp - 1;
  for (const model::UnitInfo& u : layout.units()) {
    const int64_t n = static_cast<int64_t>(u.numel);
    if (u.name == "embeddings") {
      if (first || last) shape.local_numel.push_back(n);
    } else if (u.name == "final") {
      if (last) shape.local_numel.push_back(n);
    } else if (IsBlock(u.name)) {
      const int layer = std::stoi(u.name.substr(std::string("block.").size()));
      if (layer >= shape.first_layer && layer < shape.first_layer + shape.num_layers) {
        shape.local_numel.push_back(CeilDiv(n, tp));
      }
    }
    if (shape.names.size() < shape.local_numel.size()) shape.names.push_back(u.name);
  }
  return shape;
}

struct Estimate {
  v1::MemoryEstimate memory;
  int64_t comm_bytes = 0;
};

// Elements the busiest dp rank (the last) owns of a unit of n elements.
int64_t BusiestShard(int64_t n, int dp) {
  const parallel::ShardRange r = parallel::UnitShardRange(static_cast<size_t>(n), dp, dp - 1);
  return static_cast<int64_t>(r.size());
}

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
int64_t GatheredPeak(const StageShape& shape, bool reshard) {
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
  const std::vector<int> uses = parallel::UnitUseOrder(emb, blocks, fin, nullptr);
  int64_t peak = 0;
  for (size_t i = 0; i < uses.size(); ++i) {
    int64_t live = shape.local_numel[uses[i]];
    if (i + 1 < uses.size() && uses[i + 1] != uses[i]) live += shape.local_numel[uses[i + 1]];
    peak = std::max(peak, live);
  }
  return peak;
}

// Memory and bytes sent per step for one rank of stage `s` under ZeRO `zero`.
Estimate EstimateStage(const JobSpec& spec, const model::GptConfig& cfg, const StageShape& shape,
                       int s, int zero, int m) {
  const std::vector<std::string>& names = shape.names;
  const int dp = spec.parallel.dp, tp = spec.parallel.tp, pp = spec.parallel.pp;
  const bool mixed = IsMixed(spec.precision);
  const int64_t pb = ComputeBytes(spec.precision);  // param bytes/element (compute dtype)
  const int64_t gb = pb;                            // grads are in the compute dtype too
  // Activations are stored in the compute dtype (as llm.c's floatX).
  const int64_t ab = ComputeBytes(spec.precision);
  const int64_t BTC = int64_t{spec.batch.micro} * spec.batch.seq_len * cfg.dim;
  const int64_t Ls = shape.num_layers;
  const bool first = s == 0, last = s == pp - 1;
  const bool reshard = spec.parallel.reshard_after_forward;

  Estimate e;
  v1::MemoryEstimate& mem = e.memory;
  int64_t emb = 0, largest_block = 0;
  for (size_t i = 0; i < shape.local_numel.size(); ++i) {
    const int64_t n = shape.local_numel[i];
    const ModelStateBytes b = ZeroMemoryBytes(n, dp, zero, mixed);
    mem.set_params_bytes(mem.params_bytes() + b.params);
    mem.set_grads_bytes(mem.grads_bytes() + b.grads);
    mem.set_optimizer_bytes(mem.optimizer_bytes() + b.optimizer);
    if (names[i] == "embeddings") emb = n;
    if (IsBlock(names[i])) largest_block = std::max(largest_block, n);
  }

  // Activations and backward scratch: the engine's own table for this
  // stage's slice of the model (common/model/activations.h), its saved
  // tensors once per micro-batch alive at once: 1 without a pipeline; with
  // one, GPipe keeps all m forwards before the first backward, 1F1B at most
  // pp - s on stage s.
  model::ModelSlice slice;
  slice.first_layer = shape.first_layer;
  slice.num_layers = shape.num_layers;
  slice.first_stage = first;
  slice.last_stage = last;
  slice.tp = tp;
  const model::ActivationTable acts(cfg, spec.batch.micro, spec.batch.seq_len, slice);
  int64_t in_flight = 1;
  if (pp > 1) {
    in_flight =
        spec.parallel.schedule == PipelineSchedule::kGpipe ? m : std::min<int64_t>(pp - s, m);
  }
  mem.set_activations_bytes((acts.saved_numel() * in_flight + acts.scratch_numel()) * ab);

  // Working set of ZeRO-2/3 (parallel::Zero): whole-unit gradients alive in
  // backward — the tied embeddings' from the LM head to the end, the unit
  // computing and, with dp > 1, the one before it still being
  // reduce-scattered — plus, for ZeRO-3, the gathered parameters
  // (GatheredPeak). Reported as the sum of the two peaks, which bounds their
  // simultaneous peak.
  int64_t working = 0;
  if (zero >= 2) working += gb * (emb + (dp > 1 ? 2 : 1) * largest_block);
  if (zero == 3) working += pb * GatheredPeak(shape, reshard);
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
      for (int64_t n : shape.local_numel) shard += BusiestShard(n, dp);
      bytes += shard * gb;
    }
    if (spec.resources.device == DeviceKind::kCpu) {
      constexpr int64_t kF32 = 4;
      const int64_t bucket = std::min(int64_t{spec.parallel.bucket_mb} * kMiB / kF32, local);
      if (zero == 0) bytes += (bucket / dp + 1) * kF32;
      if (zero == 1) bytes += (largest / dp + 1) * kF32;
      if (zero >= 2) bytes += 3 * (largest / dp) * kF32;
    }
    mem.set_comm_buffer_bytes(bytes);
  }
  const bool offload = spec.parallel.offload == OffloadMode::kOptimizer;
  if (offload) mem.set_host_bytes(mem.optimizer_bytes());
  mem.set_total_bytes(mem.params_bytes() + mem.grads_bytes() +
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
      const int64_t n = shape.local_numel[i];
      local += n;
      switch (zero) {
        case 0:
          break;
        case 1:
          comm += AllReduceBytes(n, dp, gb) + GatherBytes(n, dp, pb);
          break;
        case 2:
          comm += m * ReduceScatterBytes(n, dp, gb) + GatherBytes(n, dp, pb);
          break;
        default: {
          // Gathers per micro-batch: each unit once for its forward and once
          // for its backward (the embeddings: for the encoder, then for the
          // LM head's forward and backward back to back), or once in all
          // without resharding.
          const int gathers = reshard ? 2 : 1;
          comm += m * (ReduceScatterBytes(n, dp, gb) + gathers * GatherBytes(n, dp, pb));
          break;
        }
      }
    }
    if (zero == 0) comm += AllReduceBytes(local, dp, gb);
    if (zero >= 1) comm += (dp - 1) * 8;
  }
  // Tensor parallel: per block two all-reduces (attention, MLP) of B·T·C
  // activations in forward and two in backward, each 2(tp-1)/tp of it.
  if (tp > 1) comm += m * Ls * 4 * 2 * (tp - 1) * CeilDiv(BTC, tp) * ab;
  // Pipeline: per micro-batch, activations to the next stage and their
  // gradient back to the previous one.
  comm += m * ((last ? 0 : BTC) + (first ? 0 : BTC)) * ab;
  e.comm_bytes = comm;
  return e;
}

std::string Bytes(int64_t b) {
  if (b >= int64_t{1} << 30) return absl::StrFormat("%.2f GiB", b / kGiB);
  if (b >= kMiB) return absl::StrFormat("%.1f MiB", b / double(kMiB));
  if (b >= 1024) return absl::StrFormat("%.1f KiB", b / 1024.0);
  return absl::StrCat(b, " B");
}

// 1234567 -> "1,234,567".
std::string Thousands(int64_t v) {
  std::string digits = absl::StrCat(v < 0 ? -v : v), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return v < 0 ? "-" + out : out;
}

const char* ZeroWhat(int zero) {
  switch (zero) {
    case 0:
      return "replicated params, grads and optimizer state (DDP)";
    case 1:
      return "optimizer state sharded over dp";
    case 2:
      return "optimizer state and grads sharded over dp";
    default:
      return "optimizer state, grads and params sharded over dp (FSDP)";
  }
}

}  // namespace

ModelStateBytes ZeroMemoryBytes(int64_t num_params, int dp, int stage, bool mixed) {
  const int64_t shard = BusiestShard(num_params, dp);
  ModelStateBytes b;
  b.params = (mixed ? 2 : 4) * (stage >= 3 ? shard : num_params);
  b.grads = (mixed ? 2 : 4) * (stage >= 2 ? shard : num_params);
  b.optimizer = (mixed ? 12 : 8) * (stage >= 1 ? shard : num_params);
  return b;
}

absl::StatusOr<v1::Plan> MakePlan(const JobSpec& spec, int world) {
  std::vector<std::string> problems = LayoutProblems(spec, world);
  if (!problems.empty()) return absl::InvalidArgumentError(absl::StrJoin(problems, "; "));

  const ParallelSpec& par = spec.parallel;
  const int dp = par.dp, tp = par.tp, pp = par.pp;
  const model::GptConfig cfg = *model::MakeGptConfig(
      spec.model.layers, spec.model.heads, spec.model.dim, spec.model.context, spec.model.vocab);
  const model::ParamLayout layout(cfg);
  const ParallelDims dims = *ParallelDims::Create(dp, tp, pp, world);
  const BatchSplit split = *spec.Split();
  const int m = split.accum;

  v1::Plan plan;
  plan.set_world(world);
  plan.set_dp(dp);
  plan.set_tp(tp);
  plan.set_pp(pp);
  plan.set_zero_stage(par.zero);
  plan.set_micro_batch(spec.batch.micro);
  plan.set_grad_accum_steps(m);
  plan.set_seq_len(spec.batch.seq_len);
  plan.set_global_batch(spec.batch.global);
  plan.set_schedule(std::string(EnumName(par.schedule)));
  plan.set_bubble_fraction(pp == 1 ? 0.0 : double(pp - 1) / double(m + pp - 1));
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
    rp->set_first_sample(split.first_sample(c.dp));
    rp->set_num_samples(split.per_replica());
  }

  // Groups, each kind's numbered in rank order of their first member.
  for (GroupKind kind : {GroupKind::kDp, GroupKind::kTp, GroupKind::kPp}) {
    int index = 0;
    for (const std::vector<int>& ranks : dims.Groups(kind)) {
      v1::Group* g = plan.add_groups();
      g->set_kind(std::string(GroupKindName(kind)));
      g->set_index(index++);
      for (int r : ranks) g->add_ranks(r);
    }
  }

  for (const model::TensorInfo& t : layout.tensors()) {
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
    for (int i = 0; i < dp; ++i) {
      const parallel::ShardRange r = parallel::UnitShardRange(u.numel, dp, i);
      su->add_shard_offsets(static_cast<int64_t>(r.begin));
      su->add_shard_sizes(static_cast<int64_t>(r.size()));
    }
  }

  const int base = cfg.layers / pp, extra = cfg.layers % pp;
  for (int s = 0, layer = 0; s < pp; ++s) {
    v1::PipelineStage* st = plan.add_stages();
    st->set_stage(s);
    st->set_first_layer(layer);
    st->set_num_layers(base + (s < extra ? 1 : 0));
    layer += st->num_layers();
  }

  int64_t comm = 0;
  for (const v1::PipelineStage& st : plan.stages()) {
    const Estimate e =
        EstimateStage(spec, cfg, ShapeOfStage(layout, st, pp, tp), st.stage(), par.zero, m);
    if (st.stage() == 0 || e.memory.total_bytes() > plan.memory_per_rank().total_bytes()) {
      *plan.mutable_memory_per_rank() = e.memory;
    }
    comm = std::max(comm, e.comm_bytes);
  }
  plan.set_comm_bytes_per_step(comm);
  return plan;
}

std::string PlanText(const JobSpec& spec, const v1::Plan& plan) {
  std::string out;
  const int dp = plan.dp(), m = plan.grad_accum_steps();
  absl::StrAppendFormat(&out, "plan for %s: world %d = dp %d · tp %d · pp %d\n", spec.name,
                        plan.world(), dp, plan.tp(), plan.pp());
  absl::StrAppendFormat(&out,
                        "model: L=%d NH=%d C=%d context=%d V=%d (Vp=%d); %s params "
                        "(incl. padded vocab rows)\n",
                        spec.model.layers, spec.model.heads, spec.model.dim, spec.model.context,
                        spec.model.vocab, model::PaddedVocab(spec.model.vocab),
                        Thousands(plan.num_params()));
  absl::StrAppendFormat(&out, "ZeRO-%d: %s; precision %s%s\n", plan.zero_stage(),
                        ZeroWhat(plan.zero_stage()), std::string(EnumName(spec.precision)),
                        spec.parallel.offload == OffloadMode::kOptimizer
                            ? "; optimizer state offloaded to host memory"
                            : "");
  absl::StrAppendFormat(
      &out, "batch: global %d = micro %d × dp %d × accumulation %d; seq_len %d (%s tokens/step)\n",
      plan.global_batch(), plan.micro_batch(), dp, m, plan.seq_len(),
      Thousands(plan.global_batch() * plan.seq_len()));
  if (plan.pp() == 1) {
    out += "pipeline: none (pp 1), bubble 0.0%\n";
  } else {
    absl::StrAppendFormat(&out,
                          "pipeline: %d stages, schedule %s, m = %d micro-batches per step, "
                          "bubble (p-1)/(m+p-1) = %d/%d = %.1f%%\n",
                          plan.pp(), plan.schedule(), m, plan.pp() - 1, m + plan.pp() - 1,
                          100.0 * plan.bubble_fraction());
  }
  for (const v1::PipelineStage& st : plan.stages()) {
    if (plan.pp() == 1) break;
    absl::StrAppendFormat(&out, "  stage %d: layers %d..%d\n", st.stage(), st.first_layer(),
                          st.first_layer() + st.num_layers() - 1);
  }

  out += "\nRANK  DP  TP  PP  SAMPLES\n";
  for (const v1::RankPlan& r : plan.ranks()) {
    absl::StrAppendFormat(&out, "%4d  %2d  %2d  %2d  [%d, %d)\n", r.rank(), r.dp(), r.tp(), r.pp(),
                          r.first_sample(), r.first_sample() + r.num_samples());
  }

  const v1::MemoryEstimate& mem = plan.memory_per_rank();
  absl::StrAppendFormat(&out, "\nmemory per rank (busiest stage), ZeRO-%d:\n", plan.zero_stage());
  const bool offload = spec.parallel.offload == OffloadMode::kOptimizer;
  for (auto [what, b] :
       {std::pair<const char*, int64_t>{"params", mem.params_bytes()},
        {"grads", mem.grads_bytes()},
        {offload ? "optimizer (on host, not in total)" : "optimizer", mem.optimizer_bytes()},
        {"activations", mem.activations_bytes()},
        {"comm buffers", mem.comm_buffer_bytes()},
        {"working set (whole units alive: gathered params, unit grads)", mem.working_bytes()},
        {"total", mem.total_bytes()}}) {
    absl::StrAppendFormat(&out, "  %12s  %s\n", Bytes(b), what);
  }
  if (offload) absl::StrAppendFormat(&out, "  %12s  host memory\n", Bytes(mem.host_bytes()));

  // The ZeRO paper's model-state bytes per parameter (Rajbhandari et al.,
  // Fig. 1): K = 12 optimizer bytes in mixed precision (2 + 2 + 12), our
  // fp32 analogue 4 + 4 + 8.
  const bool mixed = spec.precision != Precision::kFp32;
  const double P = mixed ? 2 : 4, G = P, K = mixed ? 12 : 8, N = dp;
  const double formula[4] = {P + G + K, P + G + K / N, P + (G + K) / N, (P + G + K) / N};
  absl::StrAppendFormat(&out,
                        "\nZeRO stages compared (per rank, N = dp = %d; model state = params + "
                        "grads + optimizer;\nformula: the ZeRO paper's %s B/param: Z0 %s, Z1 "
                        "%s, Z2 %s, Z3 %s):\n",
                        dp, mixed ? "2+2+12" : "(fp32) 4+4+8", mixed ? "16" : "16",
                        mixed ? "4+12/N" : "8+8/N", mixed ? "2+14/N" : "4+12/N", "16/N");
  out += "STAGE  FORMULA B/PARAM  PLAN B/PARAM  MODEL STATE  WORKING SET  TOTAL GiB  COMM/STEP\n";
  for (int zero = 0; zero <= 3; ++zero) {
    JobSpec alt = spec;
    alt.parallel.zero = zero;
    absl::StatusOr<v1::Plan> p = MakePlan(alt, plan.world());
    if (!p.ok()) continue;
    const v1::MemoryEstimate& e = p->memory_per_rank();
    const int64_t state = e.params_bytes() + e.grads_bytes() + e.optimizer_bytes();
    absl::StrAppendFormat(&out, "%s%-4d  %15.3f  %12.3f  %11s  %11s  %9.3f  %9s\n",
                          zero == plan.zero_stage() ? "*" : " ", zero, formula[zero],
                          double(state) / double(p->num_params()), Bytes(state),
                          Bytes(e.working_bytes()), e.total_bytes() / kGiB,
                          Bytes(p->comm_bytes_per_step()));
  }

  absl::StrAppendFormat(&out,
                        "\ncomm per step (bytes sent by the busiest rank): %s (%s B = %.1f MB; "
                        "the progress lines print what was sent)\n",
                        Bytes(plan.comm_bytes_per_step()), Thousands(plan.comm_bytes_per_step()),
                        plan.comm_bytes_per_step() / 1e6);

  absl::StrAppendFormat(&out,
                        "\nshard units (%d; element ranges within the unit per dp rank, the last "
                        "also holding numel mod dp):\n",
                        plan.units_size());
  const int n = plan.units_size();
  for (int i = 0; i < n; ++i) {
    if (n > 8 && i == 2) {
      absl::StrAppendFormat(&out, "  ... %d more units ...\n", n - 4);
      i = n - 3;
      continue;
    }
    const v1::ShardUnit& u = plan.units(i);
    absl::StrAppendFormat(&out, "  %-10s offset %s numel %s\n", u.name(), Thousands(u.offset()),
                          Thousands(u.numel()));
    std::vector<std::string> ranges;
    for (int d = 0; d < u.shard_sizes_size(); ++d) {
      ranges.push_back(absl::StrFormat("dp%d [%d, %d)", d, u.shard_offsets(d),
                                       u.shard_offsets(d) + u.shard_sizes(d)));
    }
    for (size_t k = 0; k < ranges.size(); k += 4) {
      std::vector<std::string> line(ranges.begin() + k,
                                    ranges.begin() + std::min(ranges.size(), k + 4));
      absl::StrAppend(&out, "      ", absl::StrJoin(line, "  "), "\n");
    }
  }
  return out;
}

}  // namespace shardtrain
