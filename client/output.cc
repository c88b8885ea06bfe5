#include "client/output.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/job_spec.h"
#include "common/pipeline_schedule.h"

namespace shardtrain::client {
namespace {

std::string Num(double v) {
  if (!std::isfinite(v)) return "null";
  return absl::StrFormat("%.10g", v);
}

std::string StripPrefix(const std::string& s, const std::string& p) {
  return s.rfind(p, 0) == 0 ? s.substr(p.size()) : s;
}

}  // namespace

std::string FormatTable(const std::vector<std::string>& header,
                        const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width(header.size());
  for (size_t c = 0; c < header.size(); ++c) width[c] = header[c].size();
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size() && c < width.size(); ++c) {
      width[c] = std::max(width[c], row[c].size());
    }
  }
  auto line = [&](const std::vector<std::string>& cells) {
    std::string out;
    for (size_t c = 0; c < cells.size(); ++c) {
      out += cells[c];
      if (c + 1 < cells.size()) out += std::string(width[c] - cells[c].size() + 2, ' ');
    }
    return out + "\n";
  };
  std::string out = line(header);
  for (const auto& row : rows) out += line(row);
  return out;
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

std::string StateName(v1::JobState s) { return StripPrefix(v1::JobState_Name(s), "JOB_STATE_"); }
std::string WorkerStateName(v1::WorkerState s) {
  return StripPrefix(v1::WorkerState_Name(s), "WORKER_STATE_");
}

std::string JobJson(const v1::Job& j) {
  std::vector<std::string> ranks;
  for (const auto& r : j.ranks()) {
    ranks.push_back(
        absl::StrCat("{\"rank\": ", r.rank(), ", \"worker_id\": ", JsonString(r.worker_id()), "}"));
  }
  const v1::JobProgress& p = j.progress();
  std::vector<std::string> warnings;
  for (const std::string& w : j.warnings()) warnings.push_back(JsonString(w));
  return absl::StrCat(
      "{\"job_id\": ", JsonString(j.job_id()), ", \"name\": ", JsonString(j.name()),
      ", \"state\": ", JsonString(StateName(j.state())), ", \"world\": ", j.world(),
      ", \"device\": ", JsonString(j.device()), ", \"generation\": ", j.generation(),
      ", \"restarts\": ", j.restarts(), ", \"ranks\": [", absl::StrJoin(ranks, ", "),
      "], \"step\": ", p.step(), ", \"total_steps\": ", p.total_steps(),
      ", \"loss\": ", p.step() > 0 ? Num(p.loss()) : "null",
      ", \"tokens_per_s\": ", Num(p.tokens_per_s()), ", \"submitted_ms\": ", j.submitted_ms(),
      ", \"updated_ms\": ", j.updated_ms(),
      ", \"failure_reason\": ", JsonString(j.failure_reason()),
      ", \"pending_reason\": ", JsonString(j.pending_reason()),
      ", \"output\": ", JsonString(j.output()),
      ", \"last_committed_step\": ", p.last_committed_checkpoint_step(),
      ", \"checkpoint_failures_in_a_row\": ", p.checkpoint_failures_in_a_row(), ", \"warnings\": [",
      absl::StrJoin(warnings, ", "), "]}");
}

std::string StepJson(const v1::StepReport& s) {
  // val_loss only on the steps that evaluated (eval.every); loss_scale only
  // under fp16 loss scaling, skipped only on the steps it skipped.
  const std::string val =
      s.has_val_loss() ? absl::StrCat(", \"val_loss\": ", Num(s.val_loss())) : "";
  std::string fp16;
  // mfu only where the worker knows its device's peak (common/device_peaks.h).
  if (s.mfu() > 0) absl::StrAppend(&fp16, ", \"mfu\": ", Num(s.mfu()));
  if (s.loss_scale() != 0) absl::StrAppend(&fp16, ", \"loss_scale\": ", Num(s.loss_scale()));
  if (s.skipped()) absl::StrAppend(&fp16, ", \"skipped\": true");
  // moe_* only for Mixture-of-Experts models.
  if (s.moe_max_load() > 0) {
    absl::StrAppend(&fp16, ", \"moe_aux_loss\": ", Num(s.moe_aux_loss()),
                    ", \"moe_z_loss\": ", Num(s.moe_z_loss()),
                    ", \"moe_max_load\": ", Num(s.moe_max_load()),
                    ", \"moe_dropped\": ", Num(s.moe_dropped()));
  }
  return absl::StrCat("{\"step\": ", s.step(), ", \"loss\": ", Num(s.loss()), val,
                      ", \"grad_norm\": ", Num(s.grad_norm()), ", \"lr\": ", Num(s.lr()),
                      ", \"tokens_per_s\": ", Num(s.tokens_per_s()),
                      ", \"step_ms\": ", Num(s.step_ms()), ", \"comm_ms\": ", Num(s.comm_ms()),
                      ", \"comm_bytes\": ", s.comm_bytes(),
                      ", \"peak_rss_bytes\": ", s.peak_rss_bytes(), fp16, "}");
}

