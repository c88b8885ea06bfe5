#include "common/pipeline_schedule.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace shardtrain::parallel {
namespace {

void CheckShape(const char* what, int stage, int stages, int micro_batches) {
  if (stages < 1 || stage < 0 || stage >= stages || micro_batches < 1) {
    std::fprintf(stderr, "%s: need 0 <= stage < stages and micro_batches >= 1, got %d, %d, %d\n",
                 what, stage, stages, micro_batches);
    std::abort();
  }
}

std::string ActionName(const PipelineAction& a) {
  return absl::StrCat(a.kind == StepKind::kForward ? "F" : "B", a.micro,
                      a.chunk > 0 ? absl::StrCat(".", a.chunk) : "");
}

}  // namespace

bool operator==(const PipelineAction& a, const PipelineAction& b) {
  return a.kind == b.kind && a.micro == b.micro && a.chunk == b.chunk;
}
bool operator!=(const PipelineAction& a, const PipelineAction& b) { return !(a == b); }

std::string ActionsToString(const std::vector<PipelineAction>& actions) {
  return absl::StrJoin(
      actions, " ", [](std::string* out, const PipelineAction& a) { out->append(ActionName(a)); });
}

std::vector<PipelineAction> GpipeActions(int stage, int stages, int micro_batches) {
  CheckShape("GpipeActions", stage, stages, micro_batches);
  std::vector<PipelineAction> out;
  for (int m = 0; m < micro_batches; ++m) out.push_back({StepKind::kForward, m});
  for (int m = 0; m < micro_batches; ++m) out.push_back({StepKind::kBackward, m});
  return out;
}

std::vector<PipelineAction> OneFOneBActions(int stage, int stages, int micro_batches) {
  CheckShape("OneFOneBActions", stage, stages, micro_batches);
  const int warmup = std::min(stages - stage - 1, micro_batches);
  std::vector<PipelineAction> out;
  int next_fwd = 0, next_bwd = 0;
  while (next_fwd < warmup) out.push_back({StepKind::kForward, next_fwd++});
  while (next_fwd < micro_batches) {  // steady state: one forward, one backward
    out.push_back({StepKind::kForward, next_fwd++});
    out.push_back({StepKind::kBackward, next_bwd++});
  }
  while (next_bwd < micro_batches) out.push_back({StepKind::kBackward, next_bwd++});
  return out;
}

std::vector<PipelineAction> InterleavedActions(int stage, int stages, int micro_batches,
                                               int chunks) {
  CheckShape("InterleavedActions", stage, stages, micro_batches);
  if (chunks < 1 || (chunks > 1 && micro_batches % stages != 0)) {
    std::fprintf(stderr,
                 "InterleavedActions: need chunks >= 1 and, with chunks > 1, micro_batches a "
                 "multiple of stages; got chunks %d, micro_batches %d, stages %d\n",
                 chunks, micro_batches, stages);
    std::abort();
  }
  if (chunks == 1) return OneFOneBActions(stage, stages, micro_batches);
  // The k-th forward (backward) of this stage: groups of stages · chunks
  // actions, chunk by chunk (backwards from the last chunk), stages
  // micro-batches each.
  const int group = stages * chunks, total = micro_batches * chunks;
  auto nth = [&](StepKind kind, int k) {
    const int in_group = k % group;
    int chunk = in_group / stages;
    if (kind == StepKind::kBackward) chunk = chunks - 1 - chunk;
    return PipelineAction{kind, (k / group) * stages + in_group % stages, chunk};
  };
  const int warmup = std::min((stages - stage - 1) * 2 + (chunks - 1) * stages, total);
  std::vector<PipelineAction> out;
  int next_fwd = 0, next_bwd = 0;
  while (next_fwd < warmup) out.push_back(nth(StepKind::kForward, next_fwd++));
  while (next_fwd < total) {  // steady state: one forward, one backward
    out.push_back(nth(StepKind::kForward, next_fwd++));
    out.push_back(nth(StepKind::kBackward, next_bwd++));
  }
  while (next_bwd < total) out.push_back(nth(StepKind::kBackward, next_bwd++));
  return out;
}

std::vector<PipelineAction> PipelineActions(PipelineSchedule schedule, int stage, int stages,
                                            int micro_batches, int chunks) {
  if (chunks > 1) return InterleavedActions(stage, stages, micro_batches, chunks);
  if (schedule == PipelineSchedule::kGpipe && stages > 1) {
    return GpipeActions(stage, stages, micro_batches);
  }
  return OneFOneBActions(stage, stages, micro_batches);  // one stage: F0 B0 F1 B1 ...
}

int PeakInFlight(const std::vector<PipelineAction>& actions, int chunk) {
  int in_flight = 0, peak = 0;
  for (const PipelineAction& a : actions) {
    if (chunk >= 0 && a.chunk != chunk) continue;
    in_flight += a.kind == StepKind::kForward ? 1 : -1;
    peak = std::max(peak, in_flight);
  }
  return peak;
}

std::vector<int> PeakInFlightPerChunk(const std::vector<PipelineAction>& actions, int chunks) {
  std::vector<int> out;
  for (int c = 0; c < chunks; ++c) out.push_back(PeakInFlight(actions, c));
  return out;
}

double BubbleFraction(int stages, int micro_batches, int chunks) {
  return static_cast<double>(stages - 1) /
         static_cast<double>(int64_t{chunks} * micro_batches + stages - 1);
}

