#include "worker/job_runner.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <iostream>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/job_spec.h"
#include "common/process.h"
#include "common/spec_paths.h"
#include "common/storage_fault.h"
#include "worker/checkpoint/directory.h"
#include "worker/checkpoint/loader.h"
#include "worker/checkpoint/manifest.h"
#include "worker/checkpoint/storage.h"
#include "worker/checkpoint/weights_file.h"
#include "worker/checkpoint_commit.h"
#include "worker/comm/gloo_communicator.h"
#if SHARDTRAIN_HAVE_NCCL
#include "worker/comm/nccl_communicator.h"
#endif
#include "worker/job_reporter.h"
#include "worker/kv_rendezvous_store.h"
#include "worker/mfu.h"
#include "worker/trainer.h"
#include "worker/training_metrics.h"

namespace shardtrain::worker {
namespace {

// The step directory to resume from: `path` itself when it holds a manifest
// whose shards verify; otherwise the newest valid commit under `path` (a
// checkpoint root) or, for a corrupt step directory, under its parent with
// an older step. Every rank reads the same files, so all choose alike.
absl::StatusOr<std::string> ResolveCheckpoint(checkpoint::CheckpointStorage& storage,
                                              const std::string& path, const Reporter& report) {
  std::string root = path;
  int64_t below = INT64_MAX;
  auto manifest = checkpoint::ReadManifest(storage, checkpoint::ManifestPath(path));
  if (manifest.ok()) {
    absl::Status ok = checkpoint::VerifyShards(storage, path, *manifest);
    if (ok.ok()) return path;
    report.Event("checkpoint " + path + " is unusable (" + ok.ToString() + "); trying older ones");
  }
  if (manifest.ok() || absl::IsDataLoss(manifest.status())) {
    root = path.substr(0, path.find_last_of('/'));
    below = manifest.ok() ? manifest->step : INT64_MAX;
    if (!manifest.ok()) {
      report.Event("checkpoint " + path + " is unusable (" + manifest.status().ToString() +
                   "); trying older ones");
    }
  }
  auto committed = checkpoint::ListCommitted(storage, root);
  if (!committed.ok()) return committed.status();
  for (const checkpoint::CommittedCheckpoint& c : *committed) {
    if (c.step >= below) continue;
    absl::Status ok = checkpoint::VerifyShards(storage, c.step_dir, c.manifest);
    if (ok.ok()) return c.step_dir;
    report.Event("skipping checkpoint " + c.step_dir + ": " + ok.ToString());
  }
  return absl::NotFoundError("no valid committed checkpoint in " + root);
}

absl::Status CheckPlan(const v1::Plan& plan, const JobSpec& spec, const v1::RunAssignment& a) {
  if (plan.generation() != a.generation() || plan.world() != a.world() ||
      a.rank() >= plan.ranks_size()) {
    return absl::AbortedError(absl::StrCat("plan of generation ", plan.generation(), " (world ",
                                           plan.world(), ") does not match the assignment (",
                                           a.generation(), ", world ", a.world(), ")"));
  }
  // The spec was validated: its mesh and batch split exist.
  const absl::StatusOr<ParallelDims> dims = spec.Dims();
  const absl::StatusOr<BatchSplit> split = spec.Split();
  if (!dims.ok() || !split.ok() || dims->world() != a.world()) {
    return absl::InternalError(absl::StrCat("spec's mesh does not fit the assignment's world ",
                                            a.world(), ": ", dims.status().ToString()));
  }
  const v1::RankPlan& r = plan.ranks(a.rank());
  const MeshCoord c = dims->Coord(a.rank());
  if (r.dp() != c.dp || r.tp() != c.tp || r.pp() != c.pp ||
      r.first_sample() != split->first_sample(c.dp) || plan.grad_accum_steps() != split->accum) {
    return absl::InternalError(absl::StrCat(
        "plan disagrees with the trainer for rank ", a.rank(), ": (dp, tp, pp) (", r.dp(), ", ",
        r.tp(), ", ", r.pp(), ") vs (", c.dp, ", ", c.tp, ", ", c.pp, "), first sample ",
        r.first_sample(), ", accumulation ", plan.grad_accum_steps()));
  }
  return absl::OkStatus();
}

// Whether an error building the rank's trainer is one a retry cannot fix:
// the spec asks for what this worker cannot do (unsupported precision or
// parallelism: FAILED_PRECONDITION), a value is bad (INVALID_ARGUMENT), or a
// data file is missing (NOT_FOUND). Collective and RPC errors, which a new
// generation can get past, never carry these codes from Trainer::Create.
bool PermanentTrainerError(const absl::Status& s) {
  return absl::IsInvalidArgument(s) || absl::IsNotFound(s) || absl::IsFailedPrecondition(s) ||
         absl::IsUnimplemented(s);
}

// Rewrites the spec's paths to where this worker opens them (data and
// model.init under its data root, checkpoints under its checkpoint root); INVALID_ARGUMENT naming
// the field for a path that escapes its root.
absl::Status ResolvePaths(const WorkerOptions& o, JobSpec& spec) {
  for (auto [field, path] : {std::pair<const char*, std::string*>{"data.train", &spec.data.train},
                             {"data.val", &spec.data.val},
                             {"model.init", &spec.model.init},
                             {"model.adapter", &spec.model.adapter}}) {
    absl::StatusOr<std::string> p = ResolveSpecPath(field, o.data_root, *path, o.confine_data);
    if (!p.ok()) return p.status();
    *path = *std::move(p);
  }
  absl::StatusOr<std::string> dir = ResolveSpecPath("checkpoint.dir", o.checkpoint_root,
                                                    spec.checkpoint.dir, o.confine_checkpoints);
  if (!dir.ok()) return dir.status();
  spec.checkpoint.dir = *std::move(dir);
  return absl::OkStatus();
}

// The ordinal N of the worker's GPU ("cuda:N", as --device named it and
// ProbeDevice checked it); 0 for the CPU.
int GpuOrdinal(const v1::Device& device) {
  int n = 0;
  if (device.kind() != "cuda" || !absl::SimpleAtoi(absl::StripPrefix(device.name(), "cuda:"), &n)) {
    return 0;
  }
  return n;
}

// Whether `s`, from writing a checkpoint, is the storage's: a StorageError,
// or UNAVAILABLE (an I/O error that carries no fault). Such a checkpoint is
// not committed, and training goes on (checkpoint.on_failure decides); any
// other error is the rank's failure.
bool IsStorageError(const absl::Status& s) {
  return StorageFaultOf(s) != StorageFault::kNone || absl::IsUnavailable(s);
}

// "2m0s", "45s".
std::string Seconds(int s) {
  return s >= 60 ? absl::StrFormat("%dm%02ds", s / 60, s % 60) : absl::StrFormat("%ds", s);
}

// Rank 0 saves the final weights to `path`. A storage error a retry cannot
// fix (no space, read-only, permission denied, not a directory) is retried
// with back-off (1 s, doubling, at most 30 s) for checkpoint.final_retry_s
// while the trained weights stay in memory, with one warning event telling
// the user what to fix; then it is returned (naming the path and the cause)
// and the caller fails the job for good, rather than retraining it. Other
// errors are returned at once (a transient one recovers as before). Stops
// early when `stop` is set.
absl::Status SaveFinalWeights(const Reporter& report, const JobSpec& spec, const std::string& path,
                              const model::ModelConfig& config, absl::Span<const float> weights,
                              const std::atomic<bool>& stop) {
  const int budget_s = spec.checkpoint.final_retry_s;
  const absl::Time start = absl::Now(), deadline = start + absl::Seconds(budget_s);
  absl::Duration backoff = absl::Seconds(1);
  for (int attempt = 1;; ++attempt) {
    absl::Status s = checkpoint::MakeDirectories(spec.checkpoint.dir);
    if (s.ok()) s = checkpoint::SaveWeights(path, config, weights);
    if (s.ok()) {
      if (attempt > 1) {
        report.Event(absl::StrFormat("final weights saved to %s at attempt %d, after %.0f s", path,
                                     attempt, absl::ToDoubleSeconds(absl::Now() - start)));
      }
      return s;
    }
    const StorageFault fault = StorageFaultOf(s);
    if (!RetryCannotFix(fault)) return s;
    const std::string cause = absl::StrCat(StorageCause(s), " (", path, ")");
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration() || stop) {
      return StorageError(
          fault,
          absl::StrCat("final weights not saved: ", cause,
                       attempt > 1 ? absl::StrCat("; retried for ", Seconds(budget_s),
                                                  " (checkpoint.final_retry_s)")
                                   : ""),
          StorageCause(s));
    }
    if (attempt == 1) {
      report.Event(absl::StrCat("final weights not saved: ", cause,
                                "; the trained weights stay in memory and saving is retried for "
                                "up to ",
                                Seconds(budget_s),
                                " (checkpoint.final_retry_s): free space or fix the directory now"),
                   /*warning=*/true);
    }
    // Sleep in slices, so that a cancelled job does not wait out the back-off.
    const absl::Time wake = absl::Now() + std::min(backoff, left);
    while (absl::Now() < wake && !stop) {
      absl::SleepFor(std::min(absl::Milliseconds(250), wake - absl::Now()));
    }
    backoff = std::min(backoff * 2, absl::Seconds(30));
  }
}

// Trains one assignment to its end (or stop), reporting to the coordinator.
void TrainAssignment(const RunContext& ctx, TrainingMetrics* metrics) {
  const v1::RunAssignment& a = *ctx.assignment;
  const std::vector<std::string> labels = {a.job_id(), std::to_string(a.rank())};
  Counter& steps = metrics->steps.WithLabels(labels);
  Counter& tokens = metrics->tokens.WithLabels(labels);
  Histogram& step_seconds = metrics->step_seconds.WithLabels(labels);
  Counter& allreduce_seconds =
      metrics->collective_seconds.WithLabels({a.job_id(), labels[1], "allreduce"});
  Counter& sent = metrics->sent_bytes.WithLabels(labels);
  Gauge& loss = metrics->loss.WithLabels(labels);
  // Before the reporter: a commit it holds through an outage writes here.
  checkpoint::FileCheckpointStorage storage;
  Reporter report(ctx);
  absl::StatusOr<JobSpec> spec = ParseJobSpec(a.spec_yaml());
  if (!spec.ok()) return report.Failure(spec.status(), 0, nullptr, /*permanent=*/true);
  // Checkpoint paths as the spec and the coordinator's record name them; this
  // worker reaches them (and the data) under its roots.
  const WorkerOptions& opts = *ctx.options;
  const std::string recorded_dir = spec->checkpoint.dir;
  absl::StatusOr<std::string> resume_from = ResolveSpecPath(
      "resume_from", opts.checkpoint_root, a.resume_from(), opts.confine_checkpoints);
  absl::Status paths = resume_from.ok() ? ResolvePaths(opts, *spec) : resume_from.status();
  if (!paths.ok()) return report.Failure(paths, 0, nullptr, /*permanent=*/true);

  // The plan is the coordinator's word on this rank's place in the mesh and
  // its share of the batch; the trainer derives the same from the spec, and
  // a disagreement (a stale or foreign plan) must stop the rank, not train it.
  absl::StatusOr<v1::Plan> plan = ctx.client->GetPlan(a.job_id());
  if (!plan.ok()) return report.Failure(plan.status(), 0, nullptr);
  if (absl::Status s = CheckPlan(*plan, *spec, a); !s.ok()) return report.Failure(s, 0, nullptr);

  // Collectives: a Gloo group (or NCCL's, parallel.comm: nccl) over the
  // coordinator's KV, namespaced by (job, generation), when the job has
  // more than one rank.
  std::shared_ptr<comm::RendezvousStore> store;
  std::unique_ptr<comm::Communicator> comm;
  if (a.world() > 1) {
    store = std::make_shared<KvRendezvousStore>(ctx.client, a.job_id(), a.generation(),
                                                a.lease_token());
    const absl::Duration timeout = absl::Seconds(spec->timeouts.collective_s);
    const std::string prefix = absl::StrCat(a.job_id(), "/gen", a.generation());
    absl::StatusOr<std::unique_ptr<comm::Communicator>> c;
    if (spec->parallel.comm == CommBackend::kNccl) {
#if SHARDTRAIN_HAVE_NCCL
      comm::NcclOptions o;
      o.device = GpuOrdinal(opts.device);
      o.timeout = timeout;
      o.prefix = prefix;
      c = comm::CreateNcclCommunicator(store, a.rank(), a.world(), o);
#else
      return report.Failure(absl::FailedPreconditionError(
                                "parallel.comm: nccl, but this worker was built without NCCL"),
                            0, nullptr, /*permanent=*/true);
#endif
    } else {
      comm::GlooOptions o;
      o.hostname = ctx.options->collective_address;
      o.timeout = timeout;
      o.prefix = prefix;
      c = comm::CreateGlooCommunicator(store, a.rank(), a.world(), o);
    }
    if (!c.ok()) return report.Failure(c.status(), 0, nullptr);
    comm = *std::move(c);
  }
  // Heartbeats carry the recorder while the communicator lives (declared
  // after it: detached before it is destroyed).
  ScopedRecorderAttach attach(ctx.collectives, comm ? &comm->flight_recorder() : nullptr);
  auto trainer =
      Trainer::Create(*spec, a.rank(), ctx.options->threads, comm.get(), GpuOrdinal(opts.device));
  if (!trainer.ok()) {
    return report.Failure(trainer.status(), 0, comm.get(), PermanentTrainerError(trainer.status()));
  }
  int64_t first = 1;
  if (!(*trainer)->init_read_summary().empty()) {
    report.Event("rank " + std::to_string(a.rank()) + ": " + (*trainer)->init_read_summary());
  }
  if (!resume_from->empty()) {
    absl::StatusOr<std::string> step_dir = ResolveCheckpoint(storage, *resume_from, report);
    if (!step_dir.ok()) return report.Failure(step_dir.status(), 0, comm.get());
    absl::StatusOr<int64_t> done = (*trainer)->Restore(storage, *step_dir);
    if (!done.ok()) return report.Failure(done.status(), 0, comm.get());
    first = *done + 1;
    report.Event("resumed from " + *step_dir + " (step " + std::to_string(*done) + ")");
  }
  report.Log("training " + spec->name + ": steps " + std::to_string(first) + ".." +
             std::to_string(spec->steps) + ", world " + std::to_string(a.world()));
  const MfuMeter mfu(*spec, (*trainer)->engine().layout(), opts.device.model());
  report.Log(mfu.description());
  const int every = spec->checkpoint.dir.empty() ? 0 : spec->checkpoint.every;
  // The manifest is of the whole model, whatever slice rank 0 runs.
  const auto whole = std::make_shared<const model::ParamLayout>((*trainer)->engine().config());
  for (int64_t step = first; step <= spec->steps; ++step) {
    if (*ctx.stop) {
      report.Log("stopped at step " + std::to_string(step));
      return;
    }
    auto r = (*trainer)->Step(step);
    if (!r.ok()) return report.Failure(r.status(), step, comm.get());
    steps.Increment();
    tokens.Increment(double(r->tokens));
    step_seconds.Observe(r->step_ms / 1000.0);
    allreduce_seconds.Increment(r->comm_ms / 1000.0);
    sent.Increment(double(r->comm_bytes));
    // A diverged step (NaN/inf) is reported to the coordinator, not exported.
    if (std::isfinite(r->loss)) loss.Set(r->loss);
    if (mfu.known()) metrics->mfu.WithLabels(labels).Set(mfu.Of(*r));
    if (r->val_loss) {
      if (std::isfinite(*r->val_loss)) metrics->val_loss.WithLabels(labels).Set(*r->val_loss);
      report.Log(absl::StrFormat("step %d: validation loss %.4f (evaluated in %.0f ms)", step,
                                 *r->val_loss, r->eval_ms));
    }
    if (r->moe_max_load > 0) {
      for (auto [figure, v] : {std::pair<const char*, double>{"aux_loss", r->moe_aux_loss},
                               {"z_loss", r->moe_z_loss},
                               {"max_load", r->moe_max_load},
                               {"dropped", r->moe_dropped}}) {
        metrics->moe.WithLabels({labels[0], labels[1], figure}).Set(v);
      }
    }
    metrics->peak_rss.Set(double(PeakRssBytes()));
    const MemoryUse mem = (*trainer)->memory();
    for (auto [kind, bytes] : {std::pair<const char*, int64_t>{"params", mem.params},
                               {"grads", mem.grads},
                               {"optimizer", mem.optimizer},
                               {"activations", mem.activations},
                               {"comm_buffers", mem.comm_buffers},
                               {"working", mem.working}}) {
      metrics->memory.WithLabels({a.job_id(), labels[1], kind}).Set(double(bytes));
    }
    if (!report.Step(*r, mfu.Of(*r))) {
      report.Log("the coordinator ended the job; stopping at step " + std::to_string(step));
      return;
    }
    if (every > 0 && step % every == 0 && step < spec->steps) {
      const std::string step_dir = checkpoint::StepDir(spec->checkpoint.dir, step);
      std::string path;
      absl::StatusOr<checkpoint::ShardFileInfo> info = (*trainer)->SaveShard(storage, step, &path);
      const bool failed = !info.ok();
      if (failed && !IsStorageError(info.status())) {
        return report.Failure(info.status(), step, comm.get());
      }
      // Rank 0 commits once every rank reported: now, or when the
      // coordinator answers again after an outage (the reporter runs it in
      // turn, on its own thread then, while training goes on).
      Reporter::CommitFn commit;
      if (a.rank() == 0) {
        CommitTarget target;
        target.job_id = a.job_id();
        target.generation = a.generation();
        target.worker_id = ctx.worker_id;
        target.lease_token = a.lease_token();
        target.world = a.world();
        target.zero_stage = spec->parallel.zero;
        target.dir = recorded_dir;
        target.local_dir = spec->checkpoint.dir;
        // The other ranks wait in the next step's collectives meanwhile.
        target.wait = absl::Seconds(spec->timeouts.collective_s) / 2;
        commit = [&report, &storage, &ctx, whole, target, step, step_dir, failed] {
          // An outage's held commit runs while training goes on: the other
          // ranks' reports may take longer to arrive then.
          CommitTarget t = target;
          if (!report.sending_now()) t.wait = std::max(t.wait, absl::Seconds(60));
          absl::StatusOr<CommitResult> r =
              CommitCheckpoint(*ctx.client, storage, *whole, t, step, report.closing());
          if (absl::IsUnavailable(r.status())) return r.status();  // again, in turn
          report.Settled(step);  // committed or not, never to be re-sent
          if (absl::IsAlreadyExists(r.status())) {
            report.Log("checkpoint step " + std::to_string(step) + " was committed already");
            return absl::OkStatus();
          }
          report.Commit(r, step);
          // Why the commit failed, unless this rank said so already (its own
          // shard) or there is nobody to tell (a generation that is over, a
          // stopped rank). Another rank's failure, said again, counts once.
          const absl::Status& cs = r.status();
          if (cs.ok() || failed || absl::IsAborted(cs) || absl::IsCancelled(cs) ||
              absl::IsNotFound(cs)) {
            return absl::OkStatus();
          }
          return report.CommitFailure(step, step_dir, cs);
        };
      }
      if (!failed) {
        if (absl::Status s = report.Checkpoint(*info, path, step, std::move(commit)); !s.ok()) {
          return report.Failure(s, step, comm.get());
        }
      } else {
        report.Log("checkpoint step " + std::to_string(step) +
                   " not written: " + Text(info.status()));
        report.CheckpointFailure(step, step_dir, info.status(), std::move(commit));
      }
      if (report.ended()) {
        report.Log("the coordinator ended the job; stopping at step " + std::to_string(step));
        return;
      }
    }
  }
  std::string output;
  if (!FinalWeightsPath(*spec).empty()) {
    // Every rank takes part (ZeRO-3 gathers, a split model sums into rank 0).
    absl::StatusOr<absl::Span<const float>> whole = (*trainer)->WholeModel();
    if (!whole.ok()) return report.Failure(whole.status(), spec->steps, comm.get());
    if (a.rank() == 0) {
      output = FinalWeightsPath(*spec);
      // The model's config: under LoRA the whole model is the merged one.
      if (absl::Status s =
              SaveFinalWeights(report, *spec, output,
                               model::BaseConfig((*trainer)->engine().config()), *whole, *ctx.stop);
          !s.ok()) {
        // Retraining cannot fix the volume: fail once, not max_restarts times.
        return report.Failure(s, spec->steps, comm.get(), RetryCannotFix(StorageFaultOf(s)));
      }
      report.Log("saved final weights to " + output);
    }
  }
  if (comm) comm->Shutdown().IgnoreError();  // barrier: no peer is left mid-collective
  report.Done(spec->steps, output);
}

void RunAssignment(const RunContext& ctx, TrainingMetrics* metrics) {
  TrainAssignment(ctx, metrics);
  metrics->Drop(ctx.assignment->job_id(), std::to_string(ctx.assignment->rank()));
}

}  // namespace

JobRunner NewJobRunner(MetricsRegistry* registry) {
  auto metrics = std::make_shared<TrainingMetrics>(registry);
  return [metrics](const RunContext& ctx) { RunAssignment(ctx, metrics.get()); };
}

}  // namespace shardtrain::worker