std::string StepsJson(const v1::GetHistoryResponse& h) {
  std::vector<std::string> steps;
  for (const auto& s : h.steps()) steps.push_back(StepJson(s));
  std::string out = absl::StrCat("{\"steps\": [", absl::StrJoin(steps, ", "), "]");
  if (h.warnings_size() > 0) {
    std::vector<std::string> warnings;
    for (const v1::JobEvent& w : h.warnings()) {
      warnings.push_back(absl::StrCat("{\"seq\": ", w.seq(), ", \"time_ms\": ", w.time_ms(),
                                      ", \"message\": ", JsonString(w.message()), "}"));
    }
    absl::StrAppend(&out, ", \"warnings\": [", absl::StrJoin(warnings, ", "), "]");
  }
  return out + "}";
}

std::string WarningLines(const v1::GetHistoryResponse& h) {
  std::string out;
  for (const v1::JobEvent& w : h.warnings()) absl::StrAppend(&out, "[WARNING] ", w.message(), "\n");
  return out;
}

std::string HistoryText(const v1::GetHistoryResponse& h, bool csv) {
  std::vector<std::string> header = {"step", "loss",         "val_loss", "grad_norm",
                                     "lr",   "tokens_per_s", "step_ms",  "comm_ms"};
  // fp16's columns: always in CSV (a stable header for programs); in the
  // table only when some step ran with loss scaling.
  const bool fp16 = csv || std::any_of(h.steps().begin(), h.steps().end(), [](const auto& s) {
                      return s.loss_scale() != 0 || s.skipped();
                    });
  if (fp16) header.insert(header.end(), {"loss_scale", "skipped"});
  // MFU: in CSV always (empty where unknown), in the table when a step has one.
  const bool mfu = csv || std::any_of(h.steps().begin(), h.steps().end(),
                                      [](const auto& s) { return s.mfu() > 0; });
  if (mfu) header.push_back("mfu");
  std::vector<std::vector<std::string>> rows;
  for (const auto& s : h.steps()) {
    // No validation loss (or loss scale): an empty CSV field, "-" in the table.
    const std::string none = csv ? "" : "-";
    std::string val = s.has_val_loss() ? absl::StrFormat("%.6g", s.val_loss()) : none;
    rows.push_back({absl::StrCat(s.step()), absl::StrFormat("%.6g", s.loss()), val,
                    absl::StrFormat("%.6g", s.grad_norm()), absl::StrFormat("%.6g", s.lr()),
                    absl::StrFormat("%.1f", s.tokens_per_s()), absl::StrFormat("%.2f", s.step_ms()),
                    absl::StrFormat("%.2f", s.comm_ms())});
    if (fp16) {
      rows.back().push_back(s.loss_scale() != 0 ? absl::StrFormat("%.6g", s.loss_scale()) : none);
      rows.back().push_back(csv ? (s.skipped() ? "true" : "false") : (s.skipped() ? "yes" : "-"));
    }
    if (mfu) rows.back().push_back(s.mfu() > 0 ? absl::StrFormat("%.4f", s.mfu()) : none);
  }
  if (!csv) return FormatTable(header, rows);
  std::string out = absl::StrJoin(header, ",") + "\n";
  for (const auto& r : rows) absl::StrAppend(&out, absl::StrJoin(r, ","), "\n");
  return out;
}

std::string WorkerJson(const v1::WorkerInfo& w) {
  std::vector<std::string> quoted;
  for (const std::string& p : w.device().precisions()) quoted.push_back(JsonString(p));
  const std::string precisions = absl::StrJoin(quoted, ", ");
  return absl::StrCat(
      "{\"worker_id\": ", JsonString(w.worker_id()), ", \"host\": ", JsonString(w.host()),
      ", \"device\": ", JsonString(w.device().name()),
      ", \"state\": ", JsonString(WorkerStateName(w.state())),
      ", \"job_id\": ", JsonString(w.job_id()),
      ", \"rank\": ", w.job_id().empty() ? "null" : absl::StrCat(w.rank()),
      ", \"threads\": ", w.threads(), ", \"last_heartbeat_ms\": ", w.last_heartbeat_ms(),
      ", \"checkpoint_root\": ", JsonString(w.checkpoint_root()),
      ", \"data_root\": ", JsonString(w.data_root()), ", \"kind\": ", JsonString(w.device().kind()),
      ", \"model\": ", JsonString(w.device().model()),
      ", \"memory_bytes\": ", w.device().memory_bytes(), ", \"precisions\": [", precisions, "]}");
}

