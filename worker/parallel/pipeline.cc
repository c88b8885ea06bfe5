#include "worker/parallel/pipeline.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/parallel/data_parallel.h"

namespace shardtrain::parallel {
namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Pipeline messages' tag: they match per pair communicator in order.
constexpr uint32_t kPipeTag = 0x7070;  // "pp"

bool DeviceMemory(const PipelineLinks& l) {
  for (const comm::Communicator* c : {l.act_in, l.act_out, l.grad_in, l.grad_out}) {
    if (c != nullptr && c->device_memory()) return true;
  }
  return false;
}

// `status` with `context` in front of its message, same code.
absl::Status Prefix(const absl::Status& status, const std::string& context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<PipelineExecutor>> PipelineExecutor::Create(
    engine::Engine* engine, comm::Communicator* pp_prev, comm::Communicator* pp_next, int stage,
    int stages, PipelineSchedule schedule, int micro_batches) {
  return Create(engine, PipelineLinks{pp_prev, pp_next, pp_next, pp_prev}, stage, stages, schedule,
                micro_batches);
}

absl::StatusOr<std::unique_ptr<PipelineExecutor>> PipelineExecutor::Create(
    engine::Engine* engine, const PipelineLinks& links, int stage, int stages,
    PipelineSchedule schedule, int micro_batches) {
  if (engine == nullptr) return absl::InvalidArgumentError("pipeline: no engine");
  if (stages < 1 || stage < 0 || stage >= stages) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline: stage ", stage, " outside [0, ", stages, ")"));
  }
  if (micro_batches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline: micro_batches must be >= 1, got ", micro_batches));
  }
  const int chunks = engine->chunks();
  if (chunks > 1 && (stages < 2 || micro_batches % stages != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline: ", chunks, " model chunks per stage need pp > 1 and micro-batches ",
                     "a multiple of pp (the interleaved schedule's groups); got pp ", stages, ", ",
                     micro_batches, " micro-batches"));
  }
  // Without chunks: pp_prev (act_in = grad_out), this stage rank 1 of 2,
  // none on the first stage; pp_next (act_out = grad_in), rank 0 of 2, none
  // on the last. With chunks every channel, senders rank 0.
  const bool has_prev = chunks > 1 || stage > 0, has_next = chunks > 1 || stage + 1 < stages;
  for (auto [name, c, wanted, rank] : {std::tuple<const char*, comm::Communicator*, bool, int>{
                                           "act_in", links.act_in, has_prev, 1},
                                       {"grad_out", links.grad_out, has_prev, chunks > 1 ? 0 : 1},
                                       {"act_out", links.act_out, has_next, 0},
                                       {"grad_in", links.grad_in, has_next, chunks > 1 ? 1 : 0}}) {
    if (!wanted && c == nullptr) continue;
    if (!wanted || c == nullptr || c->size() != 2 || c->rank() != rank) {
      return absl::InvalidArgumentError(
          absl::StrCat("pipeline: stage ", stage, " of ", stages, " wants ",
                       wanted ? absl::StrCat("rank ", rank, " of 2") : std::string("none"), " as ",
                       name, ", got ",
                       c == nullptr ? std::string("null")
                                    : absl::StrCat("rank ", c->rank(), " of ", c->size())));
    }
  }
  if (chunks == 1 && (links.act_in != links.grad_out || links.act_out != links.grad_in)) {
    return absl::InvalidArgumentError(
        "pipeline: without model chunks each neighbour's messages share its pair communicator");
  }
  bool host_link = false;
  for (const comm::Communicator* c : {links.act_in, links.act_out}) {
    host_link |= c != nullptr && !c->device_memory();
  }
  if (DeviceMemory(links) &&
      (host_link || engine->math().kind() == DeviceKind::kCpu || chunks > 1)) {
    return absl::InvalidArgumentError(
        "pipeline: communicators of device memory need both neighbours' so, an engine off the "
        "host and no model chunks (interleaved stages run over Gloo)");
  }
  std::vector<PipelineAction> actions =
      PipelineActions(schedule, stage, stages, micro_batches, chunks);
  for (int c = 0; c < chunks; ++c) {
    const int peak = PeakInFlight(actions, c);
    if (engine->chunk_slots(c) < peak) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pipeline: the ", chunks > 1 ? "interleaved" : std::string(EnumName(schedule)),
          " schedule holds up to ", peak, " micro-batches' activations at once on stage ", stage,
          " of ", stages, chunks > 1 ? absl::StrCat(" (chunk ", c, ")") : "", " (", micro_batches,
          " micro-batches per step), but the engine keeps ", engine->chunk_slots(c), " (slots)"));
    }
  }
  return std::unique_ptr<PipelineExecutor>(
      new PipelineExecutor(engine, links, stage, stages, micro_batches, std::move(actions)));
}

