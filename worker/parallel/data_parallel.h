// DataParallel: how one data-parallel group of ranks keeps the model's
// parameters, gradients and optimizer state and turns each rank's gradient
// into one optimizer step — DDP (ddp.h: every rank holds everything, one
// bucketed all-reduce) or ZeRO stages 1-3 (zero.h: sharded per unit). The
// trainer drives every strategy the same way, per optimizer step:
//
//   for each micro-batch m of accum:
//     BeginMicroBatch(m, accum)   installs the engine's hooks (m = 0 also
//                                 starts the step's gradients from zero)
//     engine.Forward / Backward   the hooks gather parameters and launch
//                                 gradient reductions as units finish
//     EndMicroBatch()             waits for what this micro-batch must finish
//   Step(lr, max_norm)            the mean gradient over dp, clipping by the
//                                 global norm, AdamW, parameters made whole
//
// and, between steps, forward-only passes (the validation loss):
//
//   BeginEval()                   installs what forwards need (ZeRO-3: the
//                                 gathering hook, in forward order only)
//   engine.Forward ...            any number, each with targets; no Backward
//   EndEval(loss_sum)             releases what the passes gathered and sums
//                                 loss_sum over the dp group
//
// Collective: every rank of the group runs the same micro-batches and steps,
// and the same number of forwards between BeginEval and EndEval.
// Not thread-safe: one caller; the engine's hooks run on the caller's thread.
#ifndef SHARDTRAIN_WORKER_PARALLEL_DATA_PARALLEL_H_
#define SHARDTRAIN_WORKER_PARALLEL_DATA_PARALLEL_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/job_spec.h"
#include "worker/comm/communicator.h"
#include "worker/engine/engine.h"
#include "worker/optim/adamw.h"

namespace shardtrain::parallel {

// What one optimizer step cost in communication on this rank.
struct StepStats {
  double grad_norm = 0;      // global norm before clipping (identical on every rank)
  double comm_ms = 0;        // time Step() was blocked on or ran collectives (exposed)
  double collective_ms = 0;  // time the gradient collectives ran (flight recorder), where
                             // known: 1 - exposed/collective is the part hidden by backward
  int64_t comm_bytes = 0;    // bytes this rank sent since the last Step (ring model of the
                             // ops issued)
  bool skipped = false;      // the gradients were not finite: no update (fp16 overflow)
};

// Bytes of model state one rank holds, by kind.
struct ModelStateMemory {
  int64_t params = 0;        // parameters kept between steps (ZeRO-3: the shard)
  int64_t grads = 0;         // gradients kept (ZeRO-2/3: the shard)
  int64_t optimizer = 0;     // AdamW m and v (offload: in host memory)
  int64_t comm_buffers = 0;  // buffers only communication needs
  int64_t working = 0;       // ZeRO-2/3 peak of whole units alive at once: gathered
                             // params (3) and full-unit gradients in backward
  bool optimizer_on_host = false;
};

// Flat element ranges [first, second) of the parameter layout.
using FlatRanges = std::vector<std::pair<size_t, size_t>>;

// What tensor and pipeline parallelism add to a data-parallel step: Step
// applies them after the gradients are reduced over dp and before the norm.
// Empty (the default): a model on one rank per replica.
struct ModelParallelGrads {
  // [0, tied_end) of the flat gradient (the embeddings unit) is tied to
  // another pipeline stage's copy: sum_tied sums, in place, the part of it
  // this rank holds (DDP: all of it; ZeRO: its shard of the unit, which the
  // tied rank's shard matches element for element) with that copy.
  size_t tied_end = 0;
  std::function<absl::Status(absl::Span<float>)> sum_tied;
  // Ranges of the flat gradient that another rank counts in the norm
  // (ParamLayout::ReplicaRanges).
  FlatRanges norm_skip;
  // Sums a squared norm over the tp and pp groups (identical on every rank).
  std::function<absl::StatusOr<double>(double)> sum_squares;
  // Ranges of the flat gradient holding this tp rank's partial sums (the
  // norms' under sequence parallelism, computed on its rows only; the q/k
  // norms', on its heads only: ParamLayout::TpPartialRanges) and the
  // in-place sum over the tp
  // group that completes them — before the norm, like sum_tied.
  FlatRanges tp_partial;
  std::function<absl::Status(absl::Span<float>)> sum_tp;
  // Where sum_tied and sum_tp take their data: host memory (false: Gloo),
  // or the engine's memory (true: NCCL groups, a GPU's memory). The
  // strategies pass them their gradients through SumInPlace, which copies
  // where the two differ.
  bool device_memory = false;
  bool has_tp_partials() const { return sum_tp && !tp_partial.empty(); }
  // Expert parallelism (parallel.ep > 1): the experts' ranges
  // (ParamLayout::ExpertRanges), where the replica group's ranks hold
  // different experts. They are left out of the reduction over the replica
  // group and summed instead over the ranks that hold the same experts
  // (sum_expert; null when this rank alone does), then averaged like the
  // rest (over dp · cp: every replica's tokens reached them). Their squares
  // are summed over the ep group for the norm (sum_expert_squares).
  // Checkpoints: the expert-data-parallel group (expert_dp_rank of
  // expert_dp_size) splits their saving, the replica group the rest's.
  // DDP only (ZeRO refuses them).
  FlatRanges expert;
  std::function<absl::Status(absl::Span<float>)> sum_expert;
  std::function<absl::StatusOr<double>(double)> sum_expert_squares;
  int expert_dp_rank = 0, expert_dp_size = 1;
};

// Runs `sum` (sum_tied or sum_tp of `mp`) over data[0, n), which lives in
// the engine's memory when `in_engine` and the engine is off the host,
// else in host memory: on the data itself when that is where the sum takes
// it (mp.device_memory), otherwise on a copy there, written back.
absl::Status SumInPlace(const ModelParallelGrads& mp, engine::Engine& engine, bool in_engine,
                        float* data, size_t n,
                        const std::function<absl::Status(absl::Span<float>)>& sum);

// Sums over the tp group (mp.sum_tp, one call) the parts of grads[0, size)
// (flat elements [offset, offset + size); memory as SumInPlace's
// `in_engine` says) inside mp.tp_partial, packed into one buffer there.
// Every tp rank of a stage holds the same ranges, so each issues the same
// call.
absl::Status SumTpPartials(const ModelParallelGrads& mp, engine::Engine& engine, bool in_engine,
                           float* grads, size_t size, size_t offset);

class DataParallel {
 public:
  virtual ~DataParallel() = default;

