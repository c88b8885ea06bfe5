#include "worker/trainer.h"

#include <chrono>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/pipeline_schedule.h"
#include "worker/checkpoint/directory.h"
#include "worker/checkpoint/loader.h"
#include "worker/checkpoint/manifest.h"
#include "worker/checkpoint/model_weights.h"
#include "worker/data/tokens.h"
#include "worker/optim/lr_schedule.h"
#include "worker/trainer_internal.h"

namespace shardtrain::worker {
namespace {

double MsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

// What this build can train: FAILED_PRECONDITION naming the field otherwise.
absl::Status CheckSupported(const JobSpec& spec) {
  if (spec.resources.device == DeviceKind::kCpu && spec.precision != Precision::kFp32) {
    return absl::FailedPreconditionError(
        absl::StrCat("precision: ", std::string(EnumName(spec.precision)),
                     " is not implemented on CPU yet; use fp32 (or resources.device: cuda)"));
  }
#if !SHARDTRAIN_HAVE_CUDA
  if (spec.resources.device == DeviceKind::kCuda) {
    return absl::FailedPreconditionError(
        "resources.device: cuda, but this worker was built without CUDA");
  }
#endif
  // NCCL carries DDP (its optimizer also offloaded), ZeRO-1/2/3, tp and pp
  // in device memory; ZeRO's offloaded optimizer steps host shards that
  // only Gloo's host staging keeps: refused here, naming the field.
  const ParallelSpec& par = spec.parallel;
  if (par.comm == CommBackend::kNccl && par.offload != OffloadMode::kNone && par.zero >= 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "parallel.comm: nccl offloads the optimizer under DDP (zero 0) so far (this job has zero ",
        par.zero, ", offload ", std::string(EnumName(par.offload)),
        "); use parallel.comm: gloo, which GPU ranks reach through host copies"));
  }
  return absl::OkStatus();
}

optim::AdamWOptions AdamWOptionsOf(const OptimizerSpec& o) {
  optim::AdamWOptions a;
  a.beta1 = static_cast<float>(o.betas[0]);
  a.beta2 = static_cast<float>(o.betas[1]);
  a.eps = static_cast<float>(o.eps);
  a.weight_decay = static_cast<float>(o.weight_decay);
  a.int8_state = o.state == OptimizerState::kInt8;
  return a;
}

