#include "common/auto_layout.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/model/config.h"
#include "common/model/lora.h"
#include "common/model/slice.h"
#include "common/parallel_dims.h"
#include "common/planner.h"

namespace shardtrain {
namespace {

// The recomputation settings to try, cheapest first, from the spec's own:
// none, selective, full on the first K blocks of each stage (K = 1 .. the
// largest stage's blocks - 1), full on every block (-1; or K = the largest
// stage's blocks when the spec names a K).
std::vector<std::pair<Recompute, int>> RecomputeLadder(const ModelSpec& m, int largest_stage) {
  std::vector<std::pair<Recompute, int>> all = {{Recompute::kNone, -1},
                                                {Recompute::kSelective, -1}};
  for (int k = 1; k < largest_stage; ++k) all.push_back({Recompute::kFull, k});
  all.push_back({Recompute::kFull, m.recompute_layers > 0 ? largest_stage : -1});
  auto cost = [&](const std::pair<Recompute, int>& r) {
    if (r.first != Recompute::kFull) return static_cast<int>(r.first);
    return 2 + (r.second < 0 ? largest_stage : r.second);
  };
  const int from = cost({m.recompute, m.recompute_layers});
  std::vector<std::pair<Recompute, int>> out = {{m.recompute, m.recompute_layers}};
  for (const auto& r : all) {
    if (cost(r) > from) out.push_back(r);
  }
  return out;
}

// The context-parallel degrees to try: the spec's own when it sets one;
// otherwise 1, and for a long sequence (seq_len >= kLongSeqLen) on CPU ranks
// (where the ring runs) every cp >= 2 dividing `ranks` with 2·cp dividing
// seq_len and at least kMinCpChunk tokens per rank.
constexpr int kLongSeqLen = 2048;
constexpr int kMinCpChunk = 128;
std::vector<int> CpDegrees(const JobSpec& spec, int ranks) {
  if (spec.parallel.cp > 1) return {spec.parallel.cp};
  std::vector<int> out = {1};
  const int T = spec.batch.seq_len;
  if (spec.resources.device != DeviceKind::kCpu || T < kLongSeqLen) return out;
  for (int cp = 2; cp <= ranks && T / cp >= kMinCpChunk; ++cp) {
    if (ranks % cp == 0 && T % (2 * cp) == 0) out.push_back(cp);
  }
  return out;
}

// The largest micro <= wanted with global % (micro·dp) == 0, or 0 when none.
// The cost model's FLOPs per token as the text says it: 6 · params, or
// under LoRA 4 · the frozen ones + 6 · the adapters' (model::
// MatmulTrainingFlops).
std::string FlopsFormula(const JobSpec& spec, int64_t num_params) {
  const absl::StatusOr<model::ModelConfig> c = spec.TrainedConfig();
  if (c.ok() && c->lora.on()) {
    return absl::StrFormat("(4 · frozen params (%d) + 6 · adapter params (%d))", num_params,
                           model::LoraParams(*c));
  }
  return absl::StrFormat("6 · params (%d; MoE: those a token uses)", num_params);
}

int MicroFor(int global, int wanted, int dp) {
  for (int micro = wanted; micro >= 1; --micro) {
    if (global % (int64_t{micro} * dp) == 0) return micro;
  }
  return 0;
}

// The candidate of `alt` (`spec` with a layout's parallel fields and
// micro set): planned with the spec's own recomputation, then with more,
// cheapest first, until it fits the budget; its costs by the cost model.
// The planner's error when it cannot plan it.
absl::StatusOr<LayoutCandidate> PlanLayout(const JobSpec& spec, JobSpec alt,
                                           const model::ModelConfig& config, int ranks,
                                           const AutoLayoutOptions& options, int64_t* num_params) {
  const ModelSpec& model = spec.model;
  const std::vector<int> stage_layers = *model::StageLayers(config, alt.parallel.pp);
  const int largest = *std::max_element(stage_layers.begin(), stage_layers.end());
  absl::StatusOr<v1::Plan> plan;
  int64_t own = 0;  // peak memory with the spec's own recomputation
  for (const auto& [mode, k] : RecomputeLadder(model, largest)) {
    alt.model.recompute = mode;
    alt.model.recompute_layers = k;
    plan = MakePlan(alt, ranks);
    if (!plan.ok()) return plan.status();
    if (own == 0) own = plan->memory_per_rank().total_bytes();
    if (plan->memory_per_rank().total_bytes() <= options.memory_per_rank) break;
  }
  // The parameters a token runs through: all of a dense model's, an MoE
  // model's active ones (the FLOPs follow them).
  *num_params = model::ActiveModelParams(config);
  LayoutCandidate c;
  c.dp = alt.parallel.dp;
  c.cp = alt.parallel.cp;
  c.ep = alt.parallel.ep;
  c.tp = alt.parallel.tp;
  c.pp = alt.parallel.pp;
  c.zero = alt.parallel.zero;
  c.micro = alt.batch.micro;
  c.micro_adjusted = c.micro != spec.batch.micro;
  c.accum = plan->grad_accum_steps();
  c.bubble = plan->bubble_fraction();
  c.peak_memory = plan->memory_per_rank().total_bytes();
  c.recompute = alt.model.recompute;
  c.recompute_layers = alt.model.recompute_layers;
  if (c.recompute != model.recompute || c.recompute_layers != model.recompute_layers) {
    c.memory_without = own;
  }
  const MicroBatchFlops f = BusiestRecompute(alt);
  c.recompute_share = f.train > 0 ? f.recompute / f.train : 0;
  const CostModel& cost = options.cost;
  const double tokens = double(spec.batch.global) * spec.batch.seq_len;
  // LoRA: 4 per frozen weight and 6 per adapter parameter.
  const double per_token =
      model::MatmulTrainingFlops(config, double(*num_params), double(model::LoraParams(config)));
  c.compute_s = per_token * tokens / (ranks * cost.flops_per_rank) / (1.0 - c.bubble) *
                (1.0 + c.recompute_share);
  c.tp_s = double(plan->tp_comm_bytes_per_step()) / cost.tp_bandwidth;
  c.pp_s = double(plan->pp_comm_bytes_per_step()) / cost.link_bandwidth;
  c.dp_s = double(plan->dp_comm_bytes_per_step()) / cost.link_bandwidth;
  c.cp_s = double(plan->cp_comm_bytes_per_step()) / cost.link_bandwidth;
  const bool ep_in_node = c.tp * c.ep <= cost.ranks_per_node;
  c.ep_s = double(plan->ep_comm_bytes_per_step()) /
           (ep_in_node ? cost.tp_bandwidth : cost.link_bandwidth);
  c.model_flops_per_rank = per_token * tokens / ranks / c.step_s();
  return c;
}

}  // namespace

std::vector<std::string> LayoutCandidate::Overrides(const JobSpec& spec) const {
  std::vector<std::string> out = {
      absl::StrCat("parallel.dp=", dp), absl::StrCat("parallel.tp=", tp),
      absl::StrCat("parallel.pp=", pp), absl::StrCat("parallel.zero=", zero),
      "parallel.schedule=1f1b",
  };
  if (cp != spec.parallel.cp) out.push_back(absl::StrCat("parallel.cp=", cp));
  if (ep != spec.parallel.ep) out.push_back(absl::StrCat("parallel.ep=", ep));
  if (!spec.parallel.stages.empty()) out.push_back("parallel.stages=[]");
  if (spec.parallel.pp_virtual != 1) out.push_back("parallel.pp_virtual=1");
  if (micro_adjusted) out.push_back(absl::StrCat("batch.micro=", micro));
  if (memory_without > 0) {
    out.push_back(absl::StrCat("model.recompute=", std::string(EnumName(recompute))));
    if (recompute_layers > 0)
      out.push_back(absl::StrCat("model.recompute_layers=", recompute_layers));
  }
  return out;
}

absl::StatusOr<AutoLayoutResult> AutoLayout(const JobSpec& spec, const AutoLayoutOptions& options) {
  const int n = options.ranks;
  if (n < 1) return absl::InvalidArgumentError(absl::StrCat("--ranks: must be >= 1, got ", n));
  if (options.memory_per_rank < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--memory-per-rank: must be >= 1 byte, got ", options.memory_per_rank));
  }
  const ModelSpec& model = spec.model;
  const absl::StatusOr<model::ModelConfig> config =
      spec.TrainedConfig();  // with the adapters, if any
  if (!config.ok()) return config.status();
  AutoLayoutResult result;
  std::vector<std::string> skipped;  // why meshes the model allows have no candidate
  // A spec's parallel.cp stays as it has it: the other factors share n / cp.
  if (spec.parallel.cp > 1 && n % spec.parallel.cp != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ranks: ", n, " is not a multiple of the spec's parallel.cp ",
                     spec.parallel.cp, " (auto layout keeps cp as given)"));
  }
  for (const int cp : CpDegrees(spec, n)) {
    const int rest = n / cp;
    for (int tp = 1; tp <= rest; ++tp) {
      if (rest % tp != 0) continue;
      for (int pp = 1; pp <= rest / tp; ++pp) {
        if ((rest / tp) % pp != 0) continue;
        const int dp = rest / (tp * pp);
        const int micro = MicroFor(spec.batch.global, spec.batch.micro, dp);
        // MoE models: every ep dividing dp · cp and the experts.
        for (int ep = 1; ep <= dp * cp; ++ep) {
          if ((dp * cp) % ep != 0 || (ep > 1 && !config->moe.on())) continue;
          const ParallelDims dims =
              *ParallelDims::Create(ParallelDims::Factors{dp, cp, tp, pp, ep});
          if (!dims.CheckModelFits(*config).ok()) continue;
          if (micro == 0) {
            if (ep == 1) {
              skipped.push_back(
                  absl::StrCat("dp ", dp, " does not divide batch.global ", spec.batch.global));
            }
            continue;
          }
          for (int zero = 0; zero <= 3; ++zero) {
            if (!dims.CheckZero(zero).ok()) continue;
            // Aux-loss-free bias updates change whole parameters (ZeRO <= 2).
            if (zero == 3 && spec.router.bias_update_rate > 0) continue;
            JobSpec alt = spec;
            alt.parallel.dp = dp;
            alt.parallel.cp = cp;
            alt.parallel.tp = tp;
            alt.parallel.pp = pp;
            alt.parallel.ep = ep;
            alt.parallel.zero = zero;
            alt.parallel.schedule = PipelineSchedule::k1F1B;
            alt.parallel.pp_virtual = 1;  // plain 1F1B candidates (no model chunks)
            alt.parallel.stages.clear();
            alt.batch.micro = micro;
            int64_t num_params = 0;
            const absl::StatusOr<LayoutCandidate> c =
                PlanLayout(spec, alt, *config, n, options, &num_params);
            if (!c.ok()) {
              skipped.push_back(std::string(c.status().message()));
              continue;
            }
            result.num_params = num_params;
            (c->peak_memory <= options.memory_per_rank ? result.fitting : result.too_big)
                .push_back(*c);
          }
        }
      }
    }
  }
  if (result.fitting.empty() && result.too_big.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no dp × tp × pp layout of ", n, " ranks",
        spec.parallel.cp > 1 ? absl::StrCat(" (parallel.cp ", spec.parallel.cp, " kept)") : "",
        " fits the model and batch",
        skipped.empty() ? " (tp must divide model.heads, 4·dim and the padded vocabulary; pp <= "
                          "model.layers)"
                        : absl::StrCat(": ", absl::StrJoin(skipped, "; "))));
  }
  auto key = [](const LayoutCandidate& c) {
    return std::make_tuple(c.step_s(), c.peak_memory, c.cp, c.pp, c.tp, c.zero, c.ep);
  };
  std::sort(result.fitting.begin(), result.fitting.end(),
            [&](const LayoutCandidate& a, const LayoutCandidate& b) { return key(a) < key(b); });
  std::sort(result.too_big.begin(), result.too_big.end(),
            [&](const LayoutCandidate& a, const LayoutCandidate& b) {
              return std::make_tuple(a.peak_memory, a.step_s()) <
                     std::make_tuple(b.peak_memory, b.step_s());
            });
  return result;
}

