// PlanText: the human-readable plan `shardtrain plan` prints (planner.h).
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/device_peaks.h"
#include "common/model/config.h"
#include "common/planner.h"

namespace shardtrain {
namespace {

// How the frozen model is held (finetune.base_dtype), as the plan says it.
std::string FrozenFormatText(const JobSpec& spec) {
  const char* compute = spec.FrozenFormat().compute_bytes == 4 ? "fp32" : "bf16";
  switch (spec.finetune.base_dtype) {
    case BaseDtype::kInt8:
      return absl::StrCat(
          "with its linear layers in int8 (an fp32 absmax per output channel), the "
          "rest in ",
          compute);
    case BaseDtype::kNf4:
      return absl::StrCat("with its linear layers in NF4 (blocks of 64, ",
                          spec.finetune.double_quant ? "absmax double-quantized" : "fp32 absmax",
                          "), the rest in ", compute);
    case BaseDtype::kBf16:
      break;
  }
  return absl::StrCat("in ", compute);
}

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr double kGiB = double(int64_t{1} << 30);

// 1234567 -> "1,234,567".
// "0..5", or an interleaved stage's chunks "0..1,4..5".
std::string StageLayersText(const v1::PipelineStage& st) {
  std::string out;
  for (int c = 0; c < std::max(1, st.chunks()); ++c) {
    const int first = st.first_layer() + c * st.chunk_stride();
    absl::StrAppendFormat(&out, "%s%d..%d", c > 0 ? "," : "", first, first + st.num_layers() - 1);
  }
  return out;
}

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

// "full (every block keeps only its input)", "selective, first 2 blocks of
// each stage", ...
std::string RecomputeWhat(const ModelSpec& m) {
  std::string what(EnumName(m.recompute));
  switch (m.recompute) {
    case Recompute::kNone:
      return what + " (every block keeps its activations for backward)";
    case Recompute::kSelective:
      what += " (the attention's T² probabilities recomputed in backward)";
      break;
    case Recompute::kFull:
      what += " (each block keeps only its input and is recomputed in backward)";
      break;
  }
  if (m.recompute_layers > 0) {
    absl::StrAppendFormat(&what, ", first %d blocks of each stage", m.recompute_layers);
  }
  return what;
}

// Per model.recompute mode: each stage's activations, the busiest rank's
// total and the forward FLOPs recomputation adds (the busiest stage's, and
// their share of its step).
std::string RecomputeComparison(const JobSpec& spec, const v1::Plan& plan) {
  std::vector<ModelSpec> modes;
  for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    ModelSpec m = spec.model;
    m.recompute = r;
    m.recompute_layers = -1;
    modes.push_back(m);
  }
  if (spec.model.recompute_layers > 0) modes.push_back(spec.model);
  const bool per_stage = plan.pp() <= 4;
  std::string out = absl::StrFormat(
      "\nactivation recomputation compared (model.recompute; per rank, micro-batch B=%d T=%d;\n"
      "extra forward FLOPs per step on the busiest stage and their share of its step):\n",
      plan.micro_batch(), plan.seq_len());
  out += "RECOMPUTE     ";
  if (per_stage) {
    for (int s = 0; s < plan.pp(); ++s) absl::StrAppendFormat(&out, "  ACTS STAGE %d", s);
  } else {
    out += "  ACTS BUSIEST";
  }
  out += "  TOTAL MEM  EXTRA FWD FLOP/STEP  EXTRA\n";
  for (const ModelSpec& m : modes) {
    JobSpec alt = spec;
    alt.model = m;
    absl::StatusOr<v1::Plan> p = MakePlan(alt, plan.world());
    if (!p.ok()) continue;
    const MicroBatchFlops f = BusiestRecompute(alt);
    const double extra = f.recompute, share = f.train > 0 ? f.recompute / f.train : 0;
    const bool chosen =
        m.recompute == spec.model.recompute && m.recompute_layers == spec.model.recompute_layers;
    std::string name(EnumName(m.recompute));
    if (m.recompute_layers > 0) absl::StrAppend(&name, " K=", m.recompute_layers);
    absl::StrAppendFormat(&out, "%s%-12s ", chosen ? "*" : " ", name);
    if (per_stage) {
      for (const v1::PipelineStage& st : p->stages()) {
        absl::StrAppendFormat(&out, "  %12s", FormatPlanBytes(st.memory().activations_bytes()));
      }
    } else {
      absl::StrAppendFormat(&out, "  %12s",
                            FormatPlanBytes(p->memory_per_rank().activations_bytes()));
    }
    absl::StrAppendFormat(&out, "  %9s  %19s  %4.1f%%\n",
                          FormatPlanBytes(p->memory_per_rank().total_bytes()),
                          absl::StrFormat("%.3g", extra * p->grad_accum_steps()), 100 * share);
  }
  return out;
}

// The training FLOPs of a step (6 per multiply-add of the matmul
// parameters, LM head included, plus the attention's T² terms: StageFlops of
// the whole model, without recomputation) and, on GPUs, the time they take
// at a dense bf16 peak.
std::string ComputeLine(const JobSpec& spec, const v1::Plan& plan) {
  const absl::StatusOr<model::ModelConfig> cfg = spec.TrainedConfig();
  if (!cfg.ok()) return "";
  const int T = plan.seq_len();
  const double per_token = StageFlops(*cfg, 1, T, model::ModelSlice{}, {}).train / T;
  const double per_step = per_token * double(plan.global_batch()) * T;
  std::string out = absl::StrFormat(
      "compute: %.3g FLOPs/token (%s + attention), %.3g per step", per_token,
      cfg->lora.on() ? "4 × frozen matmul params + 6 × adapter params" : "6 × matmul params",
      per_step);
  // At an H100 SXM's (and H200's) dense peak for the job's precision, from
  // the table the workers' MFU is measured against.
  const std::optional<double> peak = DensePeakFlops("H100", spec.Compute());
  if (spec.resources.device == DeviceKind::kCuda && peak) {
    const double ideal = per_step / (*peak * plan.world());
    absl::StrAppendFormat(&out,
                          "; at %.0f TFLOP/s per GPU (H100/H200 dense %s) a step takes >= %.3g s "
                          "(100%% MFU; %.3g s at 40%%)",
                          *peak / 1e12, std::string(DataTypeName(spec.Compute())), ideal,
                          ideal / 0.4);
  }
  return out + "\n";
}

}  // namespace

