// PipelineExecutor: runs one training step's forwards and backwards on one
// pipeline stage, in the order of its schedule (common/pipeline_schedule.h),
// moving activations and their gradients between neighbouring stages.
//
// Per action of the stage's list (micro-batch m keeps its saved activations
// in engine slot m % engine->slots(); with model chunks, below, chunk c's
// slot SlotOf(c, m % chunk_slots(c))):
//   F(m)  fill(m) gives the micro-batch's (B, T) token ids and targets
//         (the first stage calls it for the tokens, the last for the
//         targets; the others read neither); a non-first stage receives its
//         (B, T, C) input from the previous stage (blocking); StageForward;
//         a non-last stage sends StageOutput(slot) to the next stage
//         asynchronously.
//   B(m)  a non-last stage receives the gradient of its output from the next
//         stage (blocking); before_backward(m); StageBackward with
//         loss_scale; a non-first stage copies InputGrad() into the slot's
//         send buffer and sends it to the previous stage asynchronously;
//         after_backward(m). (The send goes before after_backward so that
//         the previous stage is not kept waiting by this stage's
//         data-parallel gradient reduction.)
// Messages to and from a neighbour travel on that pair's one communicator
// (Mesh::pp_prev, pp_next), which runs its ops in order. A send to a
// neighbour that the next action's receive from the same neighbour follows
// — F then B on a middle stage sends an activation on and needs a gradient
// back; B then F sends a gradient back and needs the next input — goes as
// one SendRecv (Megatron-LM's send_forward_recv_backward and
// send_backward_recv_forward; NCCL groups the two): the neighbour does the
// same in the mirrored order (1F1B's steady state) or posts the two apart,
// and neither side's receive is ever queued behind a send that waits for
// it. Messages match per pair in order (one tag): both stages run their
// micro-batches in the same order.
// Interleaved (engine->chunks() = v > 1, parallel.pp_virtual): each action
// is a forward or backward of one (micro-batch, chunk); the "first stage"
// above is chunk 0 of stage 0 and the "last" chunk v − 1 of stage pp − 1,
// every other chunk receiving from and sending to the virtual stages around
// it — stage 0's chunk c > 0 from stage pp − 1's chunk c − 1, which sends
// to it. Messages then travel on four one-way channels (Mesh::act_in,
// act_out, grad_in, grad_out: activations from the previous virtual stage
// and on to the next, gradients back), never grouped: each carries one
// stream that both of its ranks post in the same order, so no receive
// waits behind a send on a communicator that runs its ops one at a time.
// (One pair carrying both directions of every chunk, as above, can: a
// simulation of Gloo's queues deadlocks at pp 2, v 2, m 4.) Host memory
// only (Gloo, or staged): over NCCL the channels' order across
// communicators is not yet tested on several GPUs. The data-parallel
// brackets run around every backward action with its ordinal among the
// step's backward_passes() = m · v: the strategy zeroes gradients before
// the first and reduces during the last, the stage's last B(m − 1, chunk 0),
// when every unit's gradient is final.
//
// An engine off the host (a GPU rank, whose StageOutput, InputGrad and
// inputs are device memory) exchanges in one of two ways:
//   staged  (communicators of host memory: Gloo) its output and input
//           gradient are copied to host buffers before they are sent, what
//           arrives is copied into device buffers of the engine's before
//           StageForward / StageBackward read it (how ranks sharing one GPU
//           pipeline);
//   device  (communicators of device memory: NCCL) activations and
//           gradients go from the engine's memory to the peer's directly.
//           Every transfer is ordered on the device: it waits for the work
//           queued on the engine's compute stream (OpArgs::after) and what
//           reads its result waits for it (Work::BlockStream), so the host
//           only waits at the end of the step (and where the engine itself
//           synchronises, e.g. for the last stage's loss). The input
//           gradient is copied to a per-slot device buffer before it is
//           sent, as the staged path copies it to the host. Timings then
//           measure the host's issuing, not the device: wait_ms is ~0.
// An asynchronous send reads its buffer until it completes: the executor
// waits for a slot's previous send before that slot's output or send buffer
// is written again, and for every send before RunStep returns. A Gloo send
// completes once the peer has posted the matching receive.
//
// Every wait is on a communicator op, which fails with DEADLINE_EXCEEDED
// after the communicator's op timeout (or ABORTED when a peer fails): a
// stage whose neighbour never sends fails instead of hanging. After an error
// the pipeline communicators are in an unknown state (usually poisoned):
// the caller abandons the step and rebuilds them.
//
// B, T, C: engine->max_batch(), engine->max_seq_len(), engine->config().dim;
// every micro-batch is full (B · T tokens).
//
// Not thread-safe: one caller at a time, which also drives the engine.
#ifndef SHARDTRAIN_WORKER_PARALLEL_PIPELINE_H_
#define SHARDTRAIN_WORKER_PARALLEL_PIPELINE_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/job_spec.h"
#include "common/pipeline_schedule.h"
#include "worker/comm/communicator.h"
#include "worker/engine/engine.h"
#include "worker/parallel/mesh.h"

