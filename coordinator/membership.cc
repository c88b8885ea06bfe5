// Membership: workers registering (each id bound to its secret) and
// heartbeating (lease renewal and the reconciliation that answers with run /
// abort / drain commands, each run carrying the assignment's lease token).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "coordinator/coordinator.h"
#include "coordinator/fencing.h"

namespace shardtrain::coordinator {

absl::StatusOr<v1::RegisterWorkerResponse> Coordinator::RegisterWorker(
    const v1::RegisterWorkerRequest& req) {
  if (req.devices_size() == 0) return absl::InvalidArgumentError("devices: at least one needed");
  if (auto s = CheckRegisterRequest(req); !s.ok()) return s;
  if (req.collective_address().empty()) {
    return absl::InvalidArgumentError("collective_address: must not be empty");
  }
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t now = clock_->NowMs();
  std::string id = req.previous_worker_id();
  auto it = workers_.find(id);
  const bool rejoin = it != workers_.end() && it->second.info.state() != v1::WORKER_STATE_DEAD;
  if (rejoin && !SecretEquals(req.worker_secret(), options_.fencing_key.WorkerSecret(id))) {
    // Only the worker that registered the id holds its secret: anyone else
    // asking for a live id is taking it over (bug 4), refused.
    return absl::PermissionDeniedError(absl::StrCat(
        "worker ", id, " is alive and the request lacks its secret: not taking it over"));
  }
  if (!rejoin) id = absl::StrFormat("w-%04d", next_worker_++);
  WorkerEntry& e = workers_[id];
  v1::WorkerInfo info = e.info;
  info.set_worker_id(id);
  info.set_host(req.host());
  info.set_collective_address(req.collective_address());
  *info.mutable_device() = req.devices(0);
  info.set_host_memory_bytes(req.host_memory_bytes());
  info.set_threads(req.threads());
  info.set_metrics_address(req.metrics_address());
  info.set_checkpoint_root(req.checkpoint_root());
  info.set_data_root(req.data_root());
  info.set_state(v1::WORKER_STATE_ALIVE);
  info.set_last_heartbeat_ms(now);
  if (!rejoin) info.set_registered_ms(now);
  v1::WorkerInfo durable = info;
  durable.clear_job_id();
  durable.set_rank(0);
  if (auto s = store_->PutWorker(durable); !s.ok()) {
    if (!rejoin) workers_.erase(id);
    return s;
  }
  e.SetInfo(std::move(info));
  AddCapabilities(e.schedulable);
  SchedulingInputsChanged();
  e.lease_until = now + options_.lease_ms;
  e.awaiting_heartbeat = false;
  ScheduleLocked();
  v1::RegisterWorkerResponse resp;
  resp.set_worker_id(id);
  resp.set_worker_secret(options_.fencing_key.WorkerSecret(id));
  resp.set_lease_ms(options_.lease_ms);
  return resp;
}

absl::StatusOr<v1::HeartbeatResponse> Coordinator::Heartbeat(const v1::HeartbeatRequest& req) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(req.worker_id());
  if (it == workers_.end() || it->second.info.state() == v1::WORKER_STATE_DEAD) {
    return absl::NotFoundError(
        absl::StrCat("worker ", req.worker_id(), " is not registered (or was declared DEAD)"));
  }
  if (!SecretEquals(req.worker_secret(), options_.fencing_key.WorkerSecret(req.worker_id()))) {
    // Checked before the lease is renewed: a forged heartbeat neither keeps
    // a worker alive nor learns its assignment (bug 4).
    return absl::PermissionDeniedError(
        absl::StrCat("heartbeat for worker ", req.worker_id(), " without its secret"));
  }
  WorkerEntry& w = it->second;
  const int64_t now = clock_->NowMs();
  const bool was_schedulable = Schedulable(w, now);
  w.lease_until = now + options_.lease_ms;
  w.awaiting_heartbeat = false;
  w.info.set_last_heartbeat_ms(now);
  if (!was_schedulable && Schedulable(w, now)) SchedulingInputsChanged();  // the next Tick places
  RecordCollectives(req, w);

  v1::HeartbeatResponse resp;
  resp.set_lease_ms(options_.lease_ms);
  const std::string& want_job = w.info.job_id();
  JobEntry* e = want_job.empty() ? nullptr : FindJob(want_job);
  const bool rank_done =
      e && std::count(e->job.done_ranks().begin(), e->job.done_ranks().end(), w.info.rank()) > 0;
  const bool want_run = e && !IsTerminal(e->job.state()) && !rank_done;
  const bool runs_wanted =
      want_run && req.job_id() == want_job && req.generation() == e->job.generation();
  if (!req.job_id().empty() && !runs_wanted && !(rank_done && req.job_id() == want_job)) {
    v1::AbortJob* abort = resp.add_commands()->mutable_abort();
    abort->set_job_id(req.job_id());
    abort->set_generation(req.generation());
    const JobEntry* running = FindJob(req.job_id());
    abort->set_reason(running && IsTerminal(running->job.state())
                          ? absl::StrCat("job is ", JobStateLabel(running->job.state()))
                          : "stale assignment");
  }
  if (want_run && !runs_wanted) {
    v1::RunAssignment* run = resp.add_commands()->mutable_run();
    run->set_job_id(want_job);
    run->set_generation(e->job.generation());
    run->set_rank(w.info.rank());
    run->set_world(e->job.world());
    run->set_spec_yaml(e->job.spec_yaml());
    run->set_lease_token(options_.fencing_key.LeaseToken(want_job, e->job.generation()));
    if (e->job.checkpoints_size() > 0) {
      const v1::CheckpointInfo& last = *e->job.checkpoints().rbegin();
      run->set_resume_from(last.dir());
      run->set_resume_step(last.step());
    } else {
      run->set_resume_from(e->job.resume_from());
    }
  }
  if (runs_wanted && e->job.state() == v1::JOB_STATE_SCHEDULED) {
    e->started.insert(w.info.rank());
    if (static_cast<int>(e->started.size()) == e->job.world()) {
      // Every rank acknowledged the generation: the gang runs.
      if (auto s = Transition(*e, v1::JOB_STATE_RUNNING, "all ranks started"); !s.ok()) return s;
    }
  }
  if (w.info.state() == v1::WORKER_STATE_DRAINING && want_job.empty()) {
    resp.add_commands()->mutable_drain()->set_reason("worker is draining");
  }
  return resp;
}

absl::Status Coordinator::CheckLease(const std::string& job_id, int64_t generation,
                                     const std::string& lease_token) const {
  // The KV's rule on the job's state and generation (listing.cc), then the
  // token of that generation.
  if (auto s = CheckKvAccess(job_id, generation); !s.ok()) return s;
  if (!SecretEquals(lease_token, options_.fencing_key.LeaseToken(job_id, generation))) {
    return absl::PermissionDeniedError(
        absl::StrCat("wrong lease token for generation ", generation, " of job ", job_id,
                     ": only the ranks it was assigned to may do this"));
  }
  return absl::OkStatus();
}

absl::Status Coordinator::CheckLeaseToken(const JobEntry& e, const std::string& lease_token) const {
  if (!SecretEquals(lease_token,
                    options_.fencing_key.LeaseToken(e.job.job_id(), e.job.generation()))) {
    return absl::PermissionDeniedError(
        absl::StrCat("wrong lease token for generation ", e.job.generation(), " of job ",
                     e.job.job_id(), ": only the ranks it was assigned to may do this"));
  }
  return absl::OkStatus();
}

}  // namespace shardtrain::coordinator