// A token file of the spec's format, its errors prefixed with `field`.
absl::StatusOr<data::TokenIds> LoadData(const JobSpec& spec, const char* field,
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
                                                         comm::Communicator* comm, int gpu,
                                                         const EngineWrapper& wrap_engine) {
  if (absl::Status s = CheckSupported(spec); !s.ok()) return s;
  absl::StatusOr<ParallelDims> dims = spec.Dims();
  if (!dims.ok()) return dims.status();
  if (dims->world() > 1 && (!comm || comm->size() != dims->world() || comm->rank() != rank)) {
    return absl::InvalidArgumentError("a job of several ranks without its world communicator");
  }
  auto config = spec.TrainedConfig();
  if (!config.ok()) return config.status();
  absl::StatusOr<std::vector<int>> stages =
      model::StageLayers(*config, dims->pp(), spec.parallel.stages, spec.parallel.pp_virtual);
  if (!stages.ok()) return stages.status();
  absl::StatusOr<BatchSplit> split = spec.Split();
  if (!split.ok()) return split.status();
  auto tokens = LoadData(spec, "data.train", spec.data.train);
  if (!tokens.ok()) return tokens.status();
  data::TokenIds val_tokens;
  if (spec.eval.every > 0) {
    auto val = LoadData(spec, "data.val", spec.data.val);
    if (!val.ok()) return val.status();
    val_tokens = *std::move(val);
  }
  // The mesh (only with cp, tp or pp: a dp-only job uses the world as its
  // dp group), this rank's slice and the engine's tp and cp groups. The
  // strategy reduces over the replica group (dp × cp).
  const MeshCoord coord = dims->Coord(rank);
  std::unique_ptr<parallel::Mesh> mesh;
  comm::Communicator* dp_comm = comm;
  if (dims->cp() > 1 || dims->tp() > 1 || dims->pp() > 1 || dims->ep() > 1) {
    absl::StatusOr<std::unique_ptr<parallel::Mesh>> m =
        parallel::Mesh::Create(*dims, rank, comm, spec.parallel.pp_virtual);
    if (!m.ok()) return m.status();
    mesh = *std::move(m);
    dp_comm = mesh->replica();
  }
  std::unique_ptr<parallel::TensorParallelGroup> tp;
  std::unique_ptr<parallel::ContextParallelGroup> cp;
  std::unique_ptr<parallel::ExpertParallelGroup> ep;
  engine::ModelEngineOptions options;
  const int chunks = spec.parallel.pp_virtual;
  options.slice = model::SliceOf(*stages, coord.pp, dims->tp(), coord.tp, chunks);
  options.slice.ep = dims->ep();
  options.slice.ep_rank = dims->EpRank(coord);
  if (mesh != nullptr && mesh->ep() != nullptr) {
    ep = std::make_unique<parallel::ExpertParallelGroup>(mesh->ep());
    options.ep = ep.get();
  }
  options.activations = spec.Activations();
  // ZeRO-2/3 give the device memory of the units not in use back.
  options.release_state = spec.parallel.zero >= 2;
  // ZeRO-3 also holds a unit's 16-bit compute copy only while it is in use.
  options.release_compute_copy = spec.parallel.zero == 3;
  options.moe = {spec.router.aux_loss_coef, spec.router.z_loss_coef, spec.router.capacity_factor};
  options.frozen = spec.FrozenFormat();
  const std::vector<parallel::PipelineAction> actions =
      parallel::PipelineActions(ScheduleOf(spec), coord.pp, dims->pp(), split->accum, chunks);
  options.slots = parallel::PeakInFlight(actions);
  if (chunks > 1) options.chunk_slots = parallel::PeakInFlightPerChunk(actions, chunks);
  if (mesh != nullptr && mesh->tp() != nullptr) {
    tp = std::make_unique<parallel::TensorParallelGroup>(mesh->tp());
    options.tp = tp.get();
  }
  if (mesh != nullptr && mesh->cp() != nullptr) {
    cp = std::make_unique<parallel::ContextParallelGroup>(mesh->cp());
    options.cp = cp.get();
  }
  auto engine = MakeEngine(spec, *config, threads, gpu, options);
  if (!engine.ok()) return engine.status();
  if (wrap_engine) *engine = wrap_engine(*std::move(engine));
  if (tp != nullptr) tp->set_device(&(*engine)->device());  // orders a device group's ops
  if (cp != nullptr) cp->set_device(&(*engine)->device());
  if (ep != nullptr) ep->set_device(&(*engine)->device());
  const optim::AdamWOptions adamw = AdamWOptionsOf(spec.optimizer);
  comm::Communicator* expert_comm = mesh != nullptr ? mesh->expert_dp() : nullptr;
  auto t = Compose(
      spec, rank, *std::move(engine),
      [&](engine::Engine* e) {
        return parallel::MakeDataParallel(spec.parallel, e, adamw, dp_comm, expert_comm);
      },
      *std::move(tokens), std::move(val_tokens));
  if (!t.ok()) return t.status();
  (*t)->replica_comm_ = dp_comm;
  if (mesh != nullptr) {
    if (absl::Status s = (*t)->AttachModelParallel(std::move(mesh), std::move(tp), std::move(cp),
                                                   std::move(ep), comm);
        !s.ok()) {
      return s;
    }
  }
  return t;
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Compose(const JobSpec& spec, int rank,
                                                          std::unique_ptr<engine::Engine> engine,
                                                          const StrategyFactory& make_strategy,
                                                          data::TokenIds tokens,
                                                          data::TokenIds val_tokens) {
  absl::StatusOr<ParallelDims> dims = spec.Dims();
  if (!dims.ok()) return dims.status();
  absl::StatusOr<BatchSplit> split = spec.Split();
  if (!split.ok()) return split.status();
  if (rank < 0 || rank >= dims->world()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " outside the job's world ", dims->world()));
  }
  if (engine == nullptr || engine->max_batch() < spec.batch.micro ||
      engine->max_seq_len() < spec.LocalSeqLen()) {
    return absl::InvalidArgumentError(
        "the engine does not hold micro-batches of batch.micro × "
        "batch.seq_len / parallel.cp tokens");
  }
  std::unique_ptr<Trainer> t(new Trainer(spec, rank));
  t->split_ = *split;
  const MeshCoord coord = dims->Coord(rank);
  t->dp_rank_ = coord.dp;
  t->cp_rank_ = coord.cp;
  t->expert_dp_rank_ = dims->ExpertDpRank(coord);
  if (dims->cp() > 1) {
    if (absl::Status s = dims->CheckSequence(spec.batch.seq_len); !s.ok()) return s;
    t->cp_columns_ = model::ContextChunkPositions(spec.batch.seq_len, dims->cp(), coord.cp);
    const size_t whole = size_t(spec.batch.micro) * spec.batch.seq_len;
    t->seq_inputs_.resize(whole);
    t->seq_targets_.resize(whole);
  }
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
  // LoRA: the frozen model is the plain model's init of the same seed,
  // unless model.init gives it (below).
  if (t->engine_->has_frozen() && spec.model.init.empty()) {
    std::vector<float> host(t->engine_->frozen_layout().num_params());
    t->engine_->InitFrozenInto(spec.seed, 0, host.size(), host.data());
    t->engine_->SetFrozen(host.data());
  }
  if (!spec.model.init.empty()) {
    if (absl::Status s = t->LoadInitialWeights(spec.model.init); !s.ok()) return s;
  }
  if (!spec.model.adapter.empty()) {
    if (absl::Status s = t->LoadInitialAdapter(spec.model.adapter); !s.ok()) return s;
  }
  t->inputs_.resize(size_t(spec.batch.micro) * spec.LocalSeqLen());
  t->targets_.resize(t->inputs_.size());
  if (spec.precision == Precision::kFp16) t->scaler_.emplace();
  return t;
}

