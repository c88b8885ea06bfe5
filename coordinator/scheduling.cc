// The coordinator's scheduling pass (Coordinator::ScheduleLocked): collects
// the waiting jobs and the free workers, asks the pure scheduler
// (scheduler.h, which states the queue policy) where each job goes, and
// starts the placed ones with a plan. A job the planner cannot plan FAILS
// with the reason; nothing a spec holds can throw out of this pass.
#include <algorithm>
#include <exception>
#include <iostream>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/job_spec.h"
#include "common/planner.h"
#include "common/text_bounds.h"
#include "coordinator/coordinator.h"
#include "coordinator/scheduler.h"

namespace shardtrain::coordinator {
namespace {

// Smaller gang sizes a recovering job accepts, largest first: jobs with
// resources.min_workers below their world lose whole data-parallel replicas
// (cp · tp · pp ranks each; checkpoints are in the whole model's coordinates, so
// any mesh resumes), keeping the global batch fixed, so only data-parallel
// degrees the batch splits over (SplitBatch: whole micro-batches per replica
// per step) qualify. 4 ranks with global/micro = 4 and min 2 shrink to 2,
// not 3: 3 replicas cannot split 4 micro-batches evenly.
std::vector<int> ElasticWorlds(const JobSpec& spec, const ParallelDims& dims) {
  std::vector<int> out;
  for (int dp = dims.dp() - 1; dp >= 1; --dp) {
    absl::StatusOr<ParallelDims> shrunk = dims.WithDp(dp);
    if (!shrunk.ok() || shrunk->world() < spec.resources.min_workers) break;
    if (SplitBatch(spec.batch.global, spec.batch.micro, shrunk->dp()).ok()) {
      out.push_back(shrunk->world());
    }
  }
  return out;
}

// MakePlan, with any exception (std::bad_alloc on a plan too large for
// memory) turned into an error: the pass must never throw.
absl::StatusOr<v1::Plan> PlanOrError(const JobSpec& spec, int world) {
  try {
    return MakePlan(spec, world);
  } catch (const std::exception& e) {
    return absl::ResourceExhaustedError(absl::StrCat("planning threw: ", e.what()));
  } catch (...) {
    return absl::InternalError("planning threw an unknown exception");
  }
}

}  // namespace

void Coordinator::WorkerEntry::SetInfo(v1::WorkerInfo i) {
  info = std::move(i);
  schedulable = FreeWorker{info.worker_id(), info.device().kind(), {}};
  schedulable.precisions.assign(info.device().precisions().begin(),
                                info.device().precisions().end());
}

void Coordinator::AddCapabilities(const FreeWorker& w) {
  if (w.precisions.empty()) capabilities_.emplace(w.device, "fp32");
  for (const std::string& p : w.precisions) capabilities_.emplace(w.device, p);
}

absl::Status Coordinator::CheckRunnable(const JobSpec& spec) const {
  if (workers_.empty()) return absl::OkStatus();  // a cluster still starting: the job waits
  const std::string device(EnumName(spec.resources.device));
  const std::string precision(EnumName(spec.precision));
  if (capabilities_.count({device, precision})) return absl::OkStatus();
  std::set<std::string> kinds;
  for (const auto& [id, w] : workers_) {
    const FreeWorker& f = w.schedulable;
    if (CanRun(f, device, precision)) return absl::OkStatus();
    std::string kind = f.device;
    for (size_t i = 0; i < f.precisions.size(); ++i) {
      absl::StrAppend(&kind, i == 0 ? " " : "/", f.precisions[i]);
    }
    kinds.insert(f.precisions.empty() ? kind + " fp32" : kind);
  }
  const bool device_known = std::any_of(workers_.begin(), workers_.end(), [&](const auto& w) {
    return w.second.info.device().kind() == device;
  });
  return absl::FailedPreconditionError(absl::StrCat(
      device_known ? "precision: " : "resources.device: ", device_known ? precision : device,
      device_known ? absl::StrCat(" on ", device) : std::string(), " is supported by none of the ",
      workers_.size(), " workers that registered (they offer: ", absl::StrJoin(kinds, ", "), ")"));
}

PendingJob Coordinator::AsPending(const JobEntry& e, int64_t now) const {
  const v1::Job& j = e.job;
  PendingJob p{j.job_id(), j.world(), j.device(), {}};
  // A recovering job shrinks only once its former ranks' workers cannot
  // come back (recovery.cc).
  if (j.state() == v1::JOB_STATE_RECOVERING && !AwaitingFormerRanks(e, now))
    p.fallback_worlds = ElasticWorlds(e.valid->spec, e.valid->dims);
  p.precision = std::string(EnumName(e.valid->spec.precision));
  p.passed_over = e.passed_over;
  return p;
}

void Coordinator::CollectWorkers(int64_t now, std::vector<const FreeWorker*>* free,
                                 std::vector<const FreeWorker*>* alive) const {
  // workers_ is in registration order, and each entry carries its
  // schedulable view: nothing is copied or sorted here.
  free->reserve(workers_.size());
  alive->reserve(workers_.size());
  for (const auto& [id, w] : workers_) {
    if (w.info.state() != v1::WORKER_STATE_ALIVE) continue;
    alive->push_back(&w.schedulable);
    if (Schedulable(w, now)) free->push_back(&w.schedulable);  // recovery.cc
  }
}

void Coordinator::ScheduleLocked(bool force) {
  if (!force && settled_inputs_ == schedule_inputs_) return;  // it would decide the same
  const int64_t now = clock_->NowMs();
  const uint64_t inputs = schedule_inputs_;
  last_pass_ms_ = now;
  std::vector<PendingJob> fifo;
  for (const std::string& id : job_order_) {
    const JobEntry& e = jobs_.at(id);
    if (!WaitsForWorkers(e.job.state()) || !e.valid) continue;  // only terminal jobs lack a spec
    fifo.push_back(AsPending(e, now));
  }
  std::vector<const FreeWorker*> free, alive;
  if (!fifo.empty()) CollectWorkers(now, &free, &alive);
  const SchedulePass pass = RunSchedulePass(fifo, free, alive, options_.reserve_after);
  reserved_ = pass.reserved;
  ApplyPass(pass);
  // Placing jobs changed the queue (and passed_over may add reservations):
  // the next pass runs. A pass that placed nothing settled it.
  if (pass.placements.empty()) settled_inputs_ = inputs;
}

void Coordinator::ScheduleSubmittedLocked(JobEntry& e) {
  if (settled_inputs_ != schedule_inputs_ || !e.valid) return ScheduleLocked();
  // The queue is as the last pass left it, so a whole pass would see every
  // earlier job wait again and then reach this one with the same free
  // workers and reservations: consider this one alone.
  const int64_t now = clock_->NowMs();
  std::vector<const FreeWorker*> free, alive;
  CollectWorkers(now, &free, &alive);
  const SchedulePass pass =
      RunSchedulePass({AsPending(e, now)}, free, alive, options_.reserve_after, reserved_);
  reserved_ = pass.reserved;
  if (pass.placements.empty()) {
    ApplyPass(pass);
    settled_inputs_ = schedule_inputs_;
    return;
  }
  // Backfill: every earlier job of its device kind waits, and was passed
  // over (as in a whole pass's `unplaced`).
  SchedulingInputsChanged();
  for (const std::string& id : job_order_) {
    JobEntry& other = jobs_.at(id);
    if (&other != &e && other.valid && WaitsForWorkers(other.job.state()) &&
        other.job.device() == e.job.device()) {
      ++other.passed_over;
    }
  }
  ApplyPass(pass);  // its transition marks the inputs changed: the next pass runs
}

void Coordinator::ApplyPass(const SchedulePass& pass) {
  for (const std::string& id : pass.passed_over) ++jobs_.at(id).passed_over;
  for (const auto& [id, why] : pass.waiting) jobs_.at(id).job.set_pending_reason(why);
  for (const Placement& p : pass.placements) {
    JobEntry& e = jobs_.at(p.job_id);
    const v1::Job before = e.job;
    std::optional<ValidSpec> shrunk;
    std::string elastic;
    if (static_cast<int>(p.workers.size()) != e.job.world()) {
      // Elastic recovery on fewer workers: the same global batch over a
      // smaller dp, with more accumulation (the sampler makes it the same
      // batch, so the loss curve continues).
      const ParallelDims& dims = e.valid->dims;
      const int dp = static_cast<int>(p.workers.size()) / (dims.cp() * dims.tp() * dims.pp());
      absl::StatusOr<ValidSpec> v =
          Validate(JobSpecToYaml(e.valid->spec), {absl::StrCat("parallel.dp=", dp)});
      if (!v.ok() || v->dims.world() != static_cast<int>(p.workers.size())) continue;
      elastic = absl::StrCat(" (elastic: world ", e.job.world(), " -> ", v->dims.world(), ")");
      e.job.set_spec_yaml(JobSpecToYaml(v->spec));
      e.job.set_world(v->dims.world());
      shrunk = *std::move(v);
    }
    const JobSpec& spec = shrunk ? shrunk->spec : e.valid->spec;
    absl::StatusOr<v1::Plan> plan = PlanOrError(spec, e.job.world());
    if (!plan.ok()) {
      // A spec that cannot be planned never will be: the job fails, with
      // the reason, instead of being retried at every pass.
      e.job = before;
      const std::string why =
          Truncate(absl::StrCat("cannot plan the job: ", plan.status().message()), kMaxEventBytes);
      std::cerr << "shardtrain-coordinator: job " << p.job_id << ": " << why << std::endl;
      e.job.set_failure_reason(why);
      e.job.clear_pending_reason();
      if (!Transition(e, v1::JOB_STATE_FAILED, why).ok()) e.job = before;  // next pass retries
      continue;
    }
    e.job.set_generation(e.job.generation() + 1);
    e.job.clear_ranks();
    e.job.clear_done_ranks();
    e.job.clear_pending_reason();
    for (size_t r = 0; r < p.workers.size(); ++r) {
      v1::RankAssignment* a = e.job.add_ranks();
      a->set_rank(static_cast<int>(r));
      a->set_worker_id(p.workers[r]);
      a->set_collective_address(workers_.at(p.workers[r]).info.collective_address());
    }
    plan->set_job_id(e.job.job_id());
    plan->set_generation(e.job.generation());
    for (v1::RankPlan& r : *plan->mutable_ranks()) r.set_worker_id(p.workers[r.rank()]);
    if (!store_->PutPlan(*plan).ok() ||
        !Transition(e, v1::JOB_STATE_SCHEDULED,
                    absl::StrCat("generation ", e.job.generation(), " on ", p.workers.size(),
                                 " workers", elastic))
             .ok()) {
      e.job = before;  // try again at the next scheduling pass
      continue;
    }
    if (shrunk) e.valid = *std::move(shrunk);
    e.plan = *std::move(plan);
    e.has_plan = true;
    e.passed_over = 0;
    e.started.clear();
    e.shards.clear();  // reports of an earlier generation never count for this one
    e.shard_failures.clear();
    kv_.DropJob(e.job.job_id());  // earlier generations' keys are dead
    for (size_t r = 0; r < p.workers.size(); ++r) {
      WorkerEntry& w = workers_.at(p.workers[r]);
      w.info.set_job_id(p.job_id);
      w.info.set_rank(static_cast<int>(r));
    }
  }
}

}  // namespace shardtrain::coordinator
