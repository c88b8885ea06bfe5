// Zero's lifecycle and the micro-batches' side: the engine hooks, the
// gathers of parameters and the reductions of gradients per unit (the step,
// checkpoint state and accounting are in zero_step.cc).
#include "worker/parallel/zero.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/optim/quant8.h"

namespace shardtrain::parallel {
namespace {

constexpr int64_t kF32 = sizeof(float);

}  // namespace

absl::StatusOr<std::unique_ptr<Zero>> Zero::Create(const ZeroOptions& options,
                                                   engine::Engine* engine,
                                                   const optim::AdamWOptions& adamw,
                                                   comm::Communicator* comm) {
  if (options.stage < 1 || options.stage > 3) {
    return absl::InvalidArgumentError(absl::StrCat("parallel.zero: ", options.stage,
                                                   " — Zero handles stages 1..3 (0 is plain DDP)"));
  }
  if (engine == nullptr) return absl::InvalidArgumentError("Zero: null engine");
  if (engine->params().dtype != DataType::kFloat32 || engine->grads().dtype != DataType::kFloat32) {
    return absl::UnimplementedError(absl::StrCat(
        "ZeRO keeps fp32 parameters and gradients; this engine's are ",
        DataTypeName(engine->params().dtype), " and ", DataTypeName(engine->grads().dtype)));
  }
  // A communicator of device memory (NCCL) reduces and gathers the
  // engine's buffers where they are, and the shard steps there.
  const bool on_device = comm != nullptr && comm->size() > 1 && comm->device_memory();
  if (on_device && (options.offload_optimizer || options.stage_through_host ||
                    engine->grads().device == DeviceKind::kCpu)) {
    return absl::UnimplementedError(absl::StrCat(
        "parallel.comm: nccl runs ZeRO with the optimizer on the device (this job has zero ",
        options.stage, options.offload_optimizer ? ", offload: optimizer" : "",
        "); use parallel.comm: gloo"));
  }
  const bool staged =
      !on_device && (options.stage_through_host || engine->params().device != DeviceKind::kCpu ||
                     engine->grads().device != DeviceKind::kCpu);
  std::unique_ptr<Zero> z(new Zero(options, engine, comm, staged));
  z->on_device_ = on_device;
  const model::ParamLayout& layout = engine->layout();
  if (staged) {
    z->host_params_.assign(layout.num_params(), 0.0f);
    z->host_grads_.assign(layout.num_params(), 0.0f);
    z->params_ = z->host_params_.data();
    z->grads_ = z->host_grads_.data();
    for (std::vector<float>* v : {&z->host_params_, &z->host_grads_}) {
      z->pins_.push_back(engine->device().PinHost(v->data(), v->size() * sizeof(float)));
    }
  } else {
    z->params_ = engine->param_buffer().as<float>();
    z->grads_ = engine->grad_buffer().as<float>();
  }
  const FlatRanges experts = options.split_experts ? layout.ExpertRanges() : FlatRanges{};
  comm::Communicator* const expert_comm =
      options.expert_comm != nullptr && options.expert_comm->size() > 1 ? options.expert_comm
                                                                        : nullptr;
  for (const model::UnitInfo& info : layout.units()) {
    Unit u;
    u.offset = info.offset;
    u.numel = info.numel;
    const size_t end = info.offset + info.numel;
    // The experts close their block: [split, end) of the unit, if any.
    size_t split = end, expert_elems = 0;
    for (const auto& [b, e] : experts) {
      if (b < info.offset || b >= end) continue;
      split = std::min(split, b);
      expert_elems += e - b;
    }
    if (split < end && expert_elems != end - split) {
      return absl::InternalError(
          absl::StrCat("Zero: the experts of the unit at ", info.offset, " do not close it"));
    }
    auto add = [&](size_t offset, size_t numel, comm::Communicator* c) -> absl::Status {
      if (numel == 0) return absl::OkStatus();
      Part p;
      p.offset = offset;
      p.numel = numel;
      p.comm = c;
      p.dp = c == nullptr ? 1 : c->size();
      p.rank = c == nullptr ? 0 : c->rank();
      // 8-bit AdamW state: every shard but the last holds whole blocks of
      // the part's block grid (AdamWOptions::int8_state).
      const size_t align = adamw.int8_state ? optim::kQuant8BlockSize : 1;
      p.own = UnitShardRange(numel, p.dp, p.rank, align);
      p.body = UnitShardRange(numel, p.dp, 0, align).size();
      p.shard_offset = z->shard_size_;
      z->shard_size_ += p.own.size();
      p.adamw = z->adamw_.size();
      auto a = optim::AdamW::Create(layout, p.begin(), p.own.size(), adamw,
                                    on_device ? &engine->math() : nullptr);
      if (!a.ok()) return a.status();
      z->adamw_.push_back(*std::move(a));
      u.parts.push_back(p);
      return absl::OkStatus();
    };
    if (absl::Status s = add(info.offset, split - info.offset, z->comm_); !s.ok()) return s;
    if (absl::Status s = add(split, end - split, expert_comm); !s.ok()) return s;
    z->units_.push_back(std::move(u));
  }
  // Uses of one micro-batch, in the order the engine calls the param hook.
  const int emb = layout.tensors()[layout.wte()].unit;
  z->emb_unit_ = layout.config().tie_embeddings ? emb : -1;
  const int fin = layout.tensors()[layout.lnf_w()].unit;
  std::vector<int> blocks;
  for (int l = 0; l < layout.config().layers; ++l) {
    blocks.push_back(layout.tensors()[layout.block_tensor(l, model::BlockTensor(0))].unit);
  }
  z->uses_ = UnitUseOrder(emb, blocks, fin, layout.config().tie_embeddings, &z->forward_uses_);

  // Units are gathered and released one by one: no huge page may straddle
  // two of them, or releasing one would leave part of a neighbour's page
  // resident (and gathering one would commit part of a released neighbour).
  for (const Unit& u : z->units_) {
    engine->param_buffer().SetReleaseBoundary(u.offset);
    engine->grad_buffer().SetReleaseBoundary(u.offset);
  }
  if (options.stage >= 2) {
    if (on_device) {
      z->device_shard_grads_ = engine->math().Allocate(z->shard_size_);
    } else {
      z->shard_grads_.assign(z->shard_size_, 0.0f);
    }
    engine->grad_buffer().ReleaseAll();
  }
  if (options.stage == 3) {
    if (on_device) {
      z->device_shard_params_ = engine->math().Allocate(z->shard_size_);
    } else {
      z->shard_params_.assign(z->shard_size_, 0.0f);
    }
    engine->param_buffer().ReleaseAll();
  } else {
    z->live_param_elems_ = z->peak_live_param_elems_ = layout.num_params();
  }
  return z;
}

Zero::Zero(const ZeroOptions& options, engine::Engine* engine, comm::Communicator* comm,
           bool staged)
    : options_(options),
      engine_(engine),
      comm_(comm != nullptr && comm->size() > 1 ? comm : nullptr),
      dp_(comm_ == nullptr ? 1 : comm_->size()),
      rank_(comm_ == nullptr ? 0 : comm_->rank()),
      staged_(staged),
      host_math_(engine->host_pool()) {}

void Zero::PushParams(size_t offset, size_t n) {
  if (!staged_ || n == 0) return;
  engine_->param_buffer().Acquire(offset, n);
  engine_->math().CopyFromHost(engine_->param_buffer().as<float>() + offset, params_ + offset, n);
}

void Zero::AcquireGrads(int unit) {
  if (!(staged_ || on_device_) || options_.stage < 2 || unit < 0) return;
  engine_->grad_buffer().Acquire(units_[unit].offset, units_[unit].numel);
}

void Zero::PullGrads(size_t offset, size_t n) {
  if (!staged_ || n == 0) return;
  engine_->math().CopyToHost(grads_ + offset, engine_->grad_buffer().as<float>() + offset, n);
}

Zero::~Zero() {
  // Never leave an op writing into buffers that are about to be freed.
  for (Unit& u : units_) Wait(u.gather);
  for (Reduction& r : reductions_) Wait(r.works);
  engine_->set_param_hook(nullptr);
  engine_->set_grads_ready_hook(nullptr);
}

void Zero::Keep(absl::Status s) {
  if (!s.ok() && status_.ok()) status_ = std::move(s);
}

void Zero::Wait(std::vector<std::shared_ptr<comm::Work>>& works) {
  for (auto& w : works) {
    if (w != nullptr) Keep(w->Wait());
  }
  works.clear();
}

std::shared_ptr<comm::Work> Zero::Count(std::shared_ptr<comm::Work> w, int64_t bytes) {
  comm_bytes_ += bytes;
  return w;
}

int64_t Zero::TakeCommBytes() { return std::exchange(comm_bytes_, 0); }

void Zero::InitParams(uint64_t seed) {
  if (options_.stage < 3) {
    engine_->InitParams(seed);
    if (staged_) {
      engine_->math().CopyToHost(params_, engine_->param_buffer().as<float>(),
                                 engine_->layout().num_params());
    }
    return;
  }
  for (const Unit& u : units_) {
    for (const Part& p : u.parts) InitShardParams(seed, p);
  }
}

void Zero::InitShardParams(uint64_t seed, const Part& p) {
  const size_t begin = p.begin(), n = p.own.size();
  float* shard = ShardParamPtr(p);
  if (!staged_) {  // into the shard, wherever it lives
    engine_->InitParamsInto(seed, begin, begin + n, shard);
    return;
  }
  // InitParamsInto writes the engine's memory: through the (released)
  // range the shard comes from, which is released again after.
  float* through = engine_->param_buffer().as<float>() + begin;
  engine_->param_buffer().Acquire(begin, n);
  engine_->InitParamsInto(seed, begin, begin + n, through);
  engine_->math().CopyToHost(shard, through, n);
  engine_->param_buffer().Release(begin, n);
}

absl::Status Zero::GatherWholeModel() {
  if (options_.stage < 3) return status_;
  for (Unit& u : units_) {
    if (u.state == Unit::State::kReleased) Gather(u);
  }
  for (Unit& u : units_) WaitGathered(u);
  return status_;
}

void Zero::BeginMicroBatch(int micro, int accum) {
  // Stage 1 accumulates into the whole gradient buffer; 2-3 leave it zero.
  if (micro == 0 && options_.stage == 1) engine_->ZeroGrad();
  micro_ = micro;
  cursor_ = 0;
  unhandled_units_ = static_cast<int>(units_.size());
  for (Unit& u : units_) {  // after GatherWholeModel
    if (options_.stage == 3 && u.state != Unit::State::kReleased) ReleaseParams(u);
  }
  if (options_.stage >= 2 && accum > 1 && comm_ != nullptr && !has_reduce_scratch()) {
    if (on_device_) {
      device_reduce_scratch_ = engine_->math().Allocate(shard_size_);
    } else {
      reduce_scratch_.assign(shard_size_, 0.0f);
    }
  }
  if (options_.stage == 3) {
    engine_->set_param_hook([this](int unit, bool begin) { OnParamUse(unit, begin); });
  }
  // Staged, stages 2-3 hold a unit's device gradients only from just before
  // its backward writes them until they are copied out (OnGradsReady); on
  // the device, until their reduction completed (CompleteReduction): the
  // first two written are the embeddings' (the LM head's, also the encoder's
  // at the end) and the last unit's; each next one is taken when the one
  // after it is done.
  AcquireGrads(0);
  AcquireGrads(static_cast<int>(units_.size()) - 1);
  // Stage 1 accumulates locally and reduces during the last backward only.
  // Staged, the last backward also copies the gradients to the host mirror.
  if (options_.stage >= 2 || (micro == accum - 1 && (comm_ != nullptr || staged_))) {
    engine_->set_grads_ready_hook([this](size_t offset) { OnGradsReady(offset); });
  }
}

absl::Status Zero::EndMicroBatch() {
  engine_->set_param_hook(nullptr);
  engine_->set_grads_ready_hook(nullptr);
  while (!reductions_.empty()) {
    CompleteReduction(reductions_.front());
    reductions_.pop_front();
  }
  if (options_.stage == 3) {  // a pass cut short (an aborted forward) leaves units gathered
    for (Unit& u : units_) {
      if (u.state != Unit::State::kReleased) ReleaseParams(u);
    }
  }
  return status_;
}

void Zero::BeginEval() {
  eval_ = true;
  cursor_ = 0;
  comm_bytes_eval_ = comm_bytes_;
  if (options_.stage < 3) return;
  for (Unit& u : units_) {  // after GatherWholeModel
    if (u.state != Unit::State::kReleased) ReleaseParams(u);
  }
  engine_->set_param_hook([this](int unit, bool begin) { OnParamUse(unit, begin); });
}

absl::StatusOr<double> Zero::EndEval(double loss_sum) {
  engine_->set_param_hook(nullptr);
  for (Unit& u : units_) {
    if (options_.stage == 3 && u.state != Unit::State::kReleased) ReleaseParams(u);
  }
  eval_ = false;
  cursor_ = 0;
  if (!status_.ok()) return status_;
  absl::StatusOr<double> total = SumOverRanks(loss_sum);
  comm_bytes_ = comm_bytes_eval_;
  return total;
}

void Zero::OnParamUse(int unit, bool begin) {
  // Evaluation repeats the forward part of the use order, pass after pass.
  const size_t uses = eval_ ? forward_uses_ : uses_.size();
  if (cursor_ >= uses || uses_[cursor_] != unit) {
    std::fprintf(stderr, "Zero: unit %d used out of the expected order (use %zu%s)\n", unit,
                 cursor_, eval_ ? " of a forward-only pass" : "");
    std::abort();
  }
  Unit& u = units_[unit];
  const size_t after = eval_ && cursor_ + 1 == uses ? 0 : cursor_ + 1;
  const int next = after < uses ? uses_[after] : -1;
  if (begin) {
    if (u.state == Unit::State::kReleased) Gather(u);
    WaitGathered(u);
    // Prefetch: the next use's all-gather runs while this unit computes.
    if (next >= 0 && units_[next].state == Unit::State::kReleased) Gather(units_[next]);
    return;
  }
  if (measure_) {
    // The two-unit peak: this unit and the prefetched next one, once it has
    // landed (waited for here, not at the next use, only when measuring: a
    // busy comm thread would otherwise leave its pages unwritten yet).
    if (next >= 0) WaitGathered(units_[next]);
    Sample();
  }
  const bool keep =
      next == unit || (!eval_ && !options_.reshard_after_forward && cursor_ < forward_uses_);
  if (!keep) ReleaseParams(u);
  cursor_ = after;
}

void Zero::Gather(Unit& u) {
  u.state = Unit::State::kGathering;
  live_param_elems_ += u.numel;
  peak_live_param_elems_ = std::max(peak_live_param_elems_, live_param_elems_);
  if (comm_ == nullptr) {
    std::memcpy(params_ + u.offset, ShardParamPtr(u.parts[0]), u.numel * sizeof(float));
    WaitGathered(u);  // nothing in flight: staged, the copy to the engine
    return;
  }
  // On the device the unit's memory is taken again first (zero-filled on
  // the compute stream), a part this rank alone holds and the last rank's
  // tail of the others copied in place there; the ops wait for both.
  if (on_device_) engine_->param_buffer().Acquire(u.offset, u.numel);
  for (const Part& p : u.parts) {
    float* out = params_ + p.offset;
    const float* mine = ShardParamPtr(p);
    const size_t body = p.body * p.dp, tail = p.numel - body;
    if (p.comm == nullptr) {
      ShardMath().Accumulate(out, mine, p.numel, false);
    } else if (tail > 0 && p.rank == p.dp - 1) {
      ShardMath().Accumulate(out + body, mine + p.body, tail, false);
    }
  }
  const engine::Event* after = AfterDeviceWork();
  for (const Part& p : u.parts) {
    if (p.comm == nullptr) continue;
    float* out = params_ + p.offset;
    const size_t body = p.body * p.dp, tail = p.numel - body;
    if (p.body > 0) {
      u.gather.push_back(Count(
          p.comm->AllGatherAsync(ShardParamPtr(p), out, p.body, comm::DataType::kFloat32, after),
          (p.dp - 1) * int64_t(p.body) * kF32));
    }
    if (tail > 0) {
      u.gather.push_back(
          Count(p.comm->BroadcastAsync(out + body, tail, comm::DataType::kFloat32, p.dp - 1, after),
                (p.dp - 1) * int64_t(tail) * kF32 / p.dp));
    }
  }
  if (u.gather.empty()) WaitGathered(u);
}

void Zero::WaitGathered(Unit& u) {
  if (u.state != Unit::State::kGathering) return;
  Wait(u.gather);
  PushParams(u.offset, u.numel);
  u.state = Unit::State::kGathered;
}

void Zero::ReleaseParams(Unit& u) {
  WaitGathered(u);  // never free memory an op is still writing
  engine_->param_buffer().Release(u.offset, u.numel);
  u.state = Unit::State::kReleased;
  live_param_elems_ -= u.numel;
}

void Zero::OnGradsReady(size_t offset) {
  const auto it = std::lower_bound(units_.begin(), units_.end(), offset,
                                   [](const Unit& u, size_t off) { return u.offset < off; });
  if (it == units_.end() || it->offset != offset) {
    std::fprintf(stderr, "Zero: gradients ready at %zu, not a unit boundary\n", offset);
    std::abort();
  }
  const int unit = static_cast<int>(it - units_.begin());
  while (unhandled_units_ > unit) UnitGradsReady(--unhandled_units_);
}

void Zero::UnitGradsReady(int unit) {
  const Unit& u = units_[unit];
  if (options_.stage >= 2) {
    // Alive now: this unit's gradient, those still being reduced, and a
    // tied head's embeddings' (written since the LM head's backward).
    size_t alive = u.numel + (emb_unit_ >= 0 && unit != emb_unit_ ? units_[emb_unit_].numel : 0);
    for (const Reduction& r : reductions_) alive += units_[r.unit].numel;
    peak_live_grad_elems_ = std::max(peak_live_grad_elems_, alive);
  }
  PullGrads(u.offset, u.numel);
  if (staged_ && options_.stage >= 2) {
    // Reduced from the host copy: the device's can go (zeroed) at once.
    engine_->grad_buffer().Release(u.offset, u.numel);
  }
  AcquireGrads(unit - 1);  // the next one backward writes
  Sample();
  LaunchReduction(unit);
  // Finish (and release the gradients of) reductions already done, in order.
  while (options_.stage >= 2 && !reductions_.empty()) {
    Reduction& r = reductions_.front();
    if (!std::all_of(r.works.begin(), r.works.end(), [](const auto& w) { return w->Done(); })) {
      break;
    }
    CompleteReduction(r);
    reductions_.pop_front();
  }
}

void Zero::LaunchReduction(int unit) {
  Unit& u = units_[unit];
  Reduction r{unit, {}};
  const engine::Event* after =
      comm_ != nullptr ? AfterDeviceWork() : nullptr;  // the backward wrote g
  for (const Part& p : u.parts) {
    if (p.comm == nullptr) continue;
    float* g = grads_ + p.offset;
    const size_t body = p.body * p.dp, tail = p.numel - body;
    if (options_.stage == 1) {
      r.works.push_back(Count(
          p.comm->AllReduceAsync(g, p.numel, comm::DataType::kFloat32, comm::ReduceOp::kSum, after),
          2 * (p.dp - 1) * int64_t(p.numel) * kF32 / p.dp));
      continue;
    }
    if (p.body > 0) {
      float* out = (micro_ == 0 ? ShardGrads() : ReduceScratch()) + p.shard_offset;
      r.works.push_back(Count(p.comm->ReduceScatterAsync(g, out, p.body, comm::DataType::kFloat32,
                                                         comm::ReduceOp::kSum, after),
                              (p.dp - 1) * int64_t(p.body) * kF32));
    }
    if (tail > 0) {
      r.works.push_back(Count(p.comm->AllReduceAsync(g + body, tail, comm::DataType::kFloat32,
                                                     comm::ReduceOp::kSum, after),
                              2 * (p.dp - 1) * int64_t(tail) * kF32 / p.dp));
    }
  }
  reductions_.push_back(std::move(r));
}

void Zero::CompleteReduction(Reduction& r) {
  Wait(r.works);
  if (options_.stage == 1) return;  // the all-reduced gradient stays in place
  Unit& u = units_[r.unit];
  const bool add = micro_ > 0;
  engine::FlatMath& math = ShardMath();
  for (const Part& p : u.parts) {
    const float* g = grads_ + p.offset;
    float* dst = ShardGrads() + p.shard_offset;
    if (p.comm == nullptr) {
      math.Accumulate(dst, g, p.numel, add);
      continue;
    }
    if (add) math.Accumulate(dst, ReduceScratch() + p.shard_offset, p.body, true);
    const size_t body = p.body * p.dp, tail = p.numel - body;
    if (tail > 0 && p.rank == p.dp - 1) math.Accumulate(dst + p.body, g + body, tail, add);
  }
  // The unit's full gradient is no longer needed: zero it for the next
  // backward and give its pages back (staged: done when it was copied out).
  if (!staged_) engine_->grad_buffer().Release(u.offset, u.numel);
}

const engine::Event* Zero::AfterDeviceWork() {
  return on_device_ ? AfterComputeWork(engine_->device(), &events_) : nullptr;
}

void Zero::Sample() {
  if (!measure_) return;
  if (options_.stage == 3) {
    peak_gathered_bytes_ = std::max(peak_gathered_bytes_, engine_->param_buffer().ResidentBytes());
  }
  if (options_.stage >= 2) {
    peak_unit_grad_bytes_ = std::max(peak_unit_grad_bytes_, engine_->grad_buffer().ResidentBytes());
  }
}

}  // namespace shardtrain::parallel