absl::Status Trainer::FillLocal(const std::function<absl::Status(int*, int*)>& fill_whole,
                                int* inputs, int* targets) {
  if (cp_columns_.empty()) return fill_whole(inputs, targets);
  if (absl::Status s = fill_whole(seq_inputs_.data(), seq_targets_.data()); !s.ok()) return s;
  const int T = spec_.batch.seq_len, Tl = static_cast<int>(cp_columns_.size());
  for (int b = 0; b < spec_.batch.micro; ++b) {
    for (int i = 0; i < Tl; ++i) {
      inputs[b * Tl + i] = seq_inputs_[size_t(b) * T + cp_columns_[i]];
      targets[b * Tl + i] = seq_targets_[size_t(b) * T + cp_columns_[i]];
    }
  }
  return absl::OkStatus();
}

absl::Status Trainer::RunMicroBatches(int64_t step, StepResult* r) {
  const int B = spec_.batch.micro, T = spec_.LocalSeqLen(), accum = split_.accum;
  // The sampler's step is 0-based; this replica's index is its dp coordinate
  // (the cp ranks of a replica read the same sequences, each its columns).
  auto fill = [&](int m, int* inputs, int* targets) {
    return FillLocal(
        [&](int* in, int* tg) {
          return sampler_->Fill(step - 1, m, dp_rank_, split_.dp, B, in, tg);
        },
        inputs, targets);
  };
  if (pipeline_ != nullptr) {
    // The strategy brackets each backward (forwards read whole parameters:
    // ZeRO-3, which gathers them, is refused with pp > 1).
    // An interleaved stage's backwards are m · v passes: the strategy
    // zeroes before the first and reduces in the last (pipeline.h).
    const int passes = pipeline_->backward_passes();
    auto begin = [&](int pass) {
      strategy_->BeginMicroBatch(pass, passes);
      return absl::OkStatus();
    };
    auto end = [&](int) {
      const auto t0 = std::chrono::steady_clock::now();
      absl::Status s = strategy_->EndMicroBatch();
      r->comm_ms += MsSince(t0);
      return s;
    };
    absl::StatusOr<parallel::PipelineStepResult> p =
        pipeline_->RunStep(fill, begin, end, LossScale() / accum);
    if (!p.ok()) return p.status();
    r->loss = p->loss_sum / accum;
    r->bubble = p->idle_fraction;
    // Every forward sends its output on and every backward its input
    // gradient back, but at the pipeline's ends (model chunks: every chunk's).
    const int64_t sends = int64_t(accum) * B * T * engine_->config().dim * sizeof(float);
    const int v = pipeline_->chunks();
    r->pp_bytes = sends * ((pipeline_->stage() > 0 ? v : v - 1) +
                           (pipeline_->stage() + 1 < pipeline_->stages() ? v : v - 1));
    return absl::OkStatus();
  }
  double loss = 0;
  for (int m = 0; m < accum; ++m) {
    if (absl::Status s = fill(m, inputs_.data(), targets_.data()); !s.ok()) return s;
    strategy_->BeginMicroBatch(m, accum);
    const float loss_scale = LossScale() / accum;
    engine_->ExpectBackward(loss_scale);  // the loss's gradient may come with the forward
    loss += engine_->Forward(inputs_.data(), targets_.data());
    engine_->Backward(loss_scale);
    const auto t0 = std::chrono::steady_clock::now();
    if (absl::Status s = strategy_->EndMicroBatch(); !s.ok()) return s;
    r->comm_ms += MsSince(t0);
  }
  r->loss = loss / accum;
  return absl::OkStatus();
}

