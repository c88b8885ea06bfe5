// Pictures in the terminal (and one SVG) for what a table says less well:
// the pipeline schedule as a timeline per stage (the bubble visible), memory
// per rank as bars split by kind, and loss curves. Pure: strings from
// values; `shardtrain plan` and `shardtrain history --plot` print them.
#ifndef SHARDTRAIN_CLIENT_PICTURES_H_
#define SHARDTRAIN_CLIENT_PICTURES_H_

#include <string>
#include <utility>
#include <vector>

#include "common/job_spec.h"
#include "shardtrain/v1/coordinator.pb.h"
#include "shardtrain/v1/types.pb.h"

namespace shardtrain::client {

// One row per stage of `schedule` on `stages` stages and `micro_batches`
// micro-batches, from the schedule's own simulation
// (common/pipeline_schedule.h) with a backward costing two forwards: "F3-" a
// forward of micro-batch 3, "B3====" its backward, "." idle; each row ends
// with the stage's idle share. At most `max_width` characters of timeline (a
// long schedule is drawn at a coarser scale). Empty for one stage. chunks >
// 1: the interleaved schedule (parallel.pp_virtual), "F3.1" micro-batch 3
// through chunk 1, each action 1/chunks as long.
std::string PipelineTimeline(PipelineSchedule schedule, int stages, int micro_batches,
                             int max_width = 96, int chunks = 1);

// A labelled memory estimate, drawn as one bar.
struct MemoryBar {
  std::string label;
  v1::MemoryEstimate memory;
};
// Bars scaled to the largest device total among them, one letter per kind:
// P params, G grads, O optimizer state, A activations, C comm buffers, W
// working set (device); a bar's host bytes (offloaded optimizer state) are a
// second bar below it, labelled host. `width`: characters of the longest.
std::string MemoryBars(const std::vector<MemoryBar>& bars, int width = 56);

// What `shardtrain plan` draws below its tables: the pipeline timeline
// (pp > 1), the memory of a rank of each stage, and, with dp > 1, of the
// busiest rank under each ZeRO stage of this layout (the current one
// starred).
std::string PlanPictures(const JobSpec& spec, const v1::Plan& plan);

// A named series of (step, value) points, in step order.
struct Curve {
  std::string name;
  std::vector<std::pair<double, double>> points;
};
// A job's history as curves: "<prefix>loss" over every step, and
// "<prefix>val_loss" over the evaluated ones when there are any.
void AppendLossCurves(const v1::GetHistoryResponse& history, const std::string& prefix,
                      std::vector<Curve>* curves);

// The curves on one grid of `width` x `height` characters, each with its
// own mark, with the value axis on the left, the step axis below and a
// legend. "(no points)" when no curve has any.
std::string TerminalChart(const std::vector<Curve>& curves, int width = 72, int height = 18);
// The same as a standalone SVG document (text only, no dependency): axes
// with ticks, one polyline per curve, a legend, `title` on top.
std::string SvgChart(const std::vector<Curve>& curves, const std::string& title);

}  // namespace shardtrain::client

#endif  // SHARDTRAIN_CLIENT_PICTURES_H_