double SimulatedTimeline::idle_fraction() const {
  if (busy.empty() || makespan <= 0) return 0;
  double idle_sum = 0;
  for (double i : idle) idle_sum += i;
  return idle_sum / (static_cast<double>(busy.size()) * makespan);
}

absl::StatusOr<SimulatedTimeline> SimulateActions(
    const std::vector<std::vector<PipelineAction>>& per_stage, double fwd_cost, double bwd_cost) {
  const int stages = static_cast<int>(per_stage.size());
  if (stages == 0) return absl::InvalidArgumentError("SimulateActions: no stages");
  if (fwd_cost < 0 || bwd_cost < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("SimulateActions: costs must be >= 0, got ", fwd_cost, " and ", bwd_cost));
  }
  // Chunks: the largest named + 1; chunk c of stage s is virtual stage
  // c·stages + s.
  int chunks = 1;
  for (const auto& actions : per_stage) {
    for (const PipelineAction& a : actions) chunks = std::max(chunks, a.chunk + 1);
  }
  const int virtual_stages = stages * chunks;
  // End times of the actions that ran, per virtual stage and micro-batch.
  std::vector<std::map<int, double>> fwd_end(virtual_stages), bwd_end(virtual_stages);
  for (int s = 0; s < stages; ++s) {
    std::map<std::pair<int, int>, int> seen_f, seen_b;
    for (const PipelineAction& a : per_stage[s]) {
      if (a.chunk < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("SimulateActions: stage ", s, " runs ", ActionName(a), " of chunk < 0"));
      }
      if (++(a.kind == StepKind::kForward ? seen_f : seen_b)[{a.micro, a.chunk}] > 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("SimulateActions: stage ", s, " runs ", ActionName(a), " twice"));
      }
    }
  }

  SimulatedTimeline out;
  out.busy.assign(stages, 0);
  out.idle.assign(stages, 0);
  out.actions.resize(stages);
  std::vector<size_t> next(stages, 0);  // index of each stage's next action
  std::vector<double> free_at(stages, 0);
  // Each stage runs its actions in order, so placing every action whose
  // dependencies have ended, until none can be placed, gives the same times
  // as an event queue; whatever is left waits on a cycle.
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < stages; ++s) {
      while (next[s] < per_stage[s].size()) {
        const PipelineAction& a = per_stage[s][next[s]];
        double start = free_at[s];
        bool ready = true;
        auto after = [&](const std::map<int, double>& ends) {
          auto it = ends.find(a.micro);
          if (it == ends.end()) {
            ready = false;
          } else {
            start = std::max(start, it->second);
          }
        };
        const int vs = a.chunk * stages + s;
        if (a.kind == StepKind::kForward) {
          if (vs > 0) after(fwd_end[vs - 1]);
        } else {
          after(fwd_end[vs]);
          if (vs + 1 < virtual_stages) after(bwd_end[vs + 1]);
        }
        if (!ready) break;
        const double cost = a.kind == StepKind::kForward ? fwd_cost : bwd_cost;
        const double end = start + cost;
        (a.kind == StepKind::kForward ? fwd_end : bwd_end)[vs][a.micro] = end;
        out.actions[s].push_back({a, start, end});
        out.busy[s] += cost;
        free_at[s] = end;
        out.makespan = std::max(out.makespan, end);
        ++next[s];
        progress = true;
      }
    }
  }
  std::vector<std::string> stuck;
  for (int s = 0; s < stages; ++s) {
    if (next[s] < per_stage[s].size()) {
      stuck.push_back(absl::StrCat("stage ", s, " waits at ", ActionName(per_stage[s][next[s]]),
                                   " (action ", next[s], " of ", per_stage[s].size(), ")"));
    }
  }
  if (!stuck.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("pipeline deadlock: ", absl::StrJoin(stuck, "; ")));
  }
  for (int s = 0; s < stages; ++s) out.idle[s] = out.makespan - out.busy[s];
  return out;
}

absl::StatusOr<SimulatedTimeline> SimulatePipeline(PipelineSchedule schedule, int stages,
                                                   int micro_batches, double fwd_cost,
                                                   double bwd_cost) {
  if (stages < 1 || micro_batches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("SimulatePipeline: need stages >= 1 and micro_batches >= 1, got ", stages,
                     ", ", micro_batches));
  }
  std::vector<std::vector<PipelineAction>> per_stage;
  for (int s = 0; s < stages; ++s) {
    per_stage.push_back(PipelineActions(schedule, s, stages, micro_batches));
  }
  return SimulateActions(per_stage, fwd_cost, bwd_cost);
}

absl::StatusOr<SimulatedTimeline> SimulateInterleaved(int stages, int micro_batches, int chunks,
                                                      double fwd_cost, double bwd_cost) {
  if (stages < 1 || micro_batches < 1 || chunks < 1 ||
      (chunks > 1 && micro_batches % stages != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SimulateInterleaved: need stages, micro_batches, chunks >= 1 and micro_batches a "
        "multiple of stages when chunks > 1; got ",
        stages, ", ", micro_batches, ", ", chunks));
  }
  std::vector<std::vector<PipelineAction>> per_stage;
  for (int s = 0; s < stages; ++s) {
    per_stage.push_back(InterleavedActions(s, stages, micro_batches, chunks));
  }
  return SimulateActions(per_stage, fwd_cost / chunks, bwd_cost / chunks);
}

}  // namespace shardtrain::parallel