absl::StatusOr<StepResult> Trainer::Step(int64_t step) {
  const auto start = std::chrono::steady_clock::now();
  StepResult r;
  r.step = step;
  engine_->TakeMoeStats();  // the last evaluation's forwards are not this step's
  if (absl::Status s = RunMicroBatches(step, &r); !s.ok()) return s;
  const engine::MoeStats moe = engine_->TakeMoeStats();
  MoeFigures(moe, &r);
  if (tp_group_ != nullptr) {
    if (absl::Status s = tp_group_->Finish(); !s.ok()) return s;
    r.tp_bytes = tp_group_->TakeBytes();
  }
  if (cp_group_ != nullptr) {
    if (absl::Status s = cp_group_->Finish(); !s.ok()) return s;
    r.cp_bytes = cp_group_->TakeBytes();
    // Each cp rank's loss is the mean over its tokens, as many on each: the
    // replica's loss is their mean.
    absl::StatusOr<double> sum = SumOverModelGroup(mesh_->cp(), r.loss);
    if (!sum.ok()) return sum.status();
    r.loss = *sum / mesh_->dims().cp();
  }
  if (ep_group_ != nullptr) {  // the all-to-alls of the step's MoE layers
    if (absl::Status s = ep_group_->Finish(); !s.ok()) return s;
    r.ep_bytes = ep_group_->TakeBytes();
  }
  r.lr = optim::LearningRate(spec_.optimizer, step - 1, spec_.steps);
  const float loss_scale = LossScale();
  absl::StatusOr<parallel::StepStats> stats = strategy_->Step(
      static_cast<float>(r.lr), static_cast<float>(spec_.optimizer.grad_clip), loss_scale);
  if (!stats.ok()) return stats.status();
  r.skipped = stats->skipped;
  if (scaler_.has_value()) {
    r.loss_scale = loss_scale;
    scaler_->Update(stats->skipped);
  }
  if (absl::Status s = UpdateRouterBiases(moe); !s.ok()) return s;
  r.grad_norm = stats->grad_norm;
  r.comm_ms += stats->comm_ms;
  r.allreduce_ms = stats->collective_ms;
  r.comm_bytes = stats->comm_bytes + r.tp_bytes + r.pp_bytes + r.cp_bytes + r.ep_bytes;
  r.tokens = int64_t(split_.accum) * spec_.batch.micro * spec_.LocalSeqLen();
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
  const int B = spec_.batch.micro, T = spec_.LocalSeqLen();
  const int64_t count = eval_sampler_->count();  // eval.batches × global: B · dp divides it
  const auto [first, last] = data::EvalSampler::Share(count, dp_rank_, split_.dp);
  strategy_->BeginEval();
  // Each forward's mean token loss × B, summed over this replica's windows
  // (on the last pipeline stage; 0 on the others).
  double loss_sum = 0;
  if (pipeline_ != nullptr) {
    auto fill = [&](int m, int* inputs, int* targets) {
      return FillLocal(
          [&](int* in, int* tg) { return eval_sampler_->Fill(first + int64_t(m) * B, B, in, tg); },
          inputs, targets);
    };
    absl::StatusOr<double> sum = pipeline_->RunForwardOnly(int((last - first) / B), fill);
    if (!sum.ok()) return sum.status();
    loss_sum = *sum * B;
  } else {
    for (int64_t at = first; at < last; at += B) {
      // Cannot fail (the share lies within the windows); were it to, the
      // trainer is done with and the strategy's destructor removes its hooks.
      if (absl::Status s =
              FillLocal([&](int* in, int* tg) { return eval_sampler_->Fill(at, B, in, tg); },
                        inputs_.data(), targets_.data());
          !s.ok()) {
        return s;
      }
      loss_sum += double(engine_->Forward(inputs_.data(), targets_.data(), B, T)) * B;
    }
  }
  absl::StatusOr<double> total = strategy_->EndEval(loss_sum);
  if (!total.ok()) return total.status();
  if (tp_group_ != nullptr) {
    if (absl::Status s = tp_group_->Finish(); !s.ok()) return s;
  }
  if (mesh_ != nullptr) total = SumOverModelGroup(mesh_->pp(), *total);
  if (!total.ok()) return total.status();
  if (cp_group_ != nullptr) {
    if (absl::Status s = cp_group_->Finish(); !s.ok()) return s;
    cp_group_->TakeBytes();  // the ring's traffic of evaluation is no step's
  }
  if (tp_group_ != nullptr) tp_group_->TakeBytes();  // nor tp's
  if (ep_group_ != nullptr) {                        // nor ep's
    if (absl::Status s = ep_group_->Finish(); !s.ok()) return s;
    ep_group_->TakeBytes();
  }
  // The strategy summed over dp × cp: each cp rank's mean covers 1/cp of
  // every window's tokens.
  const int cp = mesh_ != nullptr ? mesh_->dims().cp() : 1;
  return *total / double(count) / cp;
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
  m.frozen = engine_->frozen_bytes();
  return m;
}