absl::StatusOr<std::unique_ptr<PipelineExecutor>> PipelineExecutor::Create(
    engine::Engine* engine, const Mesh& mesh, PipelineSchedule schedule, int micro_batches) {
  const PipelineLinks links =
      engine != nullptr && engine->chunks() > 1
          ? PipelineLinks{mesh.act_in(), mesh.act_out(), mesh.grad_in(), mesh.grad_out()}
          : PipelineLinks{mesh.pp_prev(), mesh.pp_next(), mesh.pp_next(), mesh.pp_prev()};
  return Create(engine, links, mesh.stage(), mesh.stages(), schedule, micro_batches);
}

PipelineExecutor::PipelineExecutor(engine::Engine* engine, const PipelineLinks& links, int stage,
                                   int stages, int micro_batches,
                                   std::vector<PipelineAction> actions)
    : engine_(engine),
      links_(links),
      stage_(stage),
      stages_(stages),
      micro_batches_(micro_batches),
      chunks_(engine->chunks()),
      actions_(std::move(actions)),
      slots_(engine->slots()),
      tokens_per_micro_(size_t(engine->max_batch()) * size_t(engine->max_seq_len())),
      act_elems_(engine->StageIoElements()),
      tokens_(slots_, std::vector<int>(tokens_per_micro_)),
      targets_(slots_, std::vector<int>(tokens_per_micro_)),
      fwd_sends_(slots_),
      bwd_sends_(slots_),
      staged_(engine->math().kind() != DeviceKind::kCpu && !DeviceMemory(links)),
      device_(DeviceMemory(links)) {
  engine::FlatMath& math = engine->math();
  if (links_.act_in != nullptr) {
    if (!device_) {
      input_.resize(act_elems_);
      grad_send_.assign(slots_, std::vector<float>(act_elems_));
    }
    if (staged_ || device_) dev_input_ = math.Allocate(act_elems_);
    for (int s = 0; device_ && s < slots_; ++s) dev_grad_send_.push_back(math.Allocate(act_elems_));
  }
  if (links_.act_out != nullptr) {
    if (!device_) doutput_.resize(act_elems_);
    if (staged_ || device_) dev_doutput_ = math.Allocate(act_elems_);
    if (staged_) out_send_.assign(slots_, std::vector<float>(act_elems_));
  }
}

int PipelineExecutor::SlotOf(const PipelineAction& a) const {
  const int n = std::max(1, std::min(engine_->chunk_slots(a.chunk), micro_batches_));
  return engine_->SlotOf(a.chunk, a.micro % n);
}

comm::Communicator* PipelineExecutor::ReceivesOn(const PipelineAction& a) const {
  if (a.kind == StepKind::kForward) return first(a.chunk) ? nullptr : links_.act_in;
  return last(a.chunk) ? nullptr : links_.grad_in;
}

float* PipelineExecutor::InputBuffer() {
  return device_ ? (dev_input_ ? dev_input_->as<float>() : nullptr) : input_.data();
}

float* PipelineExecutor::DoutputBuffer() {
  return device_ ? (dev_doutput_ ? dev_doutput_->as<float>() : nullptr) : doutput_.data();
}

std::string PipelineExecutor::Where(const PipelineAction& a) const {
  return absl::StrCat("pipeline stage ", stage_, "/", stages_, " ", ActionsToString({a}));
}

const float* PipelineExecutor::ToEngine(std::vector<float>& host, engine::Buffer* device) {
  if (device_) return device->as<float>();  // received there
  if (!staged_) return host.data();
  engine_->math().CopyFromHost(device->as<float>(), host.data(), act_elems_);
  return device->as<float>();
}

absl::Status PipelineExecutor::Order(std::shared_ptr<comm::Work>* work, double* wait_ms) {
  if (!device_ || *work == nullptr) return WaitFor(work, wait_ms);
  absl::Status s = (*work)->BlockStream(engine_->device().compute_stream());
  ordered_.push_back(std::move(*work));
  work->reset();
  return s;
}

const engine::Event* PipelineExecutor::AfterEngine() {
  return device_ ? AfterComputeWork(engine_->device(), &events_) : nullptr;
}

PipelineExecutor::~PipelineExecutor() {
  double ignored = 0;
  DrainSends(&ignored).IgnoreError();
}