namespace {

std::string Ms(double s) { return absl::StrFormat("%.1f", s * 1e3); }

// "none", "selective", "full", "full K=2"; "+" marks recomputation turned on
// to fit.
std::string RecomputeName(const LayoutCandidate& c) {
  std::string name(EnumName(c.recompute));
  if (c.recompute_layers > 0) absl::StrAppend(&name, " K=", c.recompute_layers);
  return c.memory_without > 0 ? name + "+" : name;
}

// The ranked rows; CP and CP ms columns where some candidate has cp > 1, EP
// and EP ms where some has ep > 1.
std::string Rows(const std::vector<LayoutCandidate>& cs, int top) {
  const int rows = std::min<int>(top, cs.size());
  bool cp = false, ep = false;
  for (int i = 0; i < rows; ++i) {
    cp = cp || cs[i].cp > 1;
    ep = ep || cs[i].ep > 1;
  }
  std::string out = absl::StrCat("  #  DP", cp ? "  CP" : "", ep ? "  EP" : "",
                                 "  TP  PP  ZERO  MICRO    M  BUBBLE  RECOMPUTE     PEAK MEM  "
                                 "COMPUTE ms  TP ms  PP ms  DP ms",
                                 cp ? "  CP ms" : "", ep ? "  EP ms" : "", "  STEP ms\n");
  for (int i = 0; i < rows; ++i) {
    const LayoutCandidate& c = cs[i];
    absl::StrAppendFormat(&out, "%3d  %2d", i + 1, c.dp);
    if (cp) absl::StrAppendFormat(&out, "  %2d", c.cp);
    if (ep) absl::StrAppendFormat(&out, "  %2d", c.ep);
    absl::StrAppendFormat(&out,
                          "  %2d  %2d  %4d  %5s  %3d  %5.1f%%  %-10s  %10s  %10s  %5s  %5s  %5s",
                          c.tp, c.pp, c.zero, absl::StrCat(c.micro, c.micro_adjusted ? "*" : ""),
                          c.accum, 100 * c.bubble, RecomputeName(c), FormatPlanBytes(c.peak_memory),
                          Ms(c.compute_s), Ms(c.tp_s), Ms(c.pp_s), Ms(c.dp_s));
    if (cp) absl::StrAppendFormat(&out, "  %5s", Ms(c.cp_s));
    if (ep) absl::StrAppendFormat(&out, "  %5s", Ms(c.ep_s));
    absl::StrAppendFormat(&out, "  %7s\n", Ms(c.step_s()));
  }
  return out;
}

}  // namespace