absl::StatusOr<checkpoint::ShardFileInfo> Trainer::SaveShard(checkpoint::CheckpointStorage& storage,
                                                             int64_t step, std::string* path) {
  const model::ParamLayout& layout = engine_->layout();
  checkpoint::ShardContents c;
  c.step = step;
  c.rank = rank_;
  c.world = spec_.World();
  // In the whole model's coordinates, whatever slice this rank runs: a
  // checkpoint of one layout loads under any other.
  c.layout_fingerprint = layout.GlobalFingerprint();
  c.num_params = layout.global_num_params();
  const std::vector<float> params = strategy_->SaveParams(), m = strategy_->SaveM(),
                           v = strategy_->SaveV();
  ForEachGlobalPiece(layout, strategy_->SaveRanges(), layout.ReplicaRanges(),
                     [&](size_t at, size_t global, size_t count) {
                       if (!c.ranges.empty() && c.ranges.back().end == global) {
                         c.ranges.back().end += count;
                       } else {
                         c.ranges.push_back({global, global + count});
                       }
                       c.params.insert(c.params.end(), params.begin() + at,
                                       params.begin() + at + count);
                       c.m.insert(c.m.end(), m.begin() + at, m.begin() + at + count);
                       c.v.insert(c.v.end(), v.begin() + at, v.begin() + at + count);
                     });
  c.scalars.optimizer_step = strategy_->optimizer_step();
  c.scalars.data_position = step + 1;
  c.scalars.rng_seed = spec_.seed;
  c.scalars.loss_scale = LossScale();
  *path = checkpoint::JoinPath(checkpoint::StepDir(spec_.checkpoint.dir, step),
                               checkpoint::ShardFileName(rank_));
  return checkpoint::WriteShard(storage, *path, c);
}

absl::StatusOr<int64_t> Trainer::Restore(checkpoint::CheckpointStorage& storage,
                                         const std::string& step_dir) {
  auto manifest = checkpoint::ReadManifest(storage, checkpoint::ManifestPath(step_dir));
  if (!manifest.ok()) return manifest.status();
  const model::ParamLayout& layout = engine_->layout();
  if (auto s = checkpoint::CheckCompatible(*manifest, layout); !s.ok()) return s;
  // Whatever layout, world and strategy wrote it: the rank reads the ranges
  // its strategy keeps (ZeRO its shard, DDP everything) of its slice, in the
  // whole model's coordinates and in local order.
  std::vector<checkpoint::FlatRange> ranges;
  ForEachGlobalPiece(layout, strategy_->LoadRanges(), {}, [&](size_t, size_t global, size_t n) {
    ranges.push_back({global, global + n});
  });
  auto state = checkpoint::LoadRanges(storage, step_dir, *manifest, ranges);
  if (!state.ok()) return state.status();
  if (absl::Status s =
          strategy_->Restore(state->params, state->m, state->v, state->scalars.optimizer_step);
      !s.ok()) {
    return s;
  }
  // fp16 resumes at the saved loss scale (the count of clean steps towards
  // its next growth starts again); a checkpoint of another precision carries
  // 1, and the scaler starts from its initial scale instead.
  if (scaler_.has_value() && state->scalars.loss_scale != 1.0) {
    if (absl::Status s = scaler_->Restore(static_cast<float>(state->scalars.loss_scale), 0);
        !s.ok()) {
      return absl::DataLossError(absl::StrCat("checkpoint ", step_dir, ": ", s.message()));
    }
  }
  return state->step;
}

}  // namespace shardtrain::worker
