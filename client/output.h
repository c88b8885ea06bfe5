// Rendering of the CLI's data: aligned tables for people, JSON for programs.
// The JSON shapes are the contract of DESIGN.md ("What a user sees"):
// `status` prints JobJson, `history` prints {"steps": [StepJson...]}, and
// `local --output json` prints {"job": JobJson, "steps": [...]}.
#ifndef SHARDTRAIN_CLIENT_OUTPUT_H_
#define SHARDTRAIN_CLIENT_OUTPUT_H_

#include <string>
#include <vector>

#include "client/eta.h"
#include "shardtrain/v1/coordinator.pb.h"

namespace shardtrain::client {

// Rows of cells printed with columns padded to their widest cell.
std::string FormatTable(const std::vector<std::string>& header,
                        const std::vector<std::vector<std::string>>& rows);

std::string JsonString(const std::string& s);  // quoted and escaped
std::string JobJson(const v1::Job& job);
// "val_loss" appears only in the steps that evaluated; "loss_scale" only
// when the step ran with fp16 loss scaling; "skipped": true only in the steps
// whose update was skipped (fp16 overflow), absent (false) elsewhere.
std::string StepJson(const v1::StepReport& s);
// {"steps": [...]}, and "warnings": [{"seq", "time_ms", "message"}, ...]
// after them when the job has warnings (EVENT_KIND_WARNING events).
std::string StepsJson(const v1::GetHistoryResponse& h);
// `history` for people (an aligned table) or, with csv, a header line and one
// line per step; steps without a validation loss show "-" (table) or an
// empty field (csv). The columns loss_scale and skipped follow: always in
// CSV (loss_scale empty without loss scaling, skipped true/false), in the
// table only when some step has a loss scale ("-" / "yes").
std::string HistoryText(const v1::GetHistoryResponse& h, bool csv);
// The job's warnings as `watch` printed them, one "[WARNING] message" line
// each; empty without any.
std::string WarningLines(const v1::GetHistoryResponse& h);
// A worker with its device: kind, model ("NVIDIA H100 80GB HBM3, compute
// capability 9.0", "cpu, 2 threads"), memory_bytes and precisions.
std::string WorkerJson(const v1::WorkerInfo& w);
std::string PlanJson(const v1::Plan& plan);

// "RUNNING" for JOB_STATE_RUNNING.
std::string StateName(v1::JobState s);
std::string WorkerStateName(v1::WorkerState s);
// "1h02m", "3m05s", "12s".
std::string FormatDuration(double seconds);
// Human text of a job for `status`: state, progress, and for a job that
// checkpoints the newest committed step next to the current one (what a
// crash would cost now), the checkpoints not committed in a row, and the
// job's warnings.
std::string JobText(const v1::Job& job);
// One progress line for a step event: step, loss, tok/s, ms/step, the ETA
// `eta_s` (NaN prints "?"), and on steps that evaluated the validation loss
// ("val 2.3100") at the end; a step whose update was skipped ends with
// "skipped (fp16 overflow at loss scale 65536)".
std::string StepLine(const v1::StepReport& s, int64_t total_steps, double eta_s);
// The job's mesh as `watch` and `local` print it before the events:
// "layout: dp 2 × tp 2 × pp 2 = 8 ranks, ZeRO-0; pipeline 1f1b, 4
// micro-batches per step, bubble 20.0% ((pp-1)/(m+pp-1))". Empty when the
// job's spec does not parse.
std::string LayoutLine(const v1::Job& job);
// One line for any event (state changes, failures, steps): "[STATE] message",
// "[WARNING] message" for a warning; step events feed `eta`, which gives
// their ETA.
std::string EventLine(const v1::JobEvent& e, int64_t total_steps, EtaEstimator* eta);

}  // namespace shardtrain::client

#endif  // SHARDTRAIN_CLIENT_OUTPUT_H_