absl::Status PipelineExecutor::WaitFor(std::shared_ptr<comm::Work>* work, double* wait_ms) {
  if (*work == nullptr) return absl::OkStatus();
  const Clock::time_point t0 = Clock::now();
  // No timeout here: the op fails by itself after the communicator's.
  absl::Status status = (*work)->Wait();
  *wait_ms += MsSince(t0);
  work->reset();
  return status;
}

absl::Status PipelineExecutor::DrainSends(double* wait_ms) {
  absl::Status first_error;
  for (std::shared_ptr<comm::Work>& w : ordered_) {
    absl::Status s = WaitFor(&w, wait_ms);
    if (!s.ok() && first_error.ok()) {
      first_error = Prefix(s, absl::StrCat("pipeline stage ", stage_, "/", stages_,
                                           ": a transfer ordered on the device"));
    }
  }
  ordered_.clear();
  for (int s = 0; s < slots_; ++s) {
    absl::Status f = WaitFor(&fwd_sends_[s], wait_ms);
    if (!f.ok() && first_error.ok()) {
      first_error = Prefix(f, absl::StrCat("pipeline stage ", stage_, "/", stages_,
                                           ": sending activations to stage ", next_stage()));
    }
    absl::Status b = WaitFor(&bwd_sends_[s], wait_ms);
    if (!b.ok() && first_error.ok()) {
      first_error = Prefix(b, absl::StrCat("pipeline stage ", stage_, "/", stages_,
                                           ": sending gradients to stage ", prev_stage()));
    }
  }
  events_.clear();  // every op that waited for them is done
  // A receive grouped with a send is done with it (or failed: the step is
  // abandoned and the next starts from no posted receive).
  input_recv_.reset();
  doutput_recv_.reset();
  return first_error;
}

std::shared_ptr<comm::Work> PipelineExecutor::Send(comm::Communicator* c, const float* data,
                                                   const PipelineAction* next) {
  const int peer = 1 - c->rank();
  if (next == nullptr || ReceivesOn(*next) != c) {
    return c->SendAsync(data, act_elems_, DataType::kFloat32, peer, kPipeTag, AfterEngine());
  }
  const bool input = next->kind == StepKind::kForward;
  std::shared_ptr<comm::Work> w =
      c->SendRecvAsync(data, act_elems_, peer, input ? InputBuffer() : DoutputBuffer(), act_elems_,
                       peer, DataType::kFloat32, kPipeTag, AfterEngine());
  (input ? input_recv_ : doutput_recv_) = w;
  return w;
}

std::shared_ptr<comm::Work> PipelineExecutor::Receive(comm::Communicator* c, float* data) {
  return c->RecvAsync(data, act_elems_, DataType::kFloat32, 1 - c->rank(), kPipeTag, AfterEngine());
}

absl::Status PipelineExecutor::Forward(const PipelineAction& a, const MicroBatchFn& fill,
                                       float loss_scale, double* loss, double* wait_ms,
                                       const PipelineAction* next) {
  const std::string where = Where(a);
  const int slot = SlotOf(a);
  // Only the pipeline's ends read the micro-batch: the first its tokens,
  // the last its targets.
  int* tokens = first(a.chunk) ? tokens_[slot].data() : nullptr;
  int* targets = last(a.chunk) ? targets_[slot].data() : nullptr;
  if (tokens != nullptr || targets != nullptr) {
    if (absl::Status s = fill(a.micro, tokens_[slot].data(), targets_[slot].data()); !s.ok()) {
      return s;
    }
  }
  if (!first(a.chunk)) {
    // Device mode: into the engine's buffer, once the last forward read it
    // (posted with the last backward's send when that one came first).
    if (input_recv_ == nullptr) input_recv_ = Receive(links_.act_in, InputBuffer());
    if (absl::Status s = Order(&input_recv_, wait_ms); !s.ok()) {
      return Prefix(s, absl::StrCat(where, ": receiving activations from stage ", prev_stage()));
    }
  }
  // StageForward overwrites StageOutput(slot): its previous send must be done.
  if (absl::Status s = Order(&fwd_sends_[slot], wait_ms); !s.ok()) {
    return Prefix(s, absl::StrCat(where, ": sending activations to stage ", next_stage()));
  }
  // A training forward (loss_scale > 0) is backpropagated with the step's
  // scale: the loss's gradient may come with the last stage's forward.
  if (targets != nullptr && loss_scale != 0.0f) engine_->ExpectBackward(loss_scale);
  *loss += engine_->StageForward(slot, tokens, targets,
                                 first(a.chunk) ? nullptr : ToEngine(input_, dev_input_.get()),
                                 engine_->max_batch(), engine_->max_seq_len());
  if (!last(a.chunk)) {
    const float* out = engine_->StageOutput(slot);
    if (out == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(where, ": the engine gives no stage output to send (StageOutput)"));
    }
    if (staged_) {  // the slot's previous send is done (waited for above)
      engine_->math().CopyToHost(out_send_[slot].data(), out, act_elems_);
      out = out_send_[slot].data();
    }
    fwd_sends_[slot] = Send(links_.act_out, out, next);
  }
  return absl::OkStatus();
}