namespace shardtrain::parallel {

// Fills micro-batch `micro`'s B · T token ids and targets (row-major).
using MicroBatchFn = std::function<absl::Status(int micro, int* tokens, int* targets)>;
// Called around each backward: the data-parallel strategy's
// BeginMicroBatch / EndMicroBatch. `pass`: the backward's ordinal in the
// step, in [0, backward_passes()) — micro-batch m's without model chunks.
// May be empty (no call).
using Bracket = std::function<absl::Status(int pass)>;

// The communicators a stage's messages travel on (not owned; null where
// there is no such neighbour): activations in and out, gradients in and
// out. Each is of two ranks, the peer being 1 − rank(). Without model
// chunks the two pair communicators: act_in = grad_out = pp_prev, act_out =
// grad_in = pp_next; with them the mesh's one-way channels.
struct PipelineLinks {
  comm::Communicator *act_in = nullptr, *act_out = nullptr, *grad_in = nullptr, *grad_out = nullptr;
};

// One action as it ran, in milliseconds from the start of the step. wait_ms:
// time blocked on communication inside [start_ms, end_ms] (the receive of
// its input, and a slot's previous send); the rest is computation.
struct ActionTiming {
  StepKind kind = StepKind::kForward;
  int micro = 0;
  double start_ms = 0, end_ms = 0, wait_ms = 0;
  int chunk = 0;
};

struct PipelineStepResult {
  // Sum over micro-batches of what StageForward returned: the summed mean
  // losses on the last stage, 0 on the others.
  double loss_sum = 0;
  std::vector<ActionTiming> actions;  // in run order
  double step_ms = 0;                 // the whole RunStep, final sends included
  double compute_ms = 0;              // sum of (end - start - wait) over actions
  double idle_fraction = 0;           // 1 - compute_ms / step_ms
};

class PipelineExecutor {
 public:
  // `engine` runs this stage (not owned; must outlive the executor).
  // pp_prev / pp_next: this stage's pair communicators with the previous and
  // the next stage (size 2, this stage rank 1 of pp_prev and rank 0 of
  // pp_next; not owned; null where there is no such stage).
  // INVALID_ARGUMENT when the shape is inconsistent (stage outside [0,
  // stages), micro_batches < 1, communicators that do not match, or of
  // device memory with an engine on the host), or when
  // engine->slots() is below PeakInFlight of the stage's actions: the engine
  // cannot keep the activations the schedule holds at once.
  static absl::StatusOr<std::unique_ptr<PipelineExecutor>> Create(
      engine::Engine* engine, comm::Communicator* pp_prev, comm::Communicator* pp_next, int stage,
      int stages, PipelineSchedule schedule, int micro_batches);
  // Any engine, chunked or not, on `links`. Also INVALID_ARGUMENT for model
  // chunks with micro_batches not a multiple of stages, links that are not
  // the channels (senders rank 0), device memory, or a chunk with fewer
  // slots than the schedule holds of it.
  static absl::StatusOr<std::unique_ptr<PipelineExecutor>> Create(engine::Engine* engine,
                                                                  const PipelineLinks& links,
                                                                  int stage, int stages,
                                                                  PipelineSchedule schedule,
                                                                  int micro_batches);
  // The same with the mesh's communicators (its channels with model
  // chunks, else its pairs) and stage.
  static absl::StatusOr<std::unique_ptr<PipelineExecutor>> Create(engine::Engine* engine,
                                                                  const Mesh& mesh,
                                                                  PipelineSchedule schedule,
                                                                  int micro_batches);
  // Waits for outstanding sends (bounded by the op timeout).
  ~PipelineExecutor();

  // One step: every action of actions(). Gradients accumulate into the
  // engine's (the caller zeroes them). Errors: fill's and the brackets' as
  // they come; a communication error with the action and peer prefixed
  // ("pipeline stage 1/2 F3: receiving activations from stage 0: ...", same
  // code); FAILED_PRECONDITION when the engine gives no StageOutput or
  // InputGrad where one must be sent.
  absl::StatusOr<PipelineStepResult> RunStep(const MicroBatchFn& fill,
                                             const Bracket& before_backward,
                                             const Bracket& after_backward, float loss_scale);

  // Forwards only (evaluation), micro-batches 0 .. micro_batches - 1 in slot
  // 0, passing activations down the pipeline like RunStep. Returns the sum
  // of the losses on the last stage, 0 on the others.
  absl::StatusOr<double> RunForwardOnly(int micro_batches, const MicroBatchFn& fill);

  const std::vector<PipelineAction>& actions() const { return actions_; }
  int stage() const { return stage_; }
  int stages() const { return stages_; }
  int micro_batches() const { return micro_batches_; }
  int chunks() const { return chunks_; }
  // Backward actions per step (m · v): the brackets' passes.
  int backward_passes() const { return micro_batches_ * chunks_; }

