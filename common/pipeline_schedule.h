// Pipeline schedules: the order in which one pipeline stage runs the
// forwards and backwards of a step's micro-batches, and a discrete-event
// simulation of a whole pipeline running them. Pure: no communication, no
// engine. The executor (worker/parallel/pipeline.h) runs these lists, the
// planner sizes each stage's activation slots from them (PeakInFlight), and
// bench/pipeline_bench compares the measured idle time with the
// simulation's.
//
// Shape letters: pp = stages, m = micro-batches per step, s = a stage's
// index (0 = first, takes tokens; pp - 1 = last, computes the loss).
//
//   GPipe  every forward, then every backward (both in micro order): simple,
//          but stage s holds the activations of all m micro-batches at once.
//   1F1B   PipeDream-flush: min(pp - s - 1, m) warm-up forwards, then pairs
//          of one forward and one backward, then the remaining backwards;
//          backwards stay in micro order. Holds at most min(m, pp - s)
//          micro-batches' activations, with the same bubble as GPipe.
// Both have the bubble (pp - 1) / (m + pp - 1) when the costs of a forward
// and of a backward are the same on every stage.
//
//   Interleaved 1F1B (Megatron-LM's; issue 38's parallel.pp_virtual): each
//          stage holds v model chunks — chunk c of stage s is virtual stage
//          c·pp + s of v·pp — and runs F and B of (micro, chunk) pairs:
//          forwards in groups of pp micro-batches, chunk 0 then 1 … then
//          the next group (backwards the same with chunks from v − 1
//          down), (pp − s − 1)·2 + (v − 1)·pp warm-up forwards, then one
//          forward and one backward, then the remaining backwards. Each
//          action costs 1/v of a stage's, so the bubble shrinks to
//          (pp − 1) / (v·m + pp − 1); m must be a multiple of pp.
//
// Thread-compatible: free functions over values.
#ifndef SHARDTRAIN_COMMON_PIPELINE_SCHEDULE_H_
#define SHARDTRAIN_COMMON_PIPELINE_SCHEDULE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/job_spec.h"

namespace shardtrain::parallel {

enum class StepKind { kForward, kBackward };

// One forward or backward of micro-batch `micro` (in [0, m)) on one stage,
// through its model chunk `chunk` (0 unless interleaved).
struct PipelineAction {
  StepKind kind = StepKind::kForward;
  int micro = 0;
  int chunk = 0;
};
bool operator==(const PipelineAction& a, const PipelineAction& b);
bool operator!=(const PipelineAction& a, const PipelineAction& b);

// "F0 F1 B0 B1": actions as tests and logs spell them; "F0.1" is micro 0's
// forward through chunk 1.
std::string ActionsToString(const std::vector<PipelineAction>& actions);

// Preconditions (programming errors, abort with a message): stages >= 1,
// 0 <= stage < stages, micro_batches >= 1.
std::vector<PipelineAction> GpipeActions(int stage, int stages, int micro_batches);
std::vector<PipelineAction> OneFOneBActions(int stage, int stages, int micro_batches);
// Interleaved 1F1B with `chunks` (v) model chunks per stage. Preconditions
// as above, and chunks >= 1, micro_batches a multiple of stages when
// chunks > 1. chunks = 1 is OneFOneBActions.
std::vector<PipelineAction> InterleavedActions(int stage, int stages, int micro_batches,
                                               int chunks);
// The actions of `schedule` on `stage`. With one stage both schedules give
// F0 B0 F1 B1 ...: a single stage waits for no one, so it has no bubble to
// fill, and GPipe's order would only make it hold m activation sets at once.
// chunks > 1 (parallel.pp_virtual): InterleavedActions, whatever `schedule`
// (the job spec accepts only 1f1b with it).
std::vector<PipelineAction> PipelineActions(PipelineSchedule schedule, int stage, int stages,
                                            int micro_batches, int chunks = 1);

// The most micro-batches forwarded and not yet backwarded at any point of
// `actions` (through `chunk` only, when chunk >= 0): the activation sets
// (engine slots) the stage must keep. GPipe: m; 1F1B: min(m, pp - s).
int PeakInFlight(const std::vector<PipelineAction>& actions, int chunk = -1);
// PeakInFlight of each chunk 0 .. chunks - 1: an interleaved stage's slots
// per model chunk (each chunk's saved set is 1/v of the stage's).
std::vector<int> PeakInFlightPerChunk(const std::vector<PipelineAction>& actions, int chunks);

// (pp - 1) / (v·m + pp - 1): the idle fraction of every stage of a pipeline
// of equal stages (GPipe, 1F1B: v = 1; interleaved: v chunks), when
// communication costs nothing.
double BubbleFraction(int stages, int micro_batches, int chunks = 1);

// One action as the simulation placed it in time.
struct SimulatedAction {
  PipelineAction action;
  double start = 0, end = 0;
};

struct SimulatedTimeline {
  double makespan = 0;                                // end of the last action
  std::vector<double> busy;                           // per stage: time computing
  std::vector<double> idle;                           // per stage: makespan - busy
  std::vector<std::vector<SimulatedAction>> actions;  // per stage, in run order
  // Total idle over total stage time: sum(idle) / (stages · makespan).
  double idle_fraction() const;
};

// Discrete-event simulation of `per_stage[s]` running on stage s, each stage
// one action at a time in list order. Chunks make virtual stages (chunk c
// of stage s is c·stages + s, the number of chunks the largest chunk
// named + 1) and the rules below hold between virtual stages. F(m) on s
// starts once s finished its previous action and F(m) on s - 1 finished;
// B(m) on s once B(m) on s + 1
// and F(m) on s finished. Every forward costs fwd_cost, every backward
// bwd_cost (>= 0). FAILED_PRECONDITION ("deadlock: stage 0 waits at B0 ...")
// when some action can never start (a dependency cycle, or one on an action
// that no list holds); INVALID_ARGUMENT for an empty pipeline, a negative
// cost, or a micro-batch forwarded or backwarded twice on a stage.
absl::StatusOr<SimulatedTimeline> SimulateActions(
    const std::vector<std::vector<PipelineAction>>& per_stage, double fwd_cost, double bwd_cost);
// SimulateActions over PipelineActions(schedule, s, stages, m) for every s.
absl::StatusOr<SimulatedTimeline> SimulatePipeline(PipelineSchedule schedule, int stages,
                                                   int micro_batches, double fwd_cost,
                                                   double bwd_cost);
// SimulateActions over InterleavedActions(s, stages, m, chunks), each
// action costing fwd_cost / chunks or bwd_cost / chunks (a chunk is 1/v of
// the stage's layers).
absl::StatusOr<SimulatedTimeline> SimulateInterleaved(int stages, int micro_batches, int chunks,
                                                      double fwd_cost, double bwd_cost);

}  // namespace shardtrain::parallel

#endif  // SHARDTRAIN_COMMON_PIPELINE_SCHEDULE_H_
