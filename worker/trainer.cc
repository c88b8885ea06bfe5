#include "worker/trainer.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/model/config.h"
#include "worker/checkpoint/directory.h"
#include "worker/checkpoint/loader.h"
#include "worker/checkpoint/manifest.h"
#include "worker/data/tokens.h"
#include "worker/optim/lr_schedule.h"

namespace shardtrain::worker {
namespace {

double MsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

std::string FinalWeightsPath(const JobSpec& spec) {
  return spec.checkpoint.dir.empty() ? "" : spec.checkpoint.dir + "/final.weights";
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const JobSpec& spec, int rank, int threads,
                                                         comm::Communicator* comm) {
  if (spec.parallel.tp != 1) {
    return absl::FailedPreconditionError(absl::StrCat("parallel.tp: ", spec.parallel.tp,
                                                      " — tensor parallelism is not "
                                                      "implemented yet; use tp: 1"));
  }
  if (spec.parallel.pp != 1) {
    return absl::FailedPreconditionError(absl::StrCat("parallel.pp: ", spec.parallel.pp,
                                                      " — pipeline parallelism is not "
                                                      "implemented yet; use pp: 1"));
  }
  if (spec.precision != Precision::kFp32) {
    return absl::FailedPreconditionError(
        absl::StrCat("precision: ", std::string(EnumName(spec.precision)),
                     " is not implemented on CPU yet; use fp32"));
  }
  if (spec.parallel.dp > 1 && (!comm || comm->size() != spec.parallel.dp)) {
    return absl::InvalidArgumentError("data-parallel job without a communicator of size dp");
  }
  absl::StatusOr<ParallelDims> dims = spec.Dims();
  if (!dims.ok()) return dims.status();
  absl::StatusOr<BatchSplit> split = spec.Split();
  if (!split.ok()) return split.status();
  if (rank < 0 || rank >= dims->world()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " outside the job's world ", dims->world()));
  }
  std::unique_ptr<Trainer> t(new Trainer(spec, rank, comm));
  t->split_ = *split;
  t->dp_rank_ = dims->Coord(rank).dp;
  auto config = model::MakeGptConfig(spec.model.layers, spec.model.heads, spec.model.dim,
                                     spec.model.context, spec.model.vocab);
  if (!config.ok()) return config.status();
  const int T = spec.batch.seq_len;
  auto format =
      spec.data.format == DataFormat::kLlmc ? data::TokenFormat::kLlmc : data::TokenFormat::kText;
  auto tokens = data::LoadTokens(spec.data.train, format, spec.model.vocab, T + 1);
  if (!tokens.ok()) {
    return absl::Status(tokens.status().code(),
                        absl::StrCat("data.train: ", tokens.status().message()));
  }
  t->tokens_ = *std::move(tokens);
  auto sampler = data::BatchSampler::Create(&t->tokens_, spec.seed, spec.batch.global, T);
  if (!sampler.ok()) return sampler.status();
  t->sampler_ = std::make_unique<data::BatchSampler>(*std::move(sampler));
  auto model = engine::cpu::Gpt::Create(*config, spec.batch.micro, T, threads);
  if (!model.ok()) return model.status();
  t->model_ = *std::move(model);
  optim::AdamWOptions o;
  o.beta1 = static_cast<float>(spec.optimizer.betas[0]);
  o.beta2 = static_cast<float>(spec.optimizer.betas[1]);
  o.eps = static_cast<float>(spec.optimizer.eps);
  o.weight_decay = static_cast<float>(spec.optimizer.weight_decay);
  // Initial params are a pure function of the seed: identical on every rank
  // (ZeRO-3 computes only its shards).
  if (spec.parallel.zero > 0) {
    parallel::ZeroOptions zo;
    zo.stage = spec.parallel.zero;
    zo.reshard_after_forward = spec.parallel.reshard_after_forward;
    zo.offload_optimizer = spec.parallel.offload == OffloadMode::kOptimizer;
    auto zero = parallel::Zero::Create(zo, t->model_.get(), o, comm);
    if (!zero.ok()) return zero.status();
    t->zero_ = *std::move(zero);
    t->zero_->InitParams(spec.seed);
  } else {
    t->model_->InitParams(spec.seed);
    auto adamw = optim::AdamW::Create(t->model_->layout(), 0, t->model_->layout().num_params(), o);
    if (!adamw.ok()) return adamw.status();
    t->adamw_ = std::make_unique<optim::AdamW>(*std::move(adamw));
  }
  t->bucket_elems_ =
      std::max<size_t>(1, size_t(spec.parallel.bucket_mb) * 1024 * 1024 / sizeof(float));
  t->inputs_.resize(size_t(spec.batch.micro) * T);
  t->targets_.resize(t->inputs_.size());
  return t;
}

