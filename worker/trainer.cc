#include "worker/trainer.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/checkpoint/directory.h"
#include "worker/checkpoint/loader.h"
#include "worker/checkpoint/manifest.h"
#include "worker/data/tokens.h"
#include "worker/engine/cpu/gpt.h"
#include "worker/optim/lr_schedule.h"

namespace shardtrain::worker {
namespace {

double MsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

// What this build can train: FAILED_PRECONDITION naming the field otherwise.
absl::Status CheckSupported(const JobSpec& spec) {
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
  return absl::OkStatus();
}

optim::AdamWOptions AdamWOptionsOf(const OptimizerSpec& o) {
  optim::AdamWOptions a;
  a.beta1 = static_cast<float>(o.betas[0]);
  a.beta2 = static_cast<float>(o.betas[1]);
  a.eps = static_cast<float>(o.eps);
  a.weight_decay = static_cast<float>(o.weight_decay);
  return a;
}

// A token file of the spec's format, its errors prefixed with `field`.
absl::StatusOr<std::vector<uint16_t>> LoadData(const JobSpec& spec, const char* field,
                                               const std::string& path) {
  const auto format =
      spec.data.format == DataFormat::kLlmc ? data::TokenFormat::kLlmc : data::TokenFormat::kText;
  auto tokens = data::LoadTokens(path, format, spec.model.vocab, spec.batch.seq_len + 1);
  if (!tokens.ok()) {
    return absl::Status(tokens.status().code(),
                        absl::StrCat(field, ": ", tokens.status().message()));
  }
  return tokens;
}

}  // namespace

bool EvalDue(const JobSpec& spec, int64_t step) {
  return spec.eval.every > 0 && (step % spec.eval.every == 0 || step == spec.steps);
}

std::string FinalWeightsPath(const JobSpec& spec) {
  return spec.checkpoint.dir.empty() ? "" : spec.checkpoint.dir + "/final.weights";
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const JobSpec& spec, int rank, int threads,
                                                         comm::Communicator* comm) {
  if (absl::Status s = CheckSupported(spec); !s.ok()) return s;
  if (spec.parallel.dp > 1 && (!comm || comm->size() != spec.parallel.dp)) {
    return absl::InvalidArgumentError("data-parallel job without a communicator of size dp");
  }
  auto config = model::MakeGptConfig(spec.model.layers, spec.model.heads, spec.model.dim,
                                     spec.model.context, spec.model.vocab);
  if (!config.ok()) return config.status();
  auto tokens = LoadData(spec, "data.train", spec.data.train);
  if (!tokens.ok()) return tokens.status();
  std::vector<uint16_t> val_tokens;
  if (spec.eval.every > 0) {
    auto val = LoadData(spec, "data.val", spec.data.val);
    if (!val.ok()) return val.status();
    val_tokens = *std::move(val);
  }
  auto engine = engine::cpu::Gpt::Create(*config, spec.batch.micro, spec.batch.seq_len, threads);
  if (!engine.ok()) return engine.status();
  const optim::AdamWOptions adamw = AdamWOptionsOf(spec.optimizer);
  return Compose(
      spec, rank, *std::move(engine),
      [&](engine::Engine* e) { return parallel::MakeDataParallel(spec.parallel, e, adamw, comm); },
      *std::move(tokens), std::move(val_tokens));
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Compose(const JobSpec& spec, int rank,
                                                          std::unique_ptr<engine::Engine> engine,
                                                          const StrategyFactory& make_strategy,
                                                          std::vector<uint16_t> tokens,
                                                          std::vector<uint16_t> val_tokens) {
  absl::StatusOr<ParallelDims> dims = spec.Dims();
  if (!dims.ok()) return dims.status();
  absl::StatusOr<BatchSplit> split = spec.Split();
  if (!split.ok()) return split.status();
  if (rank < 0 || rank >= dims->world()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " outside the job's world ", dims->world()));
  }
  if (engine == nullptr || engine->max_batch() < spec.batch.micro ||
      engine->max_seq_len() < spec.batch.seq_len) {
    return absl::InvalidArgumentError(
        "the engine does not hold micro-batches of batch.micro × "
        "batch.seq_len tokens");
  }
  std::unique_ptr<Trainer> t(new Trainer(spec, rank));
  t->split_ = *split;
  t->dp_rank_ = dims->Coord(rank).dp;
  t->tokens_ = std::move(tokens);
  auto sampler =
      data::BatchSampler::Create(&t->tokens_, spec.seed, spec.batch.global, spec.batch.seq_len);
  if (!sampler.ok()) return sampler.status();
  t->sampler_ = std::make_unique<data::BatchSampler>(*std::move(sampler));
  if (spec.eval.every > 0) {
    t->val_tokens_ = std::move(val_tokens);
    auto eval = data::EvalSampler::Create(
        &t->val_tokens_, int64_t(spec.eval.batches) * spec.batch.global, spec.batch.seq_len);
    if (!eval.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("data.val: ", eval.status().message()));
    }
    t->eval_sampler_ = std::make_unique<data::EvalSampler>(*std::move(eval));
  }
  t->engine_ = std::move(engine);
  auto strategy = make_strategy(t->engine_.get());
  if (!strategy.ok()) return strategy.status();
  t->strategy_ = *std::move(strategy);
  // Initial params are a pure function of the seed: identical on every rank
  // (ZeRO-3 computes only its shards).
  t->strategy_->InitParams(spec.seed);
  t->inputs_.resize(size_t(spec.batch.micro) * spec.batch.seq_len);
  t->targets_.resize(t->inputs_.size());
  return t;
}

