#include "worker/parallel/ddp.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/checkpoint/shard_file.h"

namespace shardtrain::parallel {
namespace {

double MsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

// The offloaded step's unit of overlap: pieces of 8 Mi elements (32 MiB),
// each stepped on the host while others are copied.
constexpr size_t kPiece = size_t{8} << 20;

int GroupSize(const comm::Communicator* comm) { return comm == nullptr ? 1 : comm->size(); }
int GroupRank(const comm::Communicator* comm) { return comm == nullptr ? 0 : comm->rank(); }

}  // namespace

absl::StatusOr<std::unique_ptr<Ddp>> Ddp::Create(engine::Engine* engine,
                                                 const optim::AdamWOptions& adamw,
                                                 comm::Communicator* comm, size_t bucket_bytes,
                                                 bool stage_through_host, bool offload_optimizer,
                                                 bool reduce_bf16) {
  if (engine == nullptr) return absl::InvalidArgumentError("Ddp: null engine");
  // Each rank steps wherever the engine keeps its fp32 master (the host or
  // a GPU, through the engine's FlatMath); across ranks, gradients off the
  // host are all-reduced through a host copy.
  if (engine->params().dtype != DataType::kFloat32) {
    return absl::InvalidArgumentError("DDP: the engine's parameters are not its fp32 master");
  }
  // The optimizer offloaded from a GPU steps a host copy of the master.
  const bool host_master =
      offload_optimizer && (stage_through_host || engine->params().device != DeviceKind::kCpu);
  // A communicator of device memory (NCCL) all-reduces the engine's
  // gradient buffer where it is (an offloaded optimizer then copies the
  // reduced gradient out, as with one rank); Gloo reaches a GPU's through
  // host copies, reduced on the host.
  const bool device_comm = GroupSize(comm) > 1 && comm->device_memory();
  if (device_comm && (stage_through_host || engine->grads().device == DeviceKind::kCpu)) {
    return absl::InvalidArgumentError(
        "DDP: a device-memory communicator (parallel.comm: nccl) needs the gradients on the "
        "device");
  }
  if (reduce_bf16 && GroupSize(comm) > 1 && !device_comm) {
    return absl::InvalidArgumentError(
        "parallel.reduce_dtype: bf16 all-reduces in device memory (parallel.comm: nccl); this "
        "communicator takes host memory");
  }
  const bool staged =
      GroupSize(comm) > 1 && !device_comm &&
      (host_master || stage_through_host || engine->grads().device != DeviceKind::kCpu);
  if (bucket_bytes == 0) return absl::InvalidArgumentError("parallel.bucket_mb: must be >= 1");
  auto a = optim::AdamW::Create(engine->layout(), 0, engine->layout().num_params(), adamw,
                                host_master ? nullptr : &engine->math());
  if (!a.ok()) return a.status();
  const size_t bucket_elems = std::max<size_t>(1, bucket_bytes / sizeof(float));
  return std::unique_ptr<Ddp>(new Ddp(engine, *std::move(a), GroupSize(comm) > 1 ? comm : nullptr,
                                      bucket_elems, staged, offload_optimizer, host_master,
                                      reduce_bf16 && device_comm));
}

Ddp::Ddp(engine::Engine* engine, optim::AdamW adamw, comm::Communicator* comm, size_t bucket_elems,
         bool staged, bool offload, bool host_master, bool reduce_bf16)
    : engine_(engine),
      adamw_(std::move(adamw)),
      comm_(comm),
      bucket_elems_(bucket_elems),
      staged_(staged),
      offload_(offload),
      host_master_(host_master),
      host_math_(engine->host_pool()) {
  if (staged_ || host_master_) host_grads_.resize(engine_->grads().count);
  if (host_master_) host_params_.resize(engine_->params().count);
  for (std::vector<float>* v : {&host_grads_, &host_params_}) {
    if (!v->empty())
      pins_.push_back(engine_->device().PinHost(v->data(), v->size() * sizeof(float)));
  }
  if (host_master_ && comm_ == nullptr) {
    absl::StatusOr<std::unique_ptr<engine::Stream>> s = engine_->device().NewStream();
    if (s.ok()) copy_stream_ = *std::move(s);
  }
  if (reduce_bf16) {  // n 16-bit values in (n + 1) / 2 floats
    bf16_grads_ = engine_->math().Allocate((engine_->grads().count + 1) / 2);
  }
}

bool Ddp::CopiesEarly() const {
  return copy_stream_ != nullptr && !(mp_.sum_tied && mp_.tied_end > 0) && !mp_.has_tp_partials();
}

void Ddp::LaunchCopy(size_t offset) {
  if (offset >= uncopied_end_) return;
  engine::Device& device = engine_->device();
  const engine::Event* after = AfterComputeWork(device, &copy_after_);
  if (after != nullptr && !copy_stream_->WaitEvent(*after).ok()) {
    device.compute_stream().Synchronize().IgnoreError();  // order it on the host
  }
  const size_t n = uncopied_end_ - offset;
  engine_->math().CopyToHostAsyncOn(*copy_stream_, host_grads_.data() + offset,
                                    static_cast<const float*>(engine_->grads().data) + offset, n);
  Arrival a;
  a.begin = offset;
  a.end = uncopied_end_;
  absl::StatusOr<std::unique_ptr<engine::Event>> e = device.NewEvent();
  if (e.ok() && (*e)->Record(*copy_stream_).ok()) {
    a.done = *std::move(e);
  } else {
    copy_stream_->Synchronize().IgnoreError();  // arrived by now
  }
  arrivals_.push_back(std::move(a));
  uncopied_end_ = offset;
}

void Ddp::DrainCopies() {
  if (copy_stream_ != nullptr) copy_stream_->Synchronize().IgnoreError();
  arrivals_.clear();
  copy_after_.clear();
  copying_ = false;
}

void Ddp::InitParams(uint64_t seed) {
  engine_->InitParams(seed);
  if (host_master_) {
    engine_->math().CopyToHost(host_params_.data(),
                               static_cast<const float*>(engine_->params().data),
                               host_params_.size());
  }
}

float* Ddp::BucketBase() {
  return staged_ ? host_grads_.data() : static_cast<float*>(engine_->grads().data);
}

Ddp::~Ddp() {
  // Never leave an all-reduce or a copy writing into a buffer that is about
  // to go.
  for (auto& w : inflight_) w->Wait().IgnoreError();
  DrainCopies();
  engine_->set_grads_ready_hook(nullptr);
}

void Ddp::BeginMicroBatch(int micro, int accum) {
  // Copies left by a step that failed must not read what is zeroed next.
  if (copying_) DrainCopies();
  if (micro == 0) engine_->ZeroGrad();
  // Gradient accumulation: no communication until the last micro-batch,
  // whose backward launches the buckets as they become final (staged: each
  // copied to the host first).
  if (comm_ != nullptr && micro == accum - 1) {
    unlaunched_end_ = engine_->grads().count;
    engine_->set_grads_ready_hook([this](size_t offset) { LaunchBuckets(offset, false); });
  }
  if (micro == accum - 1 && CopiesEarly()) {
    copying_ = true;
    uncopied_end_ = engine_->grads().count;
    engine_->set_grads_ready_hook([this](size_t offset) { LaunchCopy(offset); });
  }
}

absl::Status Ddp::EndMicroBatch() {
  engine_->set_grads_ready_hook(nullptr);
  return absl::OkStatus();
}

void Ddp::LaunchBuckets(size_t offset, bool flush) {
  float* grads = BucketBase();
  const float* device = static_cast<const float*>(engine_->grads().data);
  while (unlaunched_end_ > offset && (flush || unlaunched_end_ - offset >= bucket_elems_)) {
    const size_t n = std::min(bucket_elems_, unlaunched_end_ - offset);
    unlaunched_end_ -= n;
    if (staged_) {  // final on the device: its host copy is reduced
      engine_->math().CopyToHost(grads + unlaunched_end_, device + unlaunched_end_, n);
    }
    // bf16: the bucket's 16-bit copy is reduced (converted on the device
    // first, queued before the event below).
    void* data = grads + unlaunched_end_;
    comm::DataType dtype = comm::DataType::kFloat32;
    if (bf16_grads_ != nullptr) {
      engine_->math().ToBFloat16(Bf16Grads() + unlaunched_end_, device + unlaunched_end_, n);
      data = Bf16Grads() + unlaunched_end_;
      dtype = comm::DataType::kBFloat16;
    }
    // On the device (NCCL), the all-reduce waits on the device for the
    // backward kernels issued so far, which wrote this bucket: never the host.
    const engine::Event* after =
        comm_->device_memory() ? AfterComputeWork(engine_->device(), &bucket_events_) : nullptr;
    if (mp_.expert.empty()) {
      inflight_.push_back(comm_->AllReduceAsync(data, n, dtype, comm::ReduceOp::kSum, after));
      continue;
    }
    // Expert parallelism: the experts' gradients are summed in Step over
    // the ranks that hold the same experts, not here.
    const size_t esz = dtype == comm::DataType::kFloat32 ? 4 : 2;
    ForEachOutside(unlaunched_end_, unlaunched_end_ + n, mp_.expert, [&](size_t b, size_t e) {
      void* part = static_cast<char*>(data) + (b - unlaunched_end_) * esz;
      inflight_.push_back(comm_->AllReduceAsync(part, e - b, dtype, comm::ReduceOp::kSum, after));
    });
  }
}

absl::Status Ddp::FinishAllReduce(StepStats* stats) {
  LaunchBuckets(0, /*flush=*/true);
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status status;
  for (auto& w : inflight_) {
    if (absl::Status s = w->Wait(); !s.ok() && status.ok()) status = s;
  }
  stats->comm_ms += MsSince(t0);
  if (!status.ok()) {
    inflight_.clear();
    bucket_events_.clear();
    return status;
  }
  const uint64_t first = inflight_.front()->seq(), last = inflight_.back()->seq();
  for (const comm::FlightRecord& f : comm_->flight_recorder().Dump()) {
    if (f.seq >= first && f.seq <= last && f.state == comm::OpState::kDone) {
      stats->collective_ms += absl::ToDoubleMilliseconds(f.end_time - f.start_time);
    }
  }
  inflight_.clear();
  bucket_events_.clear();
  const engine::FlatView grads = engine_->grads();
  const int n = comm_->size();
  const int64_t reduced =
      bf16_grads_ != nullptr ? int64_t(grads.count) * 2 : int64_t(grads.bytes());
  stats->comm_bytes += reduced * 2 * (n - 1) / n;
  // Summed over dp; the mean gradient of the global batch is sum / dp.
  if (host_master_ && staged_) {  // the optimizer reads them where they are
    host_math_.Scale(host_grads_.data(), host_grads_.size(), 1.0f / n);
    return absl::OkStatus();
  }
  if (staged_) {
    engine_->math().CopyFromHost(static_cast<float*>(grads.data), host_grads_.data(), grads.count);
  }
  if (bf16_grads_ != nullptr) {  // the sum back into the fp32 gradient
    engine_->math().FromBFloat16(static_cast<float*>(grads.data), Bf16Grads(), grads.count);
  }
  engine_->math().Scale(static_cast<float*>(grads.data), grads.count, 1.0f / n);
  return absl::OkStatus();
}

absl::StatusOr<StepStats> Ddp::Step(float lr, float max_norm, float loss_scale) {
  StepStats stats;
  const engine::FlatView g = engine_->grads();
  if (comm_ != nullptr) {
    if (absl::Status s = FinishAllReduce(&stats); !s.ok()) return s;
  }
  if (copying_) LaunchCopy(0);  // whatever the backward did not report
  // Where the gradient is made final (tied and tp sums, norm, clipping): on
  // the host when the all-reduce left it there for an offloaded optimizer,
  // otherwise in the engine's memory (a GPU's: its passes take a fraction of
  // a host pass), copied to the host afterwards for an offloaded optimizer.
  const bool on_host = host_master_ && staged_;
  engine::FlatMath& math = on_host ? host_math_ : engine_->math();
  float* grads = on_host ? host_grads_.data() : static_cast<float*>(g.data);
  // Tied embeddings and tp partials are summed where their groups take them
  // (the host for Gloo, the device for NCCL), through a copy if elsewhere.
  if (mp_.sum_tied && mp_.tied_end > 0) {
    if (absl::Status s = SumInPlace(mp_, *engine_, !on_host, grads, mp_.tied_end, mp_.sum_tied);
        !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = SumTpPartials(mp_, *engine_, !on_host, grads, g.count, 0); !s.ok()) {
    return s;
  }
  if (!mp_.expert.empty()) {
    // The experts' gradients, summed over the ranks holding the same ones
    // (averaged with the rest above: every replica's tokens reached them).
    for (const auto& [b, e] : mp_.expert) {
      if (!mp_.sum_expert) break;
      if (absl::Status s = SumInPlace(mp_, *engine_, !on_host, grads + b, e - b, mp_.sum_expert);
          !s.ok()) {
        return s;
      }
    }
  }
  double squared = SquaredNormOutside(math, grads, g.count, 0, mp_.norm_skip);
  if (!mp_.expert.empty() && mp_.sum_expert_squares) {
    // Each rank of the ep group holds other experts: their squares summed.
    double experts = 0;
    for (const auto& [b, e] : mp_.expert) {
      experts += SquaredNormOutside(math, grads + b, e - b, b, mp_.norm_skip);
    }
    absl::StatusOr<double> all = mp_.sum_expert_squares(experts);
    if (!all.ok()) return all.status();
    squared += *all - experts;
  }
  if (mp_.sum_squares) {
    absl::StatusOr<double> total = mp_.sum_squares(squared);
    if (!total.ok()) return total.status();
    squared = *total;
  }
  // The gradients carry the loss scale (fp16): the norm without it decides
  // clipping; a non-finite one skips the step (DynamicLossScaling).
  const float norm = static_cast<float>(std::sqrt(squared) / loss_scale);
  stats.grad_norm = norm;
  if (!std::isfinite(norm)) {
    DrainCopies();  // the next micro-batch zeroes what they read
    stats.skipped = true;
    return stats;
  }
  const float scale = optim::ClipScale(norm, max_norm) / loss_scale;
  if (copying_) {
    if (absl::Status s = StepCopiedOut(lr, scale); !s.ok()) return s;
    return stats;
  }
  if (!host_master_) {  // the clip factor in AdamW's own pass
    adamw_.Step(static_cast<float*>(engine_->params().data), grads, lr, /*zero_grads=*/false,
                scale);
    return stats;
  }
  if (scale != 1.0f) math.Scale(grads, g.count, scale);
  if (absl::Status s = StepOnHost(on_host ? nullptr : grads, lr); !s.ok()) return s;
  return stats;
}

absl::Status Ddp::StepOnHost(const float* device_grads, float lr) {
  // Pieces of kPiece: every gradient piece's copy out is queued at once,
  // each marked by an event; AdamW steps piece k on the host's threads as
  // soon as it arrived, and queues its parameters back, so copies in both
  // directions overlap the host's arithmetic.
  const size_t n = host_params_.size();
  engine::FlatMath& math = engine_->math();
  engine::Device& device = engine_->device();
  std::vector<std::unique_ptr<engine::Event>> arrived;
  if (device_grads != nullptr) {
    for (size_t begin = 0; begin < n; begin += kPiece) {
      const size_t len = std::min(kPiece, n - begin);
      math.CopyToHostAsync(host_grads_.data() + begin, device_grads + begin, len);
      absl::StatusOr<std::unique_ptr<engine::Event>> e = device.NewEvent();
      if (!e.ok()) return e.status();
      if (absl::Status s = (*e)->Record(device.compute_stream()); !s.ok()) return s;
      arrived.push_back(*std::move(e));
    }
  }
  adamw_.Advance();
  for (size_t begin = 0, k = 0; begin < n; begin += kPiece, ++k) {
    const size_t end = std::min(n, begin + kPiece);
    if (!arrived.empty()) {
      if (absl::Status s = arrived[k]->Synchronize(); !s.ok()) return s;
    }
    StepPieceOnHost(begin, end, lr);
  }
  // The next forward reads the parameters on the same stream; the host
  // waits only so that host_params_ is not written while still being read.
  return device.compute_stream().Synchronize();
}

void Ddp::StepPieceOnHost(size_t begin, size_t end, float lr) {
  adamw_.UpdateRange(absl::MakeSpan(host_params_), absl::MakeConstSpan(host_grads_), lr, begin, end,
                     engine_->host_pool());
  engine_->math().CopyFromHostAsync(static_cast<float*>(engine_->params().data) + begin,
                                    host_params_.data() + begin, end - begin);
}

absl::Status Ddp::StepCopiedOut(float lr, float scale) {
  absl::Status status;
  adamw_.Advance();
  // In the order the copies were queued: the last layers' first, as the
  // backward finished them.
  for (const Arrival& a : arrivals_) {
    if (a.done != nullptr) status = a.done->Synchronize();
    if (!status.ok()) break;
    for (size_t begin = a.begin; begin < a.end; begin += kPiece) {
      const size_t end = std::min(a.end, begin + kPiece);
      if (scale != 1.0f) host_math_.Scale(host_grads_.data() + begin, end - begin, scale);
      StepPieceOnHost(begin, end, lr);
    }
  }
  DrainCopies();
  if (!status.ok()) return status;
  // As StepOnHost: the next forward reads the parameters on the compute
  // stream; the host waits so that host_params_ is not written while read.
  return engine_->device().compute_stream().Synchronize();
}

FlatRanges Ddp::SaveRanges() const {
  const size_t n = engine_->layout().num_params();
  const checkpoint::FlatRange r = checkpoint::EvenSplit(n, GroupSize(comm_), GroupRank(comm_));
  if (mp_.expert.empty()) return {{r.begin, r.end}};
  // Expert parallelism: this rank's share of the rest, split over the
  // replica group, and of its experts, split over the ranks holding them.
  FlatRanges out;
  ForEachOutside(r.begin, r.end, mp_.expert, [&](size_t b, size_t e) { out.emplace_back(b, e); });
  size_t experts = 0;
  for (const auto& [b, e] : mp_.expert) experts += e - b;
  const checkpoint::FlatRange mine =
      checkpoint::EvenSplit(experts, mp_.expert_dp_size, mp_.expert_dp_rank);
  size_t at = 0;  // the experts' elements before range [b, e)
  for (const auto& [b, e] : mp_.expert) {
    const size_t lo = std::max(at, size_t(mine.begin)),
                 hi = std::min(at + (e - b), size_t(mine.end));
    if (lo < hi) out.emplace_back(b + (lo - at), b + (hi - at));
    at += e - b;
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<float> Ddp::SaveParams() const {
  std::vector<float> out;
  for (const auto& [begin, end] : SaveRanges()) {
    const size_t at = out.size();
    out.resize(at + (end - begin));
    engine_->math().CopyToHost(
        out.data() + at, static_cast<const float*>(engine_->params().data) + begin, end - begin);
  }
  return out;
}
std::vector<float> Ddp::SaveM() const {
  std::vector<float> out;
  for (const auto& [begin, end] : SaveRanges()) {
    const std::vector<float> m = adamw_.CopyM(begin, end);
    out.insert(out.end(), m.begin(), m.end());
  }
  return out;
}
std::vector<float> Ddp::SaveV() const {
  std::vector<float> out;
  for (const auto& [begin, end] : SaveRanges()) {
    const std::vector<float> v = adamw_.CopyV(begin, end);
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

FlatRanges Ddp::LoadRanges() const { return {{0, engine_->layout().num_params()}}; }

absl::Status Ddp::Restore(absl::Span<const float> params, absl::Span<const float> m,
                          absl::Span<const float> v, int64_t optimizer_step) {
  const size_t n = engine_->layout().num_params();
  if (params.size() != n || m.size() != n || v.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("Ddp::Restore: ", params.size(), "/", m.size(),
                                                   "/", v.size(), " elements for ", n,
                                                   " parameters"));
  }
  engine_->math().CopyFromHost(static_cast<float*>(engine_->params().data), params.data(), n);
  if (host_master_) host_params_.assign(params.begin(), params.end());
  adamw_.SetState(m, v);
  adamw_.set_step(optimizer_step);
  return absl::OkStatus();
}

ModelStateMemory Ddp::memory() const {
  ModelStateMemory mem;
  engine::Buffer& params = engine_->param_buffer();
  engine::Buffer& grads = engine_->grad_buffer();
  mem.params = measure_ ? params.ResidentBytes() : int64_t(params.bytes());
  mem.grads = measure_ ? grads.ResidentBytes() : int64_t(grads.bytes());
  mem.optimizer = adamw_.state_bytes();  // m and v, wherever they live
  mem.optimizer_on_host = offload_;
  // Staged, the host copies exist for the all-reduce and the offloaded step;
  // otherwise the all-reduces run in place on the gradient buffer.
  mem.comm_buffers = int64_t((host_grads_.size() + host_params_.size()) * sizeof(float)) +
                     (bf16_grads_ != nullptr ? int64_t(bf16_grads_->bytes()) : 0);
  return mem;
}

}  // namespace shardtrain::parallel