void Trainer::LaunchBuckets(size_t offset, bool flush) {
  absl::Span<float> grads = model_->grads();
  while (unlaunched_end_ > offset && (flush || unlaunched_end_ - offset >= bucket_elems_)) {
    const size_t n = std::min(bucket_elems_, unlaunched_end_ - offset);
    unlaunched_end_ -= n;
    inflight_.push_back(comm_->AllReduceAsync(grads.data() + unlaunched_end_, n,
                                              comm::DataType::kFloat32, comm::ReduceOp::kSum));
  }
}

absl::Status Trainer::FinishAllReduce(StepResult* r) {
  LaunchBuckets(0, /*flush=*/true);
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status status;
  for (auto& w : inflight_) {
    if (absl::Status s = w->Wait(); !s.ok() && status.ok()) status = s;
  }
  r->comm_ms += MsSince(t0);
  if (!status.ok()) return status;
  const uint64_t first = inflight_.front()->seq(), last = inflight_.back()->seq();
  for (const comm::FlightRecord& f : comm_->flight_recorder().Dump()) {
    if (f.seq >= first && f.seq <= last && f.state == comm::OpState::kDone) {
      r->allreduce_ms += absl::ToDoubleMilliseconds(f.end_time - f.start_time);
    }
  }
  inflight_.clear();
  absl::Span<float> grads = model_->grads();
  const int n = comm_->size();
  r->comm_bytes += int64_t(grads.size() * sizeof(float)) * 2 * (n - 1) / n;
  // Summed over dp; the mean gradient of the global batch is sum / dp.
  optim::ScaleGrads(grads, 1.0f / n, model_->pool());
  return absl::OkStatus();
}

absl::StatusOr<StepResult> Trainer::Step(int64_t step) {
  const auto start = std::chrono::steady_clock::now();
  StepResult r;
  r.step = step;
  const int dp = spec_.parallel.dp, B = spec_.batch.micro, T = spec_.batch.seq_len;
  const int accum = split_.accum;
  // ZeRO-2/3 leave the model's gradients zero after reducing them.
  if (!zero_ || zero_->stage() == 1) model_->ZeroGrad();
  double loss = 0;
  const bool ddp = !zero_ && comm_ && comm_->size() > 1;
  for (int m = 0; m < accum; ++m) {
    // The sampler's step is 0-based; this replica's index is its dp coordinate.
    if (absl::Status s =
            sampler_->Fill(step - 1, m, dp_rank_, dp, B, inputs_.data(), targets_.data());
        !s.ok()) {
      return s;
    }
    if (zero_) zero_->BeginMicroBatch(m, accum);
    loss += model_->Forward(inputs_.data(), targets_.data());
    // Gradient accumulation: no communication until the last micro-batch,
    // whose backward launches the buckets as they become final.
    if (ddp && m == accum - 1) {
      unlaunched_end_ = model_->grads().size();
      model_->set_grads_ready_hook([this](size_t offset) { LaunchBuckets(offset, false); });
    }
    model_->Backward(1.0f / accum);
    if (zero_) {
      const auto t0 = std::chrono::steady_clock::now();
      if (absl::Status s = zero_->EndMicroBatch(); !s.ok()) return s;
      r.comm_ms += MsSince(t0);
    } else {
      model_->set_grads_ready_hook(nullptr);
    }
  }
  r.loss = loss / accum;
  if (ddp) {
    if (absl::Status s = FinishAllReduce(&r); !s.ok()) return s;
  }
  r.lr = optim::LearningRate(spec_.optimizer, step - 1, spec_.steps);
  if (zero_) {
    // Averaging over dp, clipping, the sharded step and (1-2) the all-gather.
    const auto t0 = std::chrono::steady_clock::now();
    absl::StatusOr<double> norm =
        zero_->Step(static_cast<float>(r.lr), static_cast<float>(spec_.optimizer.grad_clip));
    if (!norm.ok()) return norm.status();
    r.grad_norm = *norm;
    if (zero_->dp() > 1) r.comm_ms += MsSince(t0);
    r.comm_bytes += zero_->TakeCommBytes();
  } else {
    r.grad_norm = optim::ClipGradNorm(
        model_->grads(), static_cast<float>(spec_.optimizer.grad_clip), model_->pool());
    adamw_->Step(model_->params(), model_->grads(), static_cast<float>(r.lr), model_->pool());
  }
  r.tokens = int64_t(accum) * B * T;
  r.step_ms = MsSince(start);
  return r;
}

