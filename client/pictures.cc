#include "client/pictures.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/pipeline_schedule.h"
#include "common/planner.h"

namespace shardtrain::client {

// ------------------------------------------------------------- pipeline

std::string PipelineTimeline(PipelineSchedule schedule, int stages, int micro_batches,
                             int max_width, int chunks) {
  if (stages <= 1 || micro_batches < 1) return "";
  absl::StatusOr<parallel::SimulatedTimeline> tl =
      chunks > 1 ? parallel::SimulateInterleaved(stages, micro_batches, chunks, /*fwd_cost=*/1.0,
                                                 /*bwd_cost=*/2.0)
                 : parallel::SimulatePipeline(schedule, stages, micro_batches, /*fwd_cost=*/1.0,
                                              /*bwd_cost=*/2.0);
  if (!tl.ok()) return absl::StrCat("(no timeline: ", tl.status().message(), ")\n");
  // Characters per time unit (one forward): 3 when it fits (interleaved:
  // 4·v, so that "F3.1", a forward of 1/v unit, is written whole), fewer
  // (down to a fraction) for long schedules.
  const double full = chunks > 1 ? 4.0 * chunks : 3.0;
  const double scale = std::min(full, double(std::max(max_width, 8)) / tl->makespan);
  const int cols = static_cast<int>(std::lround(tl->makespan * scale));
  const std::string kind = chunks > 1
                               ? absl::StrCat("interleaved 1F1B, ", chunks, " chunks per stage")
                               : std::string(EnumName(schedule));
  std::string out = absl::StrFormat(
      "pipeline timeline (%s, %d stages, %d micro-batches; %s):\n", kind, stages, micro_batches,
      chunks > 1 && scale >= full
          ? "F<m>.<c> forward of micro-batch m through chunk c (chunk 0: F<m>), B<m>.<c> its "
            "backward (2 forwards long), . idle"
      : scale >= full
          ? "F<m> forward of micro-batch m = 1 unit, B<m> its backward = 2 units, . idle"
          : "F forward, B backward (2 forwards long), . idle; drawn at a reduced scale");
  for (int s = 0; s < stages; ++s) {
    std::string row(cols, '.');
    for (const parallel::SimulatedAction& a : tl->actions[s]) {
      const int c0 = static_cast<int>(std::lround(a.start * scale));
      const int c1 = std::max(c0 + 1, static_cast<int>(std::lround(a.end * scale)));
      const bool fwd = a.action.kind == parallel::StepKind::kForward;
      const std::string label = parallel::ActionsToString({a.action});
      // At full scale the label where it fits whole, then - or =; at a
      // coarser one (rounded widths) the kind's letter alone: FF BBBB.
      const bool labelled = scale >= full && c1 - c0 >= static_cast<int>(label.size());
      for (int c = c0; c < c1 && c < cols; ++c) {
        const size_t k = static_cast<size_t>(c - c0);
        row[c] = !labelled ? label[0] : k < label.size() ? label[k] : (fwd ? '-' : '=');
      }
    }
    absl::StrAppendFormat(&out, "  stage %-*d |%s|  idle %4.1f%%\n", stages > 10 ? 2 : 1, s, row,
                          100.0 * tl->idle[s] / tl->makespan);
  }
  absl::StrAppendFormat(&out,
                        "  bubble: %.1f%% of the stages' time idle (simulated; %s = "
                        "%.1f%% with equal stages)\n",
                        100.0 * tl->idle_fraction(),
                        chunks > 1 ? "(p-1)/(v·m+p-1)" : "(p-1)/(m+p-1)",
                        100.0 * parallel::BubbleFraction(stages, micro_batches, chunks));
  return out;
}

// --------------------------------------------------------------- memory

std::string MemoryBars(const std::vector<MemoryBar>& bars, int width) {
  int64_t most = 1;
  size_t label_width = 4;  // "host"
  for (const MemoryBar& b : bars) {
    most = std::max({most, b.memory.total_bytes(), b.memory.host_bytes()});
    label_width = std::max(label_width, b.label.size());
  }
  const auto chars = [&](int64_t bytes) {
    if (bytes <= 0) return 0;
    return std::max(1, static_cast<int>(std::lround(double(bytes) / double(most) * width)));
  };
  std::string out;
  for (const MemoryBar& b : bars) {
    const v1::MemoryEstimate& m = b.memory;
    // The optimizer state is on the device unless it is offloaded (then
    // host_bytes holds it and the device total leaves it out).
    const bool offloaded = m.host_bytes() > 0;
    std::string bar;
    for (auto [letter, bytes] : {std::pair<char, int64_t>{'P', m.params_bytes()},
                                 {'G', m.grads_bytes()},
                                 {'O', offloaded ? 0 : m.optimizer_bytes()},
                                 {'A', m.activations_bytes()},
                                 {'C', m.comm_buffer_bytes()},
                                 {'W', m.working_bytes()}}) {
      bar.append(chars(bytes), letter);
    }
    absl::StrAppendFormat(&out, "  %-*s |%-*s| %s\n", label_width, b.label, width, bar,
                          FormatPlanBytes(m.total_bytes()));
    if (offloaded) {
      absl::StrAppendFormat(&out, "  %-*s |%-*s| %s\n", label_width, "host", width,
                            std::string(chars(m.host_bytes()), 'O'),
                            FormatPlanBytes(m.host_bytes()));
    }
  }
  out += "  (P params, G grads, O optimizer state, A activations, C comm buffers, W working set)\n";
  return out;
}

std::string PlanPictures(const JobSpec& spec, const v1::Plan& plan) {
  std::string out;
  if (plan.pp() > 1) {
    out += "\n" + PipelineTimeline(spec.parallel.schedule, plan.pp(), plan.grad_accum_steps(),
                                   /*max_width=*/96, spec.parallel.pp_virtual);
  }
  std::vector<MemoryBar> stages;
  for (const v1::PipelineStage& st : plan.stages()) {
    stages.push_back({plan.pp() > 1 ? absl::StrCat("stage ", st.stage()) : "rank", st.memory()});
  }
  absl::StrAppendFormat(&out, "\nmemory of a rank%s:\n", plan.pp() > 1 ? ", by stage" : "");
  out += MemoryBars(stages);
  if (plan.dp() > 1) {
    std::vector<MemoryBar> zero;
    for (int z = 0; z <= 3; ++z) {
      JobSpec alt = spec;
      alt.parallel.zero = z;
      absl::StatusOr<v1::Plan> p = MakePlan(alt, plan.world());
      if (!p.ok()) continue;  // ZeRO-3 with pp > 1
      zero.push_back(
          {absl::StrCat(z == plan.zero_stage() ? "*" : " ", "ZeRO-", z), p->memory_per_rank()});
    }
    absl::StrAppendFormat(&out, "\nthe busiest rank under each ZeRO stage (dp %d):\n", plan.dp());
    out += MemoryBars(zero);
  }
  return out;
}

// --------------------------------------------------------------- charts

namespace {

struct Bounds {
  double x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  bool any = false;
};

Bounds BoundsOf(const std::vector<Curve>& curves) {
  Bounds b;
  b.x0 = b.y0 = std::numeric_limits<double>::infinity();
  b.x1 = b.y1 = -std::numeric_limits<double>::infinity();
  for (const Curve& c : curves) {
    for (auto [x, y] : c.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      b.any = true;
      b.x0 = std::min(b.x0, x), b.x1 = std::max(b.x1, x);
      b.y0 = std::min(b.y0, y), b.y1 = std::max(b.y1, y);
    }
  }
  if (!b.any) return Bounds{};
  if (b.x1 == b.x0) b.x1 = b.x0 + 1;
  if (b.y1 == b.y0) b.y0 -= 0.5, b.y1 += 0.5;
  return b;
}

std::string Number(double v) { return absl::StrFormat("%.4g", v); }

constexpr char kMarks[] = {'*', 'o', '+', 'x', '#', '@'};

}  // namespace

void AppendLossCurves(const v1::GetHistoryResponse& history, const std::string& prefix,
                      std::vector<Curve>* curves) {
  Curve loss{prefix + "loss", {}}, val{prefix + "val_loss", {}};
  for (const v1::StepReport& s : history.steps()) {
    loss.points.emplace_back(double(s.step()), s.loss());
    if (s.has_val_loss()) val.points.emplace_back(double(s.step()), s.val_loss());
  }
  curves->push_back(std::move(loss));
  if (!val.points.empty()) curves->push_back(std::move(val));
}

std::string TerminalChart(const std::vector<Curve>& curves, int width, int height) {
  const Bounds b = BoundsOf(curves);
  if (!b.any) return "(no points)\n";
  width = std::max(width, 16), height = std::max(height, 4);
  std::vector<std::string> grid(height, std::string(width, ' '));
  for (size_t k = 0; k < curves.size(); ++k) {
    const char mark = kMarks[k % sizeof(kMarks)];
    for (auto [x, y] : curves[k].points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      const int col = static_cast<int>(std::lround((x - b.x0) / (b.x1 - b.x0) * (width - 1)));
      const int row = static_cast<int>(std::lround((b.y1 - y) / (b.y1 - b.y0) * (height - 1)));
      grid[row][col] = mark;
    }
  }
  const std::string top = Number(b.y1), mid = Number((b.y0 + b.y1) / 2), low = Number(b.y0);
  const int label = static_cast<int>(std::max({top.size(), mid.size(), low.size()}));
  std::string out;
  for (int r = 0; r < height; ++r) {
    const std::string& y = r == 0 ? top : r == height - 1 ? low : r == height / 2 ? mid : "";
    absl::StrAppendFormat(&out, "%*s |%s\n", label, y, grid[r]);
  }
  absl::StrAppendFormat(&out, "%*s +%s\n", label, "", std::string(width, '-'));
  const std::string x0 = Number(b.x0), x1 = Number(b.x1);
  absl::StrAppendFormat(&out, "%*s  %s%*s  step\n", label, "", x0,
                        std::max(1, width - static_cast<int>(x0.size())), x1);
  for (size_t k = 0; k < curves.size(); ++k) {
    absl::StrAppendFormat(&out, "%*s  %c %s\n", label, "", kMarks[k % sizeof(kMarks)],
                          curves[k].name);
  }
  return out;
}

namespace {

std::string XmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// About five round values inside [lo, hi]: multiples of 1, 2 or 5 times
// a power of ten.
std::vector<double> NiceTicks(double lo, double hi) {
  const double raw = (hi - lo) / 5;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  double step = power;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * power;
    if (step >= raw) break;
  }
  std::vector<double> out;
  for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) {
    out.push_back(std::abs(v) < step * 1e-9 ? 0.0 : v);
  }
  return out;
}

constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c",
                                   "#ff7f0e", "#9467bd", "#8c564b"};

}  // namespace

std::string SvgChart(const std::vector<Curve>& curves, const std::string& title) {
  const Bounds b = BoundsOf(curves);
  constexpr double W = 760, H = 420, left = 70, right = 20, top = 40, bottom = 70;
  const double pw = W - left - right, ph = H - top - bottom;
  const auto px = [&](double x) { return left + (x - b.x0) / (b.x1 - b.x0) * pw; };
  const auto py = [&](double y) { return top + (b.y1 - y) / (b.y1 - b.y0) * ph; };
  std::string out = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%g\" height=\"%g\" viewBox=\"0 0 %g %g\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
      "<text x=\"%g\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">%s</text>\n",
      W, H, W, H, W / 2, XmlEscape(title));
  absl::StrAppendFormat(&out,
                        "<rect x=\"%g\" y=\"%g\" width=\"%g\" height=\"%g\" fill=\"none\" "
                        "stroke=\"#444\"/>\n",
                        left, top, pw, ph);
  if (!b.any) {
    absl::StrAppendFormat(&out, "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">no points</text>\n",
                          W / 2, H / 2);
    return out + "</svg>\n";
  }
  // Ticks and grid lines at round values (1, 2 or 5 times a power of ten).
  for (const double fx : NiceTicks(b.x0, b.x1)) {
    absl::StrAppendFormat(&out,
                          "<line x1=\"%.1f\" y1=\"%g\" x2=\"%.1f\" y2=\"%g\" stroke=\"#ddd\"/>\n"
                          "<text x=\"%.1f\" y=\"%g\" text-anchor=\"middle\">%s</text>\n",
                          px(fx), top, px(fx), top + ph, px(fx), top + ph + 18, Number(fx));
  }
  for (const double fy : NiceTicks(b.y0, b.y1)) {
    absl::StrAppendFormat(&out,
                          "<line x1=\"%g\" y1=\"%.1f\" x2=\"%g\" y2=\"%.1f\" stroke=\"#ddd\"/>\n"
                          "<text x=\"%g\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
                          left, py(fy), left + pw, py(fy), left - 6, py(fy) + 4, Number(fy));
  }
  absl::StrAppendFormat(&out, "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">step</text>\n",
                        left + pw / 2, top + ph + 38);
  for (size_t k = 0; k < curves.size(); ++k) {
    const char* color = kColors[k % (sizeof(kColors) / sizeof(kColors[0]))];
    std::string pts;
    for (auto [x, y] : curves[k].points) {
      if (std::isfinite(x) && std::isfinite(y))
        absl::StrAppendFormat(&pts, "%.1f,%.1f ", px(x), py(y));
    }
    absl::StrAppendFormat(&out,
                          "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" "
                          "points=\"%s\"/>\n",
                          color, pts);
    const double ly = H - 14 - 16.0 * (curves.size() - 1 - k) / 1.0;
    absl::StrAppendFormat(&out,
                          "<line x1=\"%g\" y1=\"%.1f\" x2=\"%g\" y2=\"%.1f\" stroke=\"%s\" "
                          "stroke-width=\"3\"/><text x=\"%g\" y=\"%.1f\">%s</text>\n",
                          left, ly - 4, left + 24, ly - 4, color, left + 30, ly,
                          XmlEscape(curves[k].name));
  }
  return out + "</svg>\n";
}

}  // namespace shardtrain::client