  // The model's initial parameters, the engine's InitParams(seed) values,
  // where this strategy keeps them. No communication.
  virtual void InitParams(uint64_t seed) = 0;

  virtual void BeginMicroBatch(int micro, int accum) = 0;
  // Returns the first communication error of the pass, if any (hooks cannot
  // return errors: the pass finishes on stale data and the error surfaces
  // here; the communicator is poisoned by then, so nothing waits).
  virtual absl::Status EndMicroBatch() = 0;
  // After the last EndMicroBatch of a step. `loss_scale`: the factor the
  // backward passes multiplied the loss by (fp16 dynamic loss scaling; 1
  // otherwise), divided out of the gradients here. When the gradient norm
  // is not finite the step is skipped (StepStats::skipped; parameters and
  // optimizer state unchanged).
  virtual absl::StatusOr<StepStats> Step(float lr, float max_norm, float loss_scale = 1.0f) = 0;

  // Brackets forward-only passes between steps (not within one): they read
  // the current parameters and touch no gradient, optimizer state or step
  // statistic (their traffic is not counted in the next Step's comm_bytes).
  // EndEval returns the sum of `loss_sum` over the dp group, identical on
  // every rank (rank order, bit-exact doubles), or the first communication
  // error of the passes. Collective.
  virtual void BeginEval() = 0;
  virtual absl::StatusOr<double> EndEval(double loss_sum) = 0;

  // Makes the engine's parameter buffer hold the whole, current parameters
  // on every rank (for exporting weights). Collective where parameters are
  // sharded.
  virtual absl::Status GatherWholeModel() = 0;

  // ---- Checkpoints.
  // What this rank writes: the ranges of its shard (sorted, disjoint,
  // non-empty), and the parameters, AdamW m and v of them, concatenated in
  // that order.
  virtual FlatRanges SaveRanges() const = 0;
  virtual std::vector<float> SaveParams() const = 0;
  virtual std::vector<float> SaveM() const = 0;
  virtual std::vector<float> SaveV() const = 0;
  virtual int64_t optimizer_step() const = 0;
  // What this rank reads back (from a checkpoint of any world and strategy):
  // the ranges whose state it keeps, and the state itself, each vector
  // holding the LoadRanges() elements in order; collective where
  // parameters must be made whole again. InvalidArgument for sizes.
  virtual FlatRanges LoadRanges() const = 0;
  virtual absl::Status Restore(absl::Span<const float> params, absl::Span<const float> m,
                               absl::Span<const float> v, int64_t optimizer_step) = 0;