MemoryUse Trainer::memory() const {
  MemoryUse m;
  const int64_t n = int64_t(model_->layout().num_params()) * int64_t(sizeof(float));
  m.activations = model_->activation_bytes();
  if (!zero_) {
    m.params = n;
    m.grads = n;
    m.optimizer = 2 * n;
    return m;  // DDP all-reduces the gradient buffer in place
  }
  const parallel::ZeroMemory z = zero_->memory();
  m.params = z.params;
  m.grads = z.grads;
  m.optimizer = z.optimizer;
  m.comm_buffers = z.comm_buffers;
  m.working = z.gathered + z.unit_grads;
  m.optimizer_on_host = z.optimizer_on_host;
  return m;
}

absl::StatusOr<checkpoint::ShardFileInfo> Trainer::SaveShard(checkpoint::CheckpointStorage& storage,
                                                             int64_t step, std::string* path) {
  const model::ParamLayout& layout = model_->layout();
  checkpoint::ShardContents c;
  c.step = step;
  c.rank = rank_;
  c.world = spec_.parallel.dp;
  c.layout_fingerprint = layout.Fingerprint();
  c.num_params = layout.num_params();
  if (zero_) {  // the rank's ZeRO shard: its range of every unit
    for (auto [begin, end] : zero_->FlatRanges()) c.ranges.push_back({begin, end});
    c.params = zero_->ShardParams();
    c.m = zero_->ShardM();
    c.v = zero_->ShardV();
    c.scalars.optimizer_step = zero_->optimizer_step();
  } else {  // DDP: an even split (every rank holds all)
    const checkpoint::FlatRange range =
        checkpoint::EvenSplit(layout.num_params(), spec_.parallel.dp, rank_);
    c.ranges = {range};
    auto slice = [&](absl::Span<const float> all) {
      return std::vector<float>(all.begin() + range.begin, all.begin() + range.end);
    };
    c.params = slice(model_->params());
    c.m = slice(adamw_->m());
    c.v = slice(adamw_->v());
    c.scalars.optimizer_step = adamw_->step();
  }
  c.scalars.data_position = step + 1;
  c.scalars.rng_seed = spec_.seed;
  *path = checkpoint::JoinPath(checkpoint::StepDir(spec_.checkpoint.dir, step),
                               checkpoint::ShardFileName(rank_));
  return checkpoint::WriteShard(storage, *path, c);
}

absl::StatusOr<int64_t> Trainer::Restore(checkpoint::CheckpointStorage& storage,
                                         const std::string& step_dir) {
  auto manifest = checkpoint::ReadManifest(storage, checkpoint::ManifestPath(step_dir));
  if (!manifest.ok()) return manifest.status();
  if (auto s = checkpoint::CheckCompatible(*manifest, model_->layout()); !s.ok()) return s;
  // Whatever world and stage wrote it: ZeRO ranks read their own shard's
  // ranges (and stages 1-2 all-gather the params); DDP ranks read it all.
  if (zero_) {
    std::vector<checkpoint::FlatRange> ranges;
    for (auto [begin, end] : zero_->FlatRanges()) ranges.push_back({begin, end});
    auto state = checkpoint::LoadRanges(storage, step_dir, *manifest, ranges);
    if (!state.ok()) return state.status();
    if (absl::Status s =
            zero_->RestoreShard(state->params, state->m, state->v, state->scalars.optimizer_step);
        !s.ok()) {
      return s;
    }
    return state->step;
  }
  auto state = checkpoint::LoadAll(storage, step_dir, *manifest);
  if (!state.ok()) return state.status();
  std::copy(state->params.begin(), state->params.end(), model_->params().begin());
  std::copy(state->m.begin(), state->m.end(), adamw_->m().begin());
  std::copy(state->v.begin(), state->v.end(), adamw_->v().begin());
  adamw_->set_step(state->scalars.optimizer_step);
  return state->step;
}

}  // namespace shardtrain::worker