std::string AutoLayoutText(const JobSpec& spec, const AutoLayoutOptions& options,
                           const AutoLayoutResult& result, int top) {
  const CostModel& cost = options.cost;
  std::string out;
  absl::StrAppendFormat(
      &out,
      "auto layout for %s on %d ranks of %s each: global batch %d × seq_len %d "
      "kept, schedule 1f1b (no model chunks), layers balanced by parameter count\n",
      spec.name, options.ranks, FormatPlanBytes(options.memory_per_rank), spec.batch.global,
      spec.batch.seq_len);
  absl::StrAppendFormat(
      &out,
      "cost model (no overlap): step = compute + tp + pp + dp\n"
      "  compute = %s · tokens/step (%d) / (ranks · %.0f "
      "TFLOP/s) / (1 − bubble)\n"
      "            · (1 + recomputed forward FLOPs / training FLOPs of the busiest stage)\n"
      "  tp = tp bytes sent per step / %.0f GB/s; pp = pp bytes / %.0f GB/s; dp = dp bytes / "
      "%.0f GB/s\n"
      "  (bytes: the busiest rank's, as `shardtrain plan` prints them)\n",
      FlopsFormula(spec, result.num_params), int64_t{spec.batch.global} * spec.batch.seq_len,
      cost.flops_per_rank / 1e12, cost.tp_bandwidth / 1e9, cost.link_bandwidth / 1e9,
      cost.link_bandwidth / 1e9);
  if (absl::StatusOr<model::ModelConfig> config = spec.model.Config();
      config.ok() && config->moe.on()) {
    absl::StrAppendFormat(&out,
                          "  + ep = the MoE layers' all-to-all bytes / %.0f GB/s when tp · ep <= "
                          "%d ranks of a node, else / %.0f GB/s\n",
                          cost.tp_bandwidth / 1e9, cost.ranks_per_node, cost.link_bandwidth / 1e9);
  }
  const std::vector<int> cps = CpDegrees(spec, options.ranks);
  if (spec.parallel.cp > 1) {
    absl::StrAppendFormat(&out,
                          "  + cp = the context-parallel ring's bytes / %.0f GB/s, counted in STEP "
                          "ms (parallel.cp %d kept as the spec has it)\n",
                          cost.link_bandwidth / 1e9, spec.parallel.cp);
  } else if (cps.size() > 1) {
    absl::StrAppendFormat(&out,
                          "  + cp = the context-parallel ring's bytes / %.0f GB/s, counted in STEP "
                          "ms (parallel.cp %s tried: seq_len %d >= %d on CPU ranks)\n",
                          cost.link_bandwidth / 1e9, absl::StrJoin(cps, ", "), spec.batch.seq_len,
                          kLongSeqLen);
  }
  const size_t total = result.fitting.size() + result.too_big.size();
  absl::StrAppendFormat(&out, "%d layouts planned, %d fit in %s, %d do not\n", total,
                        result.fitting.size(), FormatPlanBytes(options.memory_per_rank),
                        result.too_big.size());
  if (result.fitting.empty()) {
    out += "\nnothing fits; the smallest needs:\n";
    out += Rows(result.too_big, std::min(top, 5));
    return out;
  }
  out += "\n" + Rows(result.fitting, top);
  bool adjusted = false;
  for (const LayoutCandidate& c : result.fitting) adjusted = adjusted || c.micro_adjusted;
  if (adjusted) {
    absl::StrAppendFormat(&out,
                          "  * batch.micro lowered from %d so that micro × dp divides the global "
                          "batch\n",
                          spec.batch.micro);
  }
  int turned_on = 0;
  for (const LayoutCandidate& c : result.fitting) turned_on += c.memory_without > 0 ? 1 : 0;
  if (turned_on > 0) {
    absl::StrAppendFormat(&out,
                          "  + recomputation turned on (cheapest first: selective, then full on "
                          "the first K blocks of each stage) for %d layouts that do not fit with "
                          "model.recompute=%s\n",
                          turned_on, std::string(EnumName(spec.model.recompute)));
  }
  const LayoutCandidate& best = result.fitting.front();
  absl::StrAppendFormat(
      &out, "\nchosen: dp %d%s · tp %d · pp %d%s, ZeRO-%d (predicted %s ms/step, %s per rank)\n",
      best.dp, best.cp > 1 ? absl::StrCat(" · cp ", best.cp) : "", best.tp, best.pp,
      best.ep > 1 ? absl::StrCat(", ep ", best.ep) : "", best.zero, Ms(best.step_s()),
      FormatPlanBytes(best.peak_memory));
  absl::StrAppendFormat(&out,
                        "  predicted %.0f model TFLOP/s per rank (%s · %d tokens / "
                        "%d ranks / step), %.1f%% of the %.0f TFLOP/s assumed\n",
                        best.model_flops_per_rank / 1e12, FlopsFormula(spec, result.num_params),
                        int64_t{spec.batch.global} * spec.batch.seq_len, options.ranks,
                        100 * best.model_flops_per_rank / cost.flops_per_rank,
                        cost.flops_per_rank / 1e12);
  if (best.memory_without > 0) {
    absl::StrAppendFormat(&out,
                          "  with model.recompute=%s: %s per rank without it (over the budget); "
                          "+%.1f%% forward FLOPs\n",
                          RecomputeName(best).substr(0, RecomputeName(best).size() - 1),
                          FormatPlanBytes(best.memory_without), 100 * best.recompute_share);
  }
  std::vector<std::string> sets;
  for (const std::string& o : best.Overrides(spec)) sets.push_back("--set " + o);
  out += "  " + absl::StrJoin(sets, " ") + "\n";
  return out;
}

absl::StatusOr<int64_t> ParseByteSize(std::string_view text, std::string_view what) {
  const std::string t(absl::StripAsciiWhitespace(absl::string_view(text.data(), text.size())));
  const std::string field(what);
  auto bad = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": expected a size such as 4GiB, 512MiB or 80GB, got \"", t, "\""));
  };
  if (t.empty()) return bad();
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  const std::string unit(absl::StripAsciiWhitespace(absl::string_view(end)));
  static const std::pair<const char*, double> kUnits[] = {{"", 1},
                                                          {"B", 1},
                                                          {"KiB", 1024.0},
                                                          {"MiB", 1048576.0},
                                                          {"GiB", 1073741824.0},
                                                          {"TiB", 1099511627776.0},
                                                          {"KB", 1e3},
                                                          {"MB", 1e6},
                                                          {"GB", 1e9},
                                                          {"TB", 1e12}};
  if (end == t.c_str() || !std::isfinite(v) || !(v > 0)) return bad();
  for (const auto& [name, scale] : kUnits) {
    if (unit == name) {
      const double bytes = v * scale;
      if (bytes < 1 || bytes > 9e18) return bad();
      return static_cast<int64_t>(bytes);
    }
  }
  return bad();
}

}  // namespace shardtrain
