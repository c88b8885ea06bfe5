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
// (tp · pp ranks each; checkpoints are in the whole model's coordinates, so
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

FreeWorker AsSchedulable(const v1::WorkerInfo& w) {
  FreeWorker f{w.worker_id(), w.device().kind(), {}};
  f.precisions.assign(w.device().precisions().begin(), w.device().precisions().end());
  return f;
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

absl::Status Coordinator::CheckRunnable(const JobSpec& spec) const {
  if (workers_.empty()) return absl::OkStatus();  // a cluster still starting: the job waits
  const std::string device(EnumName(spec.resources.device));
  const std::string precision(EnumName(spec.precision));
  std::set<std::string> kinds;
  for (const auto& [id, w] : workers_) {
    const FreeWorker f = AsSchedulable(w.info);
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

void Coordinator::ScheduleLocked() {
  std::vector<PendingJob> fifo;
  for (const std::string& id : job_order_) {
    JobEntry& e = jobs_.at(id);
    const v1::Job& j = e.job;
    if (j.state() != v1::JOB_STATE_PENDING && j.state() != v1::JOB_STATE_RECOVERING) continue;
    if (!e.valid) continue;  // not reached: only terminal jobs lack a spec
    PendingJob p{id, j.world(), j.device(), {}};
    // A recovering job shrinks only once its former ranks' workers cannot
    // come back (recovery.cc).
    if (j.state() == v1::JOB_STATE_RECOVERING && !AwaitingFormerRanks(e, clock_->NowMs()))
      p.fallback_worlds = ElasticWorlds(e.valid->spec, e.valid->dims);
    p.precision = std::string(EnumName(e.valid->spec.precision));
    p.passed_over = e.passed_over;
    fifo.push_back(std::move(p));
  }
  if (fifo.empty()) return;
  std::vector<FreeWorker> free;
  std::vector<FreeWorker> alive;
  const int64_t now = clock_->NowMs();
  for (const auto& [id, w] : workers_) {
    if (w.info.state() != v1::WORKER_STATE_ALIVE) continue;
    alive.push_back(AsSchedulable(w.info));
    if (Schedulable(w, now)) free.push_back(alive.back());  // recovery.cc
  }
  auto by_id = [](const FreeWorker& a, const FreeWorker& b) {
    return WorkerIdLess(a.worker_id, b.worker_id);
  };
  std::sort(free.begin(), free.end(), by_id);
  std::sort(alive.begin(), alive.end(), by_id);
  const SchedulePass pass = RunSchedulePass(fifo, free, alive, options_.reserve_after);
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
      const int dp = static_cast<int>(p.workers.size()) / (dims.tp() * dims.pp());
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
    e.shards.clear();             // reports of an earlier generation never count for this one
    kv_.DropJob(e.job.job_id());  // earlier generations' keys are dead
    for (size_t r = 0; r < p.workers.size(); ++r) {
      WorkerEntry& w = workers_.at(p.workers[r]);
      w.info.set_job_id(p.job_id);
      w.info.set_rank(static_cast<int>(r));
    }
  }
}

}  // namespace shardtrain::coordinator