std::string PlanJson(const v1::Plan& p) {
  const v1::MemoryEstimate& m = p.memory_per_rank();
  std::vector<std::string> ranks;
  for (const auto& r : p.ranks()) {
    ranks.push_back(absl::StrCat(
        "{\"rank\": ", r.rank(), ", \"dp\": ", r.dp(), ", \"tp\": ", r.tp(), ", \"pp\": ", r.pp(),
        ", \"worker_id\": ", JsonString(r.worker_id()), ", \"first_sample\": ", r.first_sample(),
        ", \"num_samples\": ", r.num_samples(), "}"));
  }
  std::vector<std::string> groups;
  for (const auto& g : p.groups()) {
    groups.push_back(absl::StrCat("{\"kind\": ", JsonString(g.kind()), ", \"index\": ", g.index(),
                                  ", \"ranks\": [", absl::StrJoin(g.ranks(), ", "), "]}"));
  }
  return absl::StrCat(
      "{\"world\": ", p.world(), ", \"dp\": ", p.dp(), ", \"tp\": ", p.tp(), ", \"pp\": ", p.pp(),
      ", \"zero\": ", p.zero_stage(), ", \"micro_batch\": ", p.micro_batch(),
      ", \"grad_accum_steps\": ", p.grad_accum_steps(), ", \"seq_len\": ", p.seq_len(),
      ", \"global_batch\": ", p.global_batch(), ", \"schedule\": ", JsonString(p.schedule()),
      ", \"bubble_fraction\": ", Num(p.bubble_fraction()), ", \"num_params\": ", p.num_params(),
      ", \"memory_per_rank_bytes\": {\"params\": ", m.params_bytes(),
      ", \"grads\": ", m.grads_bytes(), ", \"optimizer\": ", m.optimizer_bytes(),
      ", \"activations\": ", m.activations_bytes(), ", \"comm_buffers\": ", m.comm_buffer_bytes(),
      ", \"working\": ", m.working_bytes(), ", \"host\": ", m.host_bytes(),
      ", \"total\": ", m.total_bytes(), "}, \"comm_bytes_per_step\": ", p.comm_bytes_per_step(),
      ", \"checkpoint_bytes\": ", p.checkpoint_bytes(),
      ", \"checkpoint_bytes_per_rank\": ", p.checkpoint_bytes_per_rank(), ", \"ranks\": [",
      absl::StrJoin(ranks, ", "), "], \"groups\": [", absl::StrJoin(groups, ", "), "]}");
}

std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return absl::StrFormat("%dh%02dm", s / 3600, (s % 3600) / 60);
  if (s >= 60) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%ds", s);
}

std::string JobText(const v1::Job& j) {
  std::string out =
      absl::StrCat("job      ", j.job_id(), " (", j.name(), ")\n", "state    ",
                   StateName(j.state()), "\n", "world    ", j.world(), " ", j.device(),
                   " workers, generation ", j.generation(), ", restarts ", j.restarts(), "\n");
  const v1::JobProgress& p = j.progress();
  absl::StrAppend(&out, "progress step ", p.step(), "/", p.total_steps());
  if (p.step() > 0) {
    absl::StrAppend(&out, absl::StrFormat(", loss %.4f, %.0f tok/s", p.loss(), p.tokens_per_s()));
  }
  // How much a crash would cost now: the newest committed step next to the
  // current one, for a job that checkpoints.
  absl::StatusOr<JobSpec> spec = ParseJobSpec(j.spec_yaml());
  const int64_t committed = p.last_committed_checkpoint_step();
  if ((spec.ok() && spec->checkpoint.every > 0) || committed > 0) {
    absl::StrAppend(&out, "; checkpoint: ",
                    committed > 0 ? absl::StrCat("step ", committed, " committed")
                                  : std::string("none committed"));
    const bool ended = j.state() == v1::JOB_STATE_SUCCEEDED || j.state() == v1::JOB_STATE_FAILED ||
                       j.state() == v1::JOB_STATE_CANCELLED;
    if (!ended && p.step() >= committed) {
      absl::StrAppend(&out, " (a crash now costs ", p.step() - committed, " steps)");
    }
    if (p.checkpoint_failures_in_a_row() > 0) {
      absl::StrAppend(&out, ", ", p.checkpoint_failures_in_a_row(), " not committed since");
    }
  }
  absl::StrAppend(&out, "\n");
  if (!j.failure_reason().empty()) absl::StrAppend(&out, "reason   ", j.failure_reason(), "\n");
  if (!j.pending_reason().empty()) absl::StrAppend(&out, "waiting  ", j.pending_reason(), "\n");
  if (!j.output().empty()) absl::StrAppend(&out, "output   ", j.output(), "\n");
  for (const std::string& w : j.warnings()) absl::StrAppend(&out, "[WARNING] ", w, "\n");
  if (j.ranks_size() > 0) {
    std::vector<std::vector<std::string>> rows;
    for (const auto& r : j.ranks()) {
      rows.push_back({absl::StrCat(r.rank()), r.worker_id(), r.collective_address()});
    }
    absl::StrAppend(&out, "ranks\n", FormatTable({"  RANK", "WORKER", "ADDRESS"}, [&] {
      for (auto& row : rows) row[0] = "  " + row[0];
      return rows;
    }()));
  }
  return out;
}