  // Tensor and pipeline parallelism's part of Step (see ModelParallelGrads).
  virtual void set_model_parallel(ModelParallelGrads mp) = 0;

  // ---- Accounting.
  virtual ModelStateMemory memory() const = 0;
  // Measure resident memory (mincore) in memory() instead of counting
  // buffers; off by default (it costs a syscall per use).
  virtual void set_measure(bool on) = 0;
};

// Calls f(first, last) for each part [first, last) of [begin, end) outside
// `skip` (sorted, disjoint), in order.
template <typename F>
void ForEachOutside(size_t begin, size_t end, const FlatRanges& skip, F f) {
  size_t at = begin;  // the first element not yet passed to f or skipped
  for (const auto& [b, e] : skip) {
    if (e <= at) continue;
    if (b >= end) break;
    if (b > at) f(at, b);
    at = std::min(end, e);
  }
  if (at < end) f(at, end);
}

// The squared L2 norm of `grads` (flat elements [offset, offset + size)),
// leaving out the parts inside `skip`.
double SquaredNormOutside(absl::Span<const float> grads, size_t offset, const FlatRanges& skip,
                          engine::ThreadPool* pool);
// The same over `count` elements of `math`'s memory (a device's gradients).
double SquaredNormOutside(engine::FlatMath& math, const float* grads, size_t count, size_t offset,
                          const FlatRanges& skip);

// For a collective of device memory that reads what the kernels queued so
// far on `device`'s compute stream wrote: an event recorded on that stream
// now, kept in `keep` (the caller clears it once those collectives are
// done), to pass as OpArgs::after. Where no event can be made, the host
// waits for the stream instead and this returns null.
const engine::Event* AfterComputeWork(engine::Device& device,
                                      std::vector<std::unique_ptr<engine::Event>>* keep);
// Drops from `in_flight` the ops ordered on the device that are done and
// succeeded (a failed one stays, for the caller's Finish to report), and,
// once none is left, the events AfterComputeWork kept for them.
void ForgetFinished(std::vector<std::shared_ptr<comm::Work>>* in_flight,
                    std::vector<std::unique_ptr<engine::Event>>* events);

// The collectives a device-memory group (tp's, ep's) orders on the engine's
// compute stream: each waits on the device for the work queued so far, and
// the stream's later work waits for it; none waits on the host until
// Finish.
class StreamOrderedOps {
 public:
  // Submits submit(after) ordered so on `device`'s compute stream; the
  // error of blocking the stream on it (its own errors come at Finish).
  absl::Status Run(engine::Device& device,
                   const std::function<std::shared_ptr<comm::Work>(const engine::Event*)>& submit);
  // Waits for every op in flight; `status`, or else the first op's error.
  absl::Status Finish(absl::Status status);

 private:
  std::vector<std::shared_ptr<comm::Work>> in_flight_;
  std::vector<std::unique_ptr<engine::Event>> events_;  // kept until their ops are done
};

// All-reduces (sum) data[0, n) in place over `comm` and waits for it: host
// memory, or, for a communicator of device memory, `engine`'s memory, the
// op ordered after the engine's queued work. (The tied embeddings' sum.)
absl::Status AllReduceSumNow(comm::Communicator& comm, engine::Engine& engine, float* data,
                             size_t n);

// The sum of `local` over the ranks of `comm` (null: local alone), added in
// rank order from bit-exact copies, so every rank gets the same double.
// A communicator of device memory (NCCL) exchanges them through a scratch
// of `device`'s memory (required then): `*scratch`, made on first use and
// kept by a caller that sums every step, else one made for this call.
// Collective.
absl::StatusOr<double> SumOverGroup(comm::Communicator* comm, double local,
                                    engine::FlatMath* device = nullptr,
                                    std::unique_ptr<engine::Buffer>* scratch = nullptr);

// The strategy a job's parallel section asks for (zero 0: DDP, 1-3: ZeRO)
// over `comm` (the data-parallel group; null or of size 1 when dp == 1).
// Under expert parallelism (parallel.ep > 1) ZeRO shards the experts over
// `expert_comm`, the ranks holding the same experts (null when this rank
// alone does; DDP takes its group through set_model_parallel). engine and
// the communicators must outlive the result.
absl::StatusOr<std::unique_ptr<DataParallel>> MakeDataParallel(
    const ParallelSpec& parallel, engine::Engine* engine, const optim::AdamWOptions& adamw,
    comm::Communicator* comm, comm::Communicator* expert_comm = nullptr);

}  // namespace shardtrain::parallel

#endif  // SHARDTRAIN_WORKER_PARALLEL_DATA_PARALLEL_H_