absl::Status PipelineExecutor::Backward(const PipelineAction& a, int pass, const Bracket& before,
                                        const Bracket& after, float loss_scale, double* wait_ms,
                                        const PipelineAction* next) {
  const std::string where = Where(a);
  const int slot = SlotOf(a);
  if (!last(a.chunk)) {
    if (doutput_recv_ == nullptr) doutput_recv_ = Receive(links_.grad_in, DoutputBuffer());
    if (absl::Status s = Order(&doutput_recv_, wait_ms); !s.ok()) {
      return Prefix(s, absl::StrCat(where, ": receiving gradients from stage ", next_stage()));
    }
  }
  if (before) {
    if (absl::Status s = before(pass); !s.ok()) return s;
  }
  engine_->StageBackward(slot, loss_scale,
                         last(a.chunk) ? nullptr : ToEngine(doutput_, dev_doutput_.get()));
  if (!first(a.chunk)) {
    const float* dinput = engine_->InputGrad();
    if (dinput == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(where, ": the engine gives no input gradient to send (InputGrad)"));
    }
    if (absl::Status s = Order(&bwd_sends_[slot], wait_ms); !s.ok()) {
      return Prefix(s, absl::StrCat(where, ": sending gradients to stage ", prev_stage()));
    }
    const float* send = grad_send_.empty() ? nullptr : grad_send_[slot].data();
    if (device_) {
      float* copy = dev_grad_send_[slot]->as<float>();
      engine_->math().Accumulate(copy, dinput, act_elems_, /*add=*/false);
      send = copy;
    } else if (staged_) {
      engine_->math().CopyToHost(grad_send_[slot].data(), dinput, act_elems_);
    } else {
      std::memcpy(grad_send_[slot].data(), dinput, act_elems_ * sizeof(float));
    }
    bwd_sends_[slot] = Send(links_.grad_out, send, next);
  }
  if (after) {
    if (absl::Status s = after(pass); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<PipelineStepResult> PipelineExecutor::RunStep(const MicroBatchFn& fill,
                                                             const Bracket& before_backward,
                                                             const Bracket& after_backward,
                                                             float loss_scale) {
  PipelineStepResult result;
  const Clock::time_point t0 = Clock::now();
  absl::Status status;
  int pass = 0;  // backward actions so far
  for (size_t i = 0; i < actions_.size(); ++i) {
    const PipelineAction& a = actions_[i];
    const PipelineAction* next = i + 1 < actions_.size() ? &actions_[i + 1] : nullptr;
    ActionTiming timing{a.kind, a.micro, MsSince(t0), 0, 0, a.chunk};
    status = a.kind == StepKind::kForward
                 ? Forward(a, fill, loss_scale, &result.loss_sum, &timing.wait_ms, next)
                 : Backward(a, pass++, before_backward, after_backward, loss_scale, &timing.wait_ms,
                            next);
    timing.end_ms = MsSince(t0);
    result.actions.push_back(timing);
    if (!status.ok()) break;
  }
  double drain_ms = 0;
  absl::Status drained = DrainSends(&drain_ms);  // also after an error: buffers stay ours
  if (!status.ok()) return status;
  if (!drained.ok()) return drained;
  result.step_ms = MsSince(t0);
  for (const ActionTiming& t : result.actions) {
    result.compute_ms += t.end_ms - t.start_ms - t.wait_ms;
  }
  result.idle_fraction = result.step_ms > 0 ? 1.0 - result.compute_ms / result.step_ms : 0;
  return result;
}

absl::StatusOr<double> PipelineExecutor::RunForwardOnly(int micro_batches,
                                                        const MicroBatchFn& fill) {
  double loss = 0, wait_ms = 0;
  absl::Status status;
  // Each micro-batch through every chunk in turn, in each chunk's slot 0.
  for (int m = 0; m < micro_batches && status.ok(); ++m) {
    for (int c = 0; c < chunks_ && status.ok(); ++c) {
      status = Forward(PipelineAction{StepKind::kForward, m, c}, fill, /*loss_scale=*/0.0f, &loss,
                       &wait_ms, /*next=*/nullptr);
    }
  }
  absl::Status drained = DrainSends(&wait_ms);
  if (!status.ok()) return status;
  if (!drained.ok()) return drained;
  return loss;
}

}  // namespace shardtrain::parallel