absl::StatusOr<StepResult> Trainer::Step(int64_t step) {
  const auto start = std::chrono::steady_clock::now();
  StepResult r;
  r.step = step;
  const int B = spec_.batch.micro, T = spec_.batch.seq_len, accum = split_.accum;
  double loss = 0;
  for (int m = 0; m < accum; ++m) {
    // The sampler's step is 0-based; this replica's index is its dp coordinate.
    if (absl::Status s =
            sampler_->Fill(step - 1, m, dp_rank_, split_.dp, B, inputs_.data(), targets_.data());
        !s.ok()) {
      return s;
    }
    strategy_->BeginMicroBatch(m, accum);
    loss += engine_->Forward(inputs_.data(), targets_.data());
    engine_->Backward(1.0f / accum);
    const auto t0 = std::chrono::steady_clock::now();
    if (absl::Status s = strategy_->EndMicroBatch(); !s.ok()) return s;
    r.comm_ms += MsSince(t0);
  }
  r.loss = loss / accum;
  r.lr = optim::LearningRate(spec_.optimizer, step - 1, spec_.steps);
  absl::StatusOr<parallel::StepStats> stats =
      strategy_->Step(static_cast<float>(r.lr), static_cast<float>(spec_.optimizer.grad_clip));
  if (!stats.ok()) return stats.status();
  r.grad_norm = stats->grad_norm;
  r.comm_ms += stats->comm_ms;
  r.allreduce_ms = stats->collective_ms;
  r.comm_bytes = stats->comm_bytes;
  r.tokens = int64_t(accum) * B * T;
  r.step_ms = MsSince(start);
  if (EvalDue(spec_, step)) {
    const auto eval_start = std::chrono::steady_clock::now();
    absl::StatusOr<double> val = Evaluate();
    if (!val.ok()) return val.status();
    r.val_loss = *val;
    r.eval_ms = MsSince(eval_start);
  }
  return r;
}

absl::StatusOr<double> Trainer::Evaluate() {
  if (eval_sampler_ == nullptr) {
    return absl::FailedPreconditionError("eval: no validation data (data.val, eval.every > 0)");
  }
  const int B = spec_.batch.micro, T = spec_.batch.seq_len;
  const int64_t count = eval_sampler_->count();  // eval.batches × global: B · dp divides it
  const auto [first, last] = data::EvalSampler::Share(count, dp_rank_, split_.dp);
  strategy_->BeginEval();
  double loss_sum = 0;  // over this replica's windows: each forward's mean token loss × B
  for (int64_t at = first; at < last; at += B) {
    // Cannot fail (the share lies within the windows); were it to, the
    // trainer is done with and the strategy's destructor removes its hooks.
    if (absl::Status s = eval_sampler_->Fill(at, B, inputs_.data(), targets_.data()); !s.ok()) {
      return s;
    }
    loss_sum += double(engine_->Forward(inputs_.data(), targets_.data(), B, T)) * B;
  }
  absl::StatusOr<double> total = strategy_->EndEval(loss_sum);
  if (!total.ok()) return total.status();
  return *total / double(count);
}

MemoryUse Trainer::memory() const {
  const parallel::ModelStateMemory state = strategy_->memory();
  MemoryUse m;
  m.params = state.params;
  m.grads = state.grads;
  m.optimizer = state.optimizer;
  m.comm_buffers = state.comm_buffers;
  m.working = state.working;
  m.optimizer_on_host = state.optimizer_on_host;
  m.activations = measure_ ? engine_->ResidentActivationBytes() : engine_->activation_bytes();
  return m;
}

absl::StatusOr<checkpoint::ShardFileInfo> Trainer::SaveShard(checkpoint::CheckpointStorage& storage,
                                                             int64_t step, std::string* path) {
  const model::ParamLayout& layout = engine_->layout();
  checkpoint::ShardContents c;
  c.step = step;
  c.rank = rank_;
  c.world = spec_.parallel.dp;
  c.layout_fingerprint = layout.Fingerprint();
  c.num_params = layout.num_params();
  for (auto [begin, end] : strategy_->SaveRanges()) c.ranges.push_back({begin, end});
  c.params = strategy_->SaveParams();
  c.m = strategy_->SaveM();
  c.v = strategy_->SaveV();
  c.scalars.optimizer_step = strategy_->optimizer_step();
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
  if (auto s = checkpoint::CheckCompatible(*manifest, engine_->layout()); !s.ok()) return s;
  // Whatever world and strategy wrote it: the rank reads the ranges its
  // strategy keeps (ZeRO its shard, DDP everything).
  std::vector<checkpoint::FlatRange> ranges;
  for (auto [begin, end] : strategy_->LoadRanges()) ranges.push_back({begin, end});
  auto state = checkpoint::LoadRanges(storage, step_dir, *manifest, ranges);
  if (!state.ok()) return state.status();
  if (absl::Status s =
          strategy_->Restore(state->params, state->m, state->v, state->scalars.optimizer_step);
      !s.ok()) {
    return s;
  }
  return state->step;
}

}  // namespace shardtrain::worker