 private:
  PipelineExecutor(engine::Engine* engine, const PipelineLinks& links, int stage, int stages,
                   int micro_batches, std::vector<PipelineAction> actions);

  // Whether `chunk` here is the pipeline's first virtual stage (it reads
  // tokens) or its last (it computes the loss).
  bool first(int chunk) const { return stage_ == 0 && chunk == 0; }
  bool last(int chunk) const { return stage_ == stages_ - 1 && chunk == chunks_ - 1; }
  // The engine slot of action `a`.
  int SlotOf(const PipelineAction& a) const;
  // The communicator action `a` receives on (null: it receives nothing).
  comm::Communicator* ReceivesOn(const PipelineAction& a) const;
  // Forward of `a` into its slot; adds StageForward's value to *loss.
  // loss_scale: the backward's that will follow (ExpectBackward), 0 for a
  // forward without one (RunForwardOnly).
  // `next`: the action that follows (null: none), whose receive is grouped
  // with this one's send when it comes over the same communicator.
  absl::Status Forward(const PipelineAction& a, const MicroBatchFn& fill, float loss_scale,
                       double* loss, double* wait_ms, const PipelineAction* next);
  absl::Status Backward(const PipelineAction& a, int pass, const Bracket& before,
                        const Bracket& after, float loss_scale, double* wait_ms,
                        const PipelineAction* next);
  // A message on `c` to its other rank, grouped with `next`'s receive when
  // that comes over `c` (then posted into input_recv_ / doutput_recv_);
  // OpArgs::after = AfterEngine().
  std::shared_ptr<comm::Work> Send(comm::Communicator* c, const float* data,
                                   const PipelineAction* next);
  std::shared_ptr<comm::Work> Receive(comm::Communicator* c, float* data);
  // Where a forward's input and a backward's output gradient arrive.
  float* InputBuffer();
  float* DoutputBuffer();
  // "pipeline stage 1/2 F3.1" (the chunk after a dot when there are several).
  std::string Where(const PipelineAction& a) const;
  // The stages this one receives activations from and sends them to.
  int prev_stage() const { return (stage_ + stages_ - 1) % stages_; }
  int next_stage() const { return (stage_ + 1) % stages_; }
  // What the engine reads of a received buffer: `host` itself, or staged
  // its copy in `device`.
  const float* ToEngine(std::vector<float>& host, engine::Buffer* device);
  // Waits for *work (if any) and clears it; adds the time blocked to *wait_ms.
  static absl::Status WaitFor(std::shared_ptr<comm::Work>* work, double* wait_ms);
  // Makes what the engine does next wait for *work (if any) and clears it:
  // WaitFor, or in device mode the compute stream waits for it on the
  // device (the work is kept for DrainSends).
  absl::Status Order(std::shared_ptr<comm::Work>* work, double* wait_ms);
  // Device mode: an event after the engine's queued work, for OpArgs::after
  // (null otherwise).
  const engine::Event* AfterEngine();
  // Waits for every outstanding send (device mode: every transfer); the
  // first error.
  absl::Status DrainSends(double* wait_ms);

  engine::Engine* const engine_;
  const PipelineLinks links_;
  const int stage_, stages_, micro_batches_, chunks_;
  const std::vector<PipelineAction> actions_;
  const int slots_;                                                 // every chunk's
  const size_t tokens_per_micro_;                                   // B · T
  const size_t act_elems_;                                          // B · T · C
  std::vector<std::vector<int>> tokens_, targets_;                  // per slot
  std::vector<float> input_, doutput_;                              // receive buffers
  std::vector<std::vector<float>> grad_send_;                       // per slot: InputGrad copies
  std::vector<std::shared_ptr<comm::Work>> fwd_sends_, bwd_sends_;  // per slot
  // Receives already posted, grouped with the last action's send: the next
  // forward's input, the next backward's output gradient.
  std::shared_ptr<comm::Work> input_recv_, doutput_recv_;
  // Staged (an engine off the host): the received activations and gradients
  // copied into the engine's memory, and per slot the StageOutput copies
  // that are sent.
  const bool staged_;
  std::unique_ptr<engine::Buffer> dev_input_, dev_doutput_;
  std::vector<std::vector<float>> out_send_;
  // Device mode: transfers ordered on the device, not yet waited for; the
  // events they wait for; per slot the InputGrad copies that are sent.
  const bool device_;
  std::vector<std::shared_ptr<comm::Work>> ordered_;
  std::vector<std::unique_ptr<engine::Event>> events_;
  std::vector<std::unique_ptr<engine::Buffer>> dev_grad_send_;
};

}  // namespace shardtrain::parallel

#endif  // SHARDTRAIN_WORKER_PARALLEL_PIPELINE_H_
