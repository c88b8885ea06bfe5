// The coordinator core, part 2: what ranks report (steps, completion,
// failures, events) and what a failure does to its job (recovery or
// failure). Part 1, membership, jobs and scheduling, is coordinator.cc;
// part 3, checkpoint commits, is checkpoints.cc.
#include "coordinator/reports.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/parallel_dims.h"
#include "common/text_bounds.h"
#include "coordinator/admission.h"
#include "coordinator/coordinator.h"

namespace shardtrain::coordinator {

// ------------------------------------------------------------------ reports

absl::Status Coordinator::CheckRank(const JobEntry& e, int64_t generation, int rank,
                                    const std::string& worker_id,
                                    const std::string& lease_token) const {
  if (IsTerminal(e.job.state()) || e.job.state() == v1::JOB_STATE_PENDING) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", e.job.job_id(), " is ", JobStateLabel(e.job.state()), ", not running"));
  }
  if (generation != e.job.generation()) {
    return absl::AbortedError(absl::StrCat("job ", e.job.job_id(), " is at generation ",
                                           e.job.generation(), ", report is for ", generation));
  }
  if (auto s = CheckLeaseToken(e, lease_token); !s.ok()) return s;
  if (rank < 0 || rank >= e.job.ranks_size() || e.job.ranks(rank).worker_id() != worker_id) {
    return absl::AbortedError(
        absl::StrCat("rank ", rank, " of job ", e.job.job_id(), " is not held by ", worker_id));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::ReportStepResponse> Coordinator::ReportStep(const v1::ReportStepRequest& req) {
  const v1::StepReport& r = req.report();
  std::lock_guard<std::mutex> lock(mu_);
  JobEntry* e = FindJob(r.job_id());
  if (!e) return absl::NotFoundError(absl::StrCat("job ", r.job_id(), " not found"));
  v1::ReportStepResponse resp;
  if (IsTerminal(e->job.state())) {
    resp.set_abort(true);
    return resp;
  }
  if (auto s = CheckRank(*e, r.generation(), r.rank(), req.worker_id(), req.lease_token()); !s.ok())
    return s;
  if (r.step() < 1 || r.step() > e->job.progress().total_steps()) {
    return absl::InvalidArgumentError(
        absl::StrCat("step: ", r.step(), " is outside 1..", e->job.progress().total_steps()));
  }
  if (e->job.state() == v1::JOB_STATE_SCHEDULED) {
    if (auto s = Transition(*e, v1::JOB_STATE_RUNNING, "first step reported"); !s.ok()) return s;
  }
  // A report of a step this generation already recorded is a rank's re-send
  // after a restart (worker/report_outbox.h): the history keeps it once.
  auto recorded = e->history.find(r.step());
  if (recorded == e->history.end() || recorded->second.generation() != r.generation()) {
    e->partial[r.step()].by_rank[r.rank()] = r;
    if (static_cast<int>(e->partial[r.step()].by_rank.size()) == e->job.world()) {
      if (absl::Status s = FinishStep(*e, r.step()); !s.ok()) {
        // Not durable: this report is refused (the rank sends it again), the
        // others stay held.
        e->partial[r.step()].by_rank.erase(r.rank());
        return s;
      }
    }
  }
  resp.set_coordinator_instance(instance_);
  resp.set_incomplete_from_step(e->partial.empty() ? 0 : e->partial.begin()->first);
  resp.set_committed_step(e->job.progress().last_committed_checkpoint_step());
  return resp;
}

// The job's report of one step, from every rank's (by_rank: rank -> its
// report; one from each rank of `dims`). Each field has one rule, by the
// ranks' places in the mesh:
//   loss           the mean over the ranks that speak for a data-parallel
//                  replica (ParallelDims::SpeaksForReplica: last pipeline
//                  stage, tp rank 0); the other ranks' losses are ignored
//                  (with pipelines only the last stage computes one);
//   val_loss       the same rule as loss, over those of the speaking ranks
//                  whose report carries one (every replica evaluates on the
//                  same steps, so that is all or none); absent when none does;
//   tokens_per_s   the sum over those same ranks: each replica's tokens
//                  once, not once per tp or pp rank that also saw them;
//   grad_norm      the max over all ranks: every rank holds the same global
//                  norm, so a disagreement shows as the larger value;
//   lr             rank 0's (every rank runs the same schedule), as are mfu
//                  and loss_scale;
//   skipped        whether any rank skipped the step (fp16 overflow: every
//                  rank sees the same global gradients, so that is all or
//                  none; a disagreement shows as skipped);
//   step_ms, comm_ms, peak_rss_bytes, comm_bytes, time_ms: the worst
//                  (largest) over all ranks;
//   moe_aux_loss, moe_z_loss: each pipeline stage's layers' (tp rank 0's),
//                  the mean over its dp × cp ranks, summed over the stages;
//   moe_max_load   the max over all ranks; moe_dropped the mean over the
//                  ranks with MoE layers (tp rank 0's).
v1::StepReport AggregateStep(const ParallelDims& dims,
                             const std::map<int, v1::StepReport>& by_rank) {
  v1::StepReport agg = by_rank.begin()->second;
  double loss = 0, norm = 0, tps = 0, val_loss = 0;
  int speakers = 0, evaluated = 0;
  for (const auto& [rank, r] : by_rank) {
    if (dims.SpeaksForReplica(rank)) {
      loss += r.loss();
      tps += r.tokens_per_s();
      ++speakers;
      if (r.has_val_loss()) {
        val_loss += r.val_loss();
        ++evaluated;
      }
    }
    norm = std::max(norm, r.grad_norm());
    agg.set_step_ms(std::max(agg.step_ms(), r.step_ms()));
    agg.set_comm_ms(std::max(agg.comm_ms(), r.comm_ms()));
    agg.set_peak_rss_bytes(std::max(agg.peak_rss_bytes(), r.peak_rss_bytes()));
    agg.set_comm_bytes(std::max(agg.comm_bytes(), r.comm_bytes()));
    agg.set_time_ms(std::max(agg.time_ms(), r.time_ms()));
    if (r.skipped()) agg.set_skipped(true);
  }
  agg.set_rank(0);
  agg.set_loss(speakers > 0 ? loss / speakers : 0);
  agg.clear_val_loss();
  if (evaluated > 0) agg.set_val_loss(val_loss / evaluated);
  agg.set_grad_norm(norm);
  agg.set_tokens_per_s(tps);
  // MoE: per stage, the mean over its replicas (tp rank 0 speaks for its
  // group: every tp rank routes alike).
  std::map<int, std::pair<double, int>> aux, z;  // stage -> (sum, ranks)
  double max_load = 0, dropped = 0;
  int moe_ranks = 0;
  for (const auto& [rank, r] : by_rank) {
    if (r.moe_max_load() <= 0 || dims.Coord(rank).tp != 0) continue;
    const int stage = dims.Coord(rank).pp;
    aux[stage].first += r.moe_aux_loss();
    aux[stage].second++;
    z[stage].first += r.moe_z_loss();
    z[stage].second++;
    max_load = std::max(max_load, r.moe_max_load());
    dropped += r.moe_dropped();
    ++moe_ranks;
  }
  double aux_sum = 0, z_sum = 0;
  for (const auto& [stage, v] : aux) aux_sum += v.first / v.second;
  for (const auto& [stage, v] : z) z_sum += v.first / v.second;
  agg.set_moe_aux_loss(aux_sum);
  agg.set_moe_z_loss(z_sum);
  agg.set_moe_max_load(max_load);
  agg.set_moe_dropped(moe_ranks > 0 ? dropped / moe_ranks : 0);
  return agg;
}

absl::Status Coordinator::FinishStep(JobEntry& e, int64_t step) {
  // The reports are of the current generation, laid out by its plan. A plan
  // whose mesh does not match the job (not made by MakePlan for it) counts
  // every rank as its own replica.
  absl::StatusOr<ParallelDims> dims = ParallelDims::Create(
      ParallelDims::Factors{e.plan.dp(), std::max(1, e.plan.cp()), e.plan.tp(), e.plan.pp()},
      e.job.world());
  if (!dims.ok()) dims = ParallelDims::Create(e.job.world(), 1, 1);
  const v1::StepReport agg = AggregateStep(*dims, e.partial[step].by_rank);
  if (absl::Status s = store_->PutStep(agg); !s.ok()) return s;
  e.partial.erase(step);
  e.history[step] = agg;
  v1::JobProgress* p = e.job.mutable_progress();
  if (step >= p->step()) {
    p->set_step(step);
    p->set_loss(agg.loss());
    p->set_tokens_per_s(agg.tokens_per_s());
    p->set_step_ms(agg.step_ms());
  }
  std::string message = absl::StrFormat("step %d/%d loss %.4f", step, p->total_steps(), agg.loss());
  if (agg.skipped()) {
    ++e.skipped_steps;
    absl::StrAppendFormat(&message, "; skipped (fp16 overflow at loss scale %g)", agg.loss_scale());
  }
  AppendEvent(e, v1::EVENT_KIND_STEP, message, &agg).IgnoreError();
  return absl::OkStatus();
}

absl::Status Coordinator::ReportDone(const v1::ReportDoneRequest& req) {
  std::lock_guard<std::mutex> lock(mu_);
  JobEntry* e = FindJob(req.job_id());
  if (!e) return absl::NotFoundError(absl::StrCat("job ", req.job_id(), " not found"));
  if (auto s = CheckRank(*e, req.generation(), req.rank(), req.worker_id(), req.lease_token());
      !s.ok())
    return s;
  const auto& done = e->job.done_ranks();
  if (std::count(done.begin(), done.end(), req.rank()) > 0) return absl::OkStatus();
  e->job.add_done_ranks(req.rank());
  if (req.rank() == 0 && !req.output().empty()) {
    e->job.set_output(Truncate(req.output(), kMaxPathBytes));
  }
  if (e->job.done_ranks_size() < e->job.world()) {
    return store_->PutJob(e->job);
  }
  absl::Status s = Transition(
      *e, v1::JOB_STATE_SUCCEEDED,
      absl::StrCat("all ", e->job.world(), " ranks finished ", req.steps(), " steps",
                   e->job.output().empty() ? "" : absl::StrCat("; weights in ", e->job.output())));
  ScheduleLocked();
  return s;
}

absl::Status Coordinator::ReportEvent(const v1::ReportEventRequest& req) {
  std::lock_guard<std::mutex> lock(mu_);
  JobEntry* e = FindJob(req.job_id());
  if (!e) return absl::NotFoundError(absl::StrCat("job ", req.job_id(), " not found"));
  if (auto s = CheckRank(*e, req.generation(), req.rank(), req.worker_id(), req.lease_token());
      !s.ok())
    return s;
  return AppendEvent(*e, req.warning() ? v1::EVENT_KIND_WARNING : v1::EVENT_KIND_LOG,
                     absl::StrCat("rank ", req.rank(), ": ", req.message()), nullptr);
}

absl::Status Coordinator::ReportFailure(const v1::ReportFailureRequest& req) {
  std::lock_guard<std::mutex> lock(mu_);
  JobEntry* e = FindJob(req.job_id());
  if (!e) return absl::NotFoundError(absl::StrCat("job ", req.job_id(), " not found"));
  if (IsTerminal(e->job.state()) || e->job.state() == v1::JOB_STATE_RECOVERING) {
    return absl::OkStatus();  // already over, or already recovering from this generation
  }
  if (auto s = CheckRank(*e, req.generation(), req.rank(), req.worker_id(), req.lease_token());
      !s.ok())
    return s;
  std::string reason =
      absl::StrCat("rank ", req.rank(), " (worker ", req.worker_id(), ")",
                   req.step() > 0 ? absl::StrCat(" at step ", req.step()) : "", ": ", req.reason());
  for (const v1::CollectiveRecord& c : req.recent_collectives()) {
    if (c.state() != "done") {
      absl::StrAppend(&reason, "; collective #", c.seq(), " ", c.op(), " on ", c.group(), " ",
                      c.state());
    }
  }
  FailOrRecover(*e, reason, req.permanent());
  ScheduleLocked();
  return absl::OkStatus();
}

void Coordinator::FailOrRecover(JobEntry& e, const std::string& raw_reason, bool permanent) {
  // Reasons come from reports: one bounded line, as events are.
  const std::string reason = SanitizeLine(raw_reason);
  HoldForHeartbeat(e);
  e.job.set_failure_reason(reason);
  const int max_restarts = e.valid ? e.valid->spec.max_restarts : 0;
  if (permanent) {
    std::string why = absl::StrCat(reason, " (permanent: a retry cannot fix it; not restarted)");
    e.job.set_failure_reason(why);
    Transition(e, v1::JOB_STATE_FAILED, why).IgnoreError();
    return;
  }
  if (e.job.restarts() >= max_restarts) {
    std::string why = absl::StrCat(reason, " (no restarts left: max_restarts ", max_restarts, ")");
    e.job.set_failure_reason(why);
    Transition(e, v1::JOB_STATE_FAILED, why).IgnoreError();
    return;
  }
  e.job.set_restarts(e.job.restarts() + 1);
  if (e.job.state() == v1::JOB_STATE_SCHEDULED) {
    // The gang never started (a rank died before acknowledging): queue again.
    if (Transition(e, v1::JOB_STATE_PENDING,
                   absl::StrCat(reason, "; re-queued (", e.job.restarts(), "/", max_restarts, ")"))
            .ok()) {
      ReleaseWorkers(e);
    }
    return;
  }
  const std::string from =
      e.job.checkpoints_size() > 0
          ? absl::StrCat("resuming from committed step ", e.job.checkpoints().rbegin()->step())
          : "no committed checkpoint: restarting from step 0";
  if (!Transition(
           e, v1::JOB_STATE_RECOVERING,
           absl::StrCat(reason, "; recovery ", e.job.restarts(), "/", max_restarts, ", ", from))
           .ok()) {
    return;
  }
  // The generation's ranks go back to the pool; its reports are stale now.
  ReleaseWorkers(e);
  e.partial.clear();
  e.shards.clear();
  e.shard_failures.clear();
}

}  // namespace shardtrain::coordinator