std::string FormatPlanBytes(int64_t b) {
  if (b >= int64_t{1} << 30) return absl::StrFormat("%.2f GiB", b / kGiB);
  if (b >= kMiB) return absl::StrFormat("%.1f MiB", b / double(kMiB));
  if (b >= 1024) return absl::StrFormat("%.1f KiB", b / 1024.0);
  return absl::StrCat(b, " B");
}

std::string PlanText(const JobSpec& spec, const v1::Plan& plan) {
  std::string out;
  const int dp = plan.dp(), m = plan.grad_accum_steps(), cp = std::max(1, plan.cp());
  if (cp > 1) {
    absl::StrAppendFormat(&out, "plan for %s: world %d = dp %d · cp %d · tp %d · pp %d\n",
                          spec.name, plan.world(), dp, cp, plan.tp(), plan.pp());
  } else {
    absl::StrAppendFormat(&out, "plan for %s: world %d = dp %d · tp %d · pp %d\n", spec.name,
                          plan.world(), dp, plan.tp(), plan.pp());
  }
  if (spec.model.arch == model::Arch::kGpt2) {
    absl::StrAppendFormat(&out,
                          "model: L=%d NH=%d C=%d context=%d V=%d (Vp=%d); %s params "
                          "(incl. padded vocab rows)\n",
                          spec.model.layers, spec.model.heads, spec.model.dim, spec.model.context,
                          spec.model.vocab, model::PaddedVocab(spec.model.vocab),
                          Thousands(ModelNumParams(spec)));
  } else {
    // Qwen3's fields only where set: head size hs when not C / NH, q/k norms.
    const std::string hs =
        spec.model.head_dim > 0 ? absl::StrFormat(" hs=%d", spec.model.head_dim) : "";
    absl::StrAppendFormat(
        &out,
        "model: %s L=%d NH=%d%s KVH=%d C=%d F=%d context=%d V=%d (Vp=%d), %s head%s; %s params "
        "(%.2fB, incl. padded vocab rows)\n",
        model::ArchName(spec.model.arch), spec.model.layers, spec.model.heads, hs,
        spec.model.kv_heads, spec.model.dim, spec.model.ffn_dim, spec.model.context,
        spec.model.vocab, model::PaddedVocab(spec.model.vocab),
        spec.model.tie_embeddings ? "tied" : "untied", spec.model.qk_norm ? ", q/k norms" : "",
        Thousands(ModelNumParams(spec)), ModelNumParams(spec) / 1e9);
  }
  if (spec.finetune.lora.on()) {
    const LoraSpec& l = spec.finetune.lora;
    absl::StrAppendFormat(
        &out,
        "finetune: LoRA adapters of rank %d (alpha %g, scale %g) on %s: %s trained params (%.2f%% "
        "of the model's), the model frozen %s (%s per rank); the plan's params, grads and "
        "optimizer state are the adapters'\n",
        l.rank, l.alpha, l.alpha / l.rank, absl::StrJoin(l.targets, ", "),
        Thousands(plan.num_params()), 100.0 * plan.num_params() / ModelNumParams(spec),
        FrozenFormatText(spec), FormatPlanBytes(plan.memory_per_rank().frozen_bytes()));
  }
  if (spec.model.moe.on()) {
    const model::MoeConfig& m = spec.model.moe;
    const absl::StatusOr<model::ModelConfig> c = spec.model.Config();
    const double total = c.ok() ? double(model::ModelParams(*c)) : 0;
    const double active = c.ok() ? double(model::ActiveModelParams(*c)) : 0;
    absl::StrAppendFormat(
        &out,
        "mixture of experts: %d experts of F=%d, top %d (%s%s)%s%s; %s params in all (%.2fB), %s "
        "active per token (%.2fB, %.1f%%)\n",
        m.experts, m.expert_ffn_dim, m.top_k,
        m.scoring == model::RouterScoring::kSigmoid ? "sigmoid" : "softmax",
        m.norm_topk_prob ? ", gates renormalised" : "",
        m.shared_experts > 0 ? absl::StrFormat(", %d shared", m.shared_experts) : "",
        m.first_dense_layers > 0 ? absl::StrFormat(", first %d layers dense", m.first_dense_layers)
                                 : "",
        Thousands(int64_t(total)), total / 1e9, Thousands(int64_t(active)), active / 1e9,
        total > 0 ? 100 * active / total : 0.0);
    if (plan.ep() > 1) {
      std::vector<std::string> groups;
      for (const v1::Group& g : plan.groups()) {
        if (g.kind() != "ep") continue;
        if (groups.size() == 4) {
          groups.push_back("...");
          break;
        }
        groups.push_back(absl::StrCat("[", absl::StrJoin(g.ranks(), " "), "]"));
      }
      absl::StrAppendFormat(
          &out,
          "expert parallelism: ep %d within dp × cp, %d of the %d experts per rank, ep groups %s; "
          "all-to-all %s per step (each MoE layer's pairs to their experts and back, forward "
          "and backward; routing in balance)\n",
          plan.ep(), m.experts / plan.ep(), m.experts, absl::StrJoin(groups, " "),
          FormatPlanBytes(plan.ep_comm_bytes_per_step()));
    }
  }
  out += ComputeLine(spec, plan);
  absl::StrAppendFormat(&out, "ZeRO-%d: %s; precision %s%s%s%s\n", plan.zero_stage(),
                        ZeroWhat(plan.zero_stage()), std::string(EnumName(spec.precision)),
                        spec.optimizer.state == OptimizerState::kInt8
                            ? "; optimizer.state int8 (AdamW's m and v in 1 byte each per "
                              "parameter and an fp32 absmax per 2048 of each)"
                            : "",
                        spec.parallel.offload == OffloadMode::kOptimizer
                            ? "; optimizer state offloaded to host memory"
                            : "",
                        !StateThroughHost(spec) ? ""
                        : spec.parallel.comm == CommBackend::kNccl
                            ? "; GPU ranks: the optimizer through the host (NCCL reduces on "
                              "the GPUs, AdamW steps a host copy)"
                            : "; GPU ranks: through the host (Gloo), the shards and the "
                              "optimizer state in host memory");
  absl::StrAppendFormat(&out, "activations: recompute %s%s%s\n", RecomputeWhat(spec.model),
                        spec.model.attention == AttentionKind::kFlash
                            ? "; flash attention (each row's logsumexp kept, not its T² "
                              "probabilities)"
                            : "",
                        spec.parallel.sequence_parallel
                            ? absl::StrFormat("; sequence parallel: the residual stream and "
                                              "LayerNorms hold 1/%d of the rows per tp rank",
                                              plan.tp())
                            : "");
  absl::StrAppendFormat(
      &out, "batch: global %d = micro %d × dp %d × accumulation %d; seq_len %d (%s tokens/step)\n",
      plan.global_batch(), plan.micro_batch(), dp, m, plan.seq_len(),
      Thousands(plan.global_batch() * plan.seq_len()));
  if (cp > 1) {
    const int chunk = plan.seq_len() / (2 * cp);
    absl::StrAppendFormat(
        &out,
        "context parallel: cp %d — each sequence in %d chunks of %d tokens, cp rank r holds "
        "chunks r and %d−r (%d tokens); attention a ring of %d key/value blocks per layer, "
        "gradients summed over dp × cp = %d ranks (ZeRO shards over them)\n",
        cp, 2 * cp, chunk, 2 * cp - 1, plan.seq_len() / cp, cp, dp * cp);
    out += "cp groups (one ring each):";
    for (const v1::Group& g : plan.groups()) {
      if (g.kind() != "cp") continue;
      out += absl::StrCat(" [", absl::StrJoin(g.ranks(), " "), "]");
    }
    out += "\n";
  }
  if (plan.pp() == 1) {
    out += "pipeline: none (pp 1), bubble 0.0%\n";
  } else {
    const int v = std::max(1, plan.pp_virtual());
    if (v == 1) {
      absl::StrAppendFormat(&out,
                            "pipeline: %d stages, schedule %s, m = %d micro-batches per step, "
                            "bubble (p-1)/(m+p-1) = %d/%d = %.1f%%\n",
                            plan.pp(), plan.schedule(), m, plan.pp() - 1, m + plan.pp() - 1,
                            100.0 * plan.bubble_fraction());
    } else {
      absl::StrAppendFormat(
          &out,
          "pipeline: %d stages × %d model chunks (interleaved 1F1B: chunk c of stage s is "
          "virtual stage c·%d + s), m = %d micro-batches per step, bubble (p-1)/(v·m+p-1) = "
          "%d/%d = %.1f%% (1F1B: %.1f%%)\n",
          plan.pp(), v, plan.pp(), m, plan.pp() - 1, v * m + plan.pp() - 1,
          100.0 * plan.bubble_fraction(),
          100.0 * double(plan.pp() - 1) / double(m + plan.pp() - 1));
    }
  }
  // Per stage, per rank (a stage's tp and dp ranks are alike): its slice's
  // parameters, the micro-batches whose activations it keeps at the peak,
  // its memory and the bytes it sends per step by kind.
  absl::StrAppendFormat(&out,
                        "\nper stage, per rank (params of the rank's slice: its layers' tp "
                        "shards, embeddings on the first and last stage):\n");
  out +=
      "STAGE  LAYERS  PARAMS/RANK  IN-FLIGHT  MODEL STATE  ACTIVATIONS  TOTAL MEM  TP BYTES  PP "
      "BYTES  DP BYTES\n";
  for (const v1::PipelineStage& st : plan.stages()) {
    const v1::MemoryEstimate& e = st.memory();
    absl::StrAppendFormat(&out, "%5d  %6s  %11s  %9d  %11s  %11s  %9s  %8s  %8s  %8s\n", st.stage(),
                          StageLayersText(st), Thousands(st.num_params()), st.in_flight(),
                          FormatPlanBytes(e.params_bytes() + e.grads_bytes() + e.optimizer_bytes()),
                          FormatPlanBytes(e.activations_bytes()), FormatPlanBytes(e.total_bytes()),
                          FormatPlanBytes(st.tp_comm_bytes()), FormatPlanBytes(st.pp_comm_bytes()),
                          FormatPlanBytes(st.dp_comm_bytes()));
  }
  if (plan.pp() > 1 && plan.pp_virtual() > 1) {
    out +=
        "in flight: interleaved 1F1B keeps, of each chunk, the most of its micro-batches the "
        "schedule holds at once (a chunk's set is 1/v of the stage's); IN-FLIGHT sums them\n";
  } else if (plan.pp() > 1) {
    absl::StrAppendFormat(&out, "in flight: %s keeps %s micro-batches' activations\n",
                          plan.schedule(),
                          plan.schedule() == "gpipe" ? "all m" : "min(m, pp - stage)");
  }

  if (cp > 1) {
    out += "\nRANK  DP  CP  TP  PP  SAMPLES\n";
    for (const v1::RankPlan& r : plan.ranks()) {
      absl::StrAppendFormat(&out, "%4d  %2d  %2d  %2d  %2d  [%d, %d)\n", r.rank(), r.dp(), r.cp(),
                            r.tp(), r.pp(), r.first_sample(), r.first_sample() + r.num_samples());
    }
  } else {
    out += "\nRANK  DP  TP  PP  SAMPLES\n";
    for (const v1::RankPlan& r : plan.ranks()) {
      absl::StrAppendFormat(&out, "%4d  %2d  %2d  %2d  [%d, %d)\n", r.rank(), r.dp(), r.tp(),
                            r.pp(), r.first_sample(), r.first_sample() + r.num_samples());
    }
  }

  const v1::MemoryEstimate& mem = plan.memory_per_rank();
  absl::StrAppendFormat(&out, "\nmemory per rank (busiest stage), ZeRO-%d:\n", plan.zero_stage());
  const bool offload = spec.parallel.offload == OffloadMode::kOptimizer || StateThroughHost(spec);
  for (auto [what, b] :
       {std::pair<const char*, int64_t>{"frozen model (LoRA)", mem.frozen_bytes()},
        {"params", mem.params_bytes()},
        {"grads", mem.grads_bytes()},
        {offload ? "optimizer (on host, not in total)" : "optimizer", mem.optimizer_bytes()},
        {"activations", mem.activations_bytes()},
        {"comm buffers", mem.comm_buffer_bytes()},
        {"working set (whole units alive: gathered params, unit grads)", mem.working_bytes()},
        {"total", mem.total_bytes()}}) {
    if (b == 0 && what == std::string_view("frozen model (LoRA)")) continue;
    absl::StrAppendFormat(&out, "  %12s  %s\n", FormatPlanBytes(b), what);
  }
  if (offload)
    absl::StrAppendFormat(&out, "  %12s  host memory\n", FormatPlanBytes(mem.host_bytes()));

  // The ZeRO paper's model-state bytes per parameter (Rajbhandari et al.,
  // Fig. 1) with the engines' bytes per element (EngineStateBytes): mixed
  // precision 2 + 4 + 12 (the paper's 2 + 2 + 12 with fp32 gradients), fp32
  // 4 + 4 + 8.
  const bool mixed = spec.precision != Precision::kFp32;
  const StateBytesPerElement per = EngineStateBytes(spec.precision);
  const bool int8 = spec.optimizer.state == OptimizerState::kInt8;
  const double P = double(per.params), G = double(per.grads),
               K = double(per.optimizer) - (int8 ? 6.0 - 8.0 / kInt8StateBlock : 0.0), N = dp * cp;
  const double formula[4] = {P + G + K, P + G + K / N, P + (G + K) / N, (P + G + K) / N};
  const auto b = [](double x) { return absl::StrFormat("%g", x); };
  absl::StrAppendFormat(&out,
                        "\nZeRO stages compared (per rank, N = %s = %d; model state = params + "
                        "grads + optimizer;\nformula: the ZeRO paper's with %s B/param%s: Z0 "
                        "%s, Z1 %s+%s/N, Z2 %s+%s/N, Z3 %s/N):\n",
                        cp > 1 ? "dp × cp" : "dp", dp * cp,
                        absl::StrCat(b(P), "+", b(G), "+", b(K)), mixed ? " (fp32 gradients)" : "",
                        b(P + G + K), b(P + G), b(K), b(P), b(G + K), b(P + G + K));
  out += "STAGE  FORMULA B/PARAM  PLAN B/PARAM  MODEL STATE  WORKING SET  TOTAL GiB  COMM/STEP\n";
  for (int zero = 0; zero <= 3; ++zero) {
    JobSpec alt = spec;
    alt.parallel.zero = zero;
    absl::StatusOr<v1::Plan> p = MakePlan(alt, plan.world());
    if (!p.ok()) {
      absl::StrAppendFormat(&out, " %-4d  %15.3f  refused: %s\n", zero, formula[zero],
                            zero == 3 && plan.pp() > 1 ? "ZeRO-3 needs pp = 1" : "invalid");
      continue;
    }
    const v1::MemoryEstimate& e = p->memory_per_rank();
    const int64_t state = e.params_bytes() + e.grads_bytes() + e.optimizer_bytes();
    absl::StrAppendFormat(&out, "%s%-4d  %15.3f  %12.3f  %11s  %11s  %9.3f  %9s\n",
                          zero == plan.zero_stage() ? "*" : " ", zero, formula[zero],
                          double(state) / double(p->num_params()), FormatPlanBytes(state),
                          FormatPlanBytes(e.working_bytes()), e.total_bytes() / kGiB,
                          FormatPlanBytes(p->comm_bytes_per_step()));
  }

  out += RecomputeComparison(spec, plan);
  out += FinetuneComparison(spec, plan);

  absl::StrAppendFormat(&out,
                        "\ncomm per step (bytes sent by the busiest rank): %s (%s B = %.1f MB; "
                        "the progress lines print what was sent)\n  = tp %s + pp %s + dp %s\n",
                        FormatPlanBytes(plan.comm_bytes_per_step()),
                        Thousands(plan.comm_bytes_per_step()), plan.comm_bytes_per_step() / 1e6,
                        FormatPlanBytes(plan.tp_comm_bytes_per_step()),
                        FormatPlanBytes(plan.pp_comm_bytes_per_step()),
                        FormatPlanBytes(plan.dp_comm_bytes_per_step()));
  if (cp > 1) {
    out.pop_back();  // the cp ring's share on the same line
    absl::StrAppendFormat(&out, " + cp %s\n", FormatPlanBytes(plan.cp_comm_bytes_per_step()));
    out +=
        "  cp (the ring; a block = B·T/cp rows of this rank's keys and values): per layer and "
        "micro-batch cp − 1 blocks in forward, cp − 1 blocks and cp of their gradients in "
        "backward (3·cp − 2), cp − 1 more per fully recomputed layer\n";
    // Ulysses (DeepSpeed's all-to-all from sequence- to head-sharded and
    // back), for comparison: per layer and micro-batch, forward q, k, v in
    // and the output back, backward their gradients, each all-to-all
    // sending (cp − 1)/cp of the rank's B·T/cp rows of its columns.
    int64_t layers = 0;
    for (const v1::PipelineStage& st : plan.stages())
      layers = std::max<int64_t>(layers, st.num_layers());
    const int64_t rows = int64_t{plan.micro_batch()} * (plan.seq_len() / cp);
    const int64_t kv = 2 * int64_t{spec.model.kv_heads} * spec.model.HeadDim();
    const int64_t ab = spec.precision == Precision::kFp32 ? 4 : 2;
    const int64_t ulysses = int64_t{m} * layers * 2 * (cp - 1) * rows *
                            (2 * int64_t{spec.model.heads} * spec.model.HeadDim() + kv) /
                            plan.tp() / cp * ab;
    const bool heads_fit =
        spec.model.heads % (cp * plan.tp()) == 0 && spec.model.kv_heads % (cp * plan.tp()) == 0;
    absl::StrAppendFormat(
        &out,
        "  Ulysses (all-to-all to heads and back; not built) would send %s per step: the ring "
        "sends %.2f× that%s\n",
        FormatPlanBytes(ulysses),
        ulysses > 0 ? double(plan.cp_comm_bytes_per_step()) / double(ulysses) : 0.0,
        heads_fit ? ""
                  : " (and Ulysses needs cp · tp to divide heads and kv_heads: it does not here)");
  }
  if (plan.tp() > 1 && spec.parallel.sequence_parallel) {
    out +=
        "  tp (sequence parallel; h = one all-gather or reduce-scatter of B·T·C, half an "
        "all-reduce): per micro-batch 10h per layer (forward 2 all-gathers + 2 reduce-scatters, "
        "backward their conjugates + 2 all-gathers of the LayerNorm outputs again), 2h for the "
        "embedding (first stage) and 2h for the final norm plus 3 all-reduces of B·T fp32 for "
        "the vocab-parallel cross-entropy (last stage); once per step an all-reduce of the "
        "LayerNorm gradients\n";
  } else if (plan.tp() > 1) {
    out +=
        "  tp: per micro-batch, ring all-reduces (2(tp-1)/tp of each): 4 of B·T·C per layer (2 "
        "forward, 2 backward), 1 of B·T·C for the vocab-parallel embedding (first stage) and 1 "
        "for the LM head's input gradient plus 3 of B·T fp32 for the vocab-parallel "
        "cross-entropy (last stage)\n";
  }
  if (plan.pp() > 1) {
    out += absl::StrCat(
        "  pp: per micro-batch B·T·C activations to the next stage and their gradient to the "
        "previous one",
        plan.pp_virtual() > 1
            ? " (interleaved: for every chunk but at the pipeline's two ends, stage pp-1's "
              "chunk c sending to stage 0's chunk c+1)"
            : "",
        spec.model.arch == model::Arch::kGpt2 || spec.model.tie_embeddings
            ? "; once per step the first and last stages sum the tied wte gradient\n"
            : " (the untied LM head lives on the last stage only)\n");
  }

  // What the checkpoints take on checkpoint.dir's volume: the ranks check
  // their shard against its free space before writing, `submit` and `local`
  // warn when it holds less than two checkpoints.
  absl::StrAppendFormat(
      &out,
      "\ncheckpoint: %s per checkpoint (%s B: fp32 params, AdamW m and v, 12 B/param), %s per "
      "rank (the largest shard); final weights %s\n  %s\n",
      FormatPlanBytes(plan.checkpoint_bytes()), Thousands(plan.checkpoint_bytes()),
      FormatPlanBytes(plan.checkpoint_bytes_per_rank()), FormatPlanBytes(FinalWeightsBytes(spec)),
      spec.checkpoint.every > 0
          ? absl::StrFormat("every %d steps, %d kept: checkpoint.dir needs %s or more",
                            spec.checkpoint.every, spec.checkpoint.keep,
                            FormatPlanBytes((spec.checkpoint.keep + 1) * plan.checkpoint_bytes() +
                                            FinalWeightsBytes(spec)))
          : "checkpoint.every 0: only the final weights are saved");
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