std::string StepLine(const v1::StepReport& s, int64_t total_steps, double eta_s) {
  std::string line = absl::StrFormat("step %*d/%d  loss %.4f  %8.0f tok/s  %7.1f ms/step",
                                     static_cast<int>(absl::StrCat(total_steps).size()), s.step(),
                                     total_steps, s.loss(), s.tokens_per_s(), s.step_ms());
  // Model FLOPs utilisation where the worker knows its device's dense peak.
  if (s.mfu() > 0) absl::StrAppendFormat(&line, "  MFU %4.1f%%", 100 * s.mfu());
  absl::StrAppend(&line, "  ETA ", FormatDuration(eta_s));
  // Bytes the busiest rank sent in the step (the plan predicts it: `plan`).
  if (s.comm_bytes() > 0) absl::StrAppendFormat(&line, "  sent %.1f MB", s.comm_bytes() / 1e6);
  // Mixture of Experts: the balancing loss, the busiest expert's load over
  // the mean's, the pairs dropped (only with a capacity).
  if (s.moe_max_load() > 0) {
    absl::StrAppendFormat(&line, "  aux %.4f  load max/mean %.2f", s.moe_aux_loss(),
                          s.moe_max_load());
    if (s.moe_dropped() > 0)
      absl::StrAppendFormat(&line, "  dropped %.1f%%", 100 * s.moe_dropped());
  }
  // At the end, so that the other columns stay aligned with the lines
  // of steps that did not evaluate.
  if (s.has_val_loss()) absl::StrAppendFormat(&line, "  val %.4f", s.val_loss());
  if (s.skipped()) {
    absl::StrAppendFormat(&line, "  skipped (fp16 overflow at loss scale %g)", s.loss_scale());
  }
  return line;
}

std::string LayoutLine(const v1::Job& job) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(job.spec_yaml());
  if (!spec.ok()) return "";
  const ParallelSpec& p = spec->parallel;
  std::string line =
      p.cp > 1 ? absl::StrFormat("layout: dp %d × cp %d × tp %d × pp %d = %d ranks, ZeRO-%d", p.dp,
                                 p.cp, p.tp, p.pp, spec->World(), p.zero)
               : absl::StrFormat("layout: dp %d × tp %d × pp %d = %d ranks, ZeRO-%d", p.dp, p.tp,
                                 p.pp, spec->World(), p.zero);
  absl::StatusOr<BatchSplit> split = spec->Split();
  if (p.pp > 1 && split.ok()) {
    const int m = split->accum;
    if (p.pp_virtual > 1) {
      absl::StrAppendFormat(&line,
                            "; pipeline interleaved 1F1B, %d chunks per stage, %d micro-batches "
                            "per step, bubble %.1f%% ((pp-1)/(v·m+pp-1))",
                            p.pp_virtual, m,
                            100.0 * parallel::BubbleFraction(p.pp, m, p.pp_virtual));
    } else {
      absl::StrAppendFormat(&line,
                            "; pipeline %s, %d micro-batches per step, bubble %.1f%% "
                            "((pp-1)/(m+pp-1))",
                            std::string(EnumName(p.schedule)), m,
                            100.0 * parallel::BubbleFraction(p.pp, m));
    }
  }
  return line;
}

std::string EventLine(const v1::JobEvent& e, int64_t total_steps, EtaEstimator* eta) {
  if (e.kind() == v1::EVENT_KIND_STEP) {
    eta->Add(e.step().step(), e.step().step_ms());
    return StepLine(e.step(), total_steps, eta->RemainingSeconds(e.step().step(), total_steps));
  }
  if (e.kind() == v1::EVENT_KIND_WARNING) return absl::StrCat("[WARNING] ", e.message());
  return absl::StrCat("[", StateName(e.state()), "] ", e.message());
}

}  // namespace shardtrain::client
