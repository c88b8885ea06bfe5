#include "coordinator/coordinator.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/job_spec.h"
#include "common/job_state.h"
#include "common/planner.h"
#include "common/spec_paths.h"
#include "common/text_bounds.h"
#include "coordinator/scheduler.h"

namespace shardtrain::coordinator {

// Tick's whole scheduling pass at least this often, even when nothing
// changed: the waiting reasons' counts stay fresh.
constexpr int64_t kSchedulePassEveryMs = 5000;
// Warnings a job keeps (Job.warnings); its events keep them all.
constexpr int kMaxJobWarnings = 10;
namespace {

JobState ToDomain(v1::JobState s) {
  switch (s) {
    case v1::JOB_STATE_SCHEDULED:
      return JobState::kScheduled;
    case v1::JOB_STATE_RUNNING:
      return JobState::kRunning;
    case v1::JOB_STATE_RECOVERING:
      return JobState::kRecovering;
    case v1::JOB_STATE_SUCCEEDED:
      return JobState::kSucceeded;
    case v1::JOB_STATE_FAILED:
      return JobState::kFailed;
    case v1::JOB_STATE_CANCELLED:
      return JobState::kCancelled;
    default:
      return JobState::kPending;
  }
}

std::string StripPrefix(const std::string& name, const std::string& prefix) {
  return name.rfind(prefix, 0) == 0 ? name.substr(prefix.size()) : name;
}

// Parses the number of "w-0007" / "j-000012"; 0 when it is not one.
int64_t IdNumber(const std::string& id) {
  long long n = 0;
  return std::sscanf(id.c_str(), "%*c-%lld", &n) == 1 ? n : 0;
}

}  // namespace

std::string JobStateLabel(v1::JobState s) {
  return StripPrefix(v1::JobState_Name(s), "JOB_STATE_");
}
std::string WorkerStateLabel(v1::WorkerState s) {
  return StripPrefix(v1::WorkerState_Name(s), "WORKER_STATE_");
}
bool IsTerminal(v1::JobState s) { return shardtrain::IsTerminal(ToDomain(s)); }
bool WaitsForWorkers(v1::JobState s) {
  return s == v1::JOB_STATE_PENDING || s == v1::JOB_STATE_RECOVERING;
}

namespace {

// 16 hex digits from the system's entropy (not secret: it only has to differ
// between two processes).
std::string NewInstanceId() {
  std::random_device rd;
  const uint64_t id = (uint64_t{rd()} << 32) ^ rd();
  return absl::StrFormat("%016x", id);
}

}  // namespace

Coordinator::Coordinator(CoordinatorOptions options, std::unique_ptr<StateStore> store,
                         SpecValidator validator, const Clock* clock)
    : options_(options),
      store_(std::move(store)),
      validator_(std::move(validator)),
      clock_(clock),
      instance_(NewInstanceId()) {}

Coordinator::~Coordinator() { Shutdown(); }

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(CoordinatorOptions options,
                                                                 std::unique_ptr<StateStore> store,
                                                                 SpecValidator validator,
                                                                 const Clock* clock) {
  std::unique_ptr<Coordinator> c(
      new Coordinator(options, std::move(store), std::move(validator), clock));
  if (auto s = c->Load(); !s.ok()) return s;
  return c;
}

absl::Status Coordinator::Load() {
  auto state = store_->Load();
  if (!state.ok()) return state.status();
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t now = clock_->NowMs();
  for (v1::WorkerInfo& w : state->workers) {
    WorkerEntry& e = workers_[w.worker_id()];
    w.clear_job_id();
    w.set_rank(0);
    e.SetInfo(std::move(w));
    AddCapabilities(e.schedulable);
    e.lease_until = now + options_.lease_ms;  // grace period to re-attach
    next_worker_ = std::max(next_worker_, IdNumber(e.info.worker_id()) + 1);
  }
  for (v1::Job& j : state->jobs) {
    JobEntry& e = jobs_[j.job_id()];
    e.job = std::move(j);
    job_order_.push_back(e.job.job_id());
    next_job_ = std::max(next_job_, IdNumber(e.job.job_id()) + 1);
    if (!e.job.idempotency_key().empty()) submit_keys_[e.job.idempotency_key()] = e.job.job_id();
  }
  for (v1::JobEvent& ev : state->events) {
    if (JobEntry* e = FindJob(ev.job_id())) e->events.push_back(std::move(ev));
  }
  for (v1::StepReport& s : state->steps) {
    if (JobEntry* e = FindJob(s.job_id())) e->history[s.step()] = std::move(s);
  }
  // The job record is written on transitions, the history on every step:
  // progress is the newest step the history holds.
  for (auto& [id, e] : jobs_) {
    if (e.history.empty()) continue;
    const v1::StepReport& last = e.history.rbegin()->second;
    v1::JobProgress* p = e.job.mutable_progress();
    if (last.step() <= p->step()) continue;
    p->set_step(last.step());
    p->set_loss(last.loss());
    p->set_tokens_per_s(last.tokens_per_s());
    p->set_step_ms(last.step_ms());
  }
  for (v1::Plan& p : state->plans) {
    if (JobEntry* e = FindJob(p.job_id())) {
      e->plan = std::move(p);
      e->has_plan = true;
    }
  }
  // Each stored spec is validated once, here. One the validator refuses now
  // (a field since removed, a stricter rule) fails its job instead of
  // stopping the coordinator; a store that refuses to record that does stop
  // it, so every job that can still run has its spec.
  for (const std::string& id : job_order_) {
    JobEntry& e = jobs_.at(id);
    absl::StatusOr<ValidSpec> valid = Validate(e.job.spec_yaml(), {});
    if (valid.ok()) {
      e.valid = *std::move(valid);
      continue;
    }
    if (IsTerminal(e.job.state())) continue;
    const std::string why =
        absl::StrCat("stored spec no longer validates: ", valid.status().message());
    const v1::Job before = e.job;
    e.job.set_failure_reason(why);
    if (auto s = Transition(e, v1::JOB_STATE_FAILED, why); !s.ok()) {
      e.job = before;
      return s;
    }
  }
  // Re-derive assignments from the jobs that still hold workers.
  for (auto& [id, e] : jobs_) {
    if (IsTerminal(e.job.state()) || e.job.state() == v1::JOB_STATE_PENDING) continue;
    for (const v1::RankAssignment& r : e.job.ranks()) {
      auto it = workers_.find(r.worker_id());
      if (it == workers_.end()) continue;
      it->second.info.set_job_id(id);
      it->second.info.set_rank(r.rank());
    }
  }
  return absl::OkStatus();
}

// ------------------------------------------------------------------ membership
// RegisterWorker and Heartbeat: membership.cc.

v1::ListWorkersResponse Coordinator::ListWorkers() const {
  std::lock_guard<std::mutex> lock(mu_);
  v1::ListWorkersResponse resp;  // workers_ is in registration order
  for (const auto& [id, w] : workers_) *resp.add_workers() = w.info;
  return resp;
}

void Coordinator::Tick() {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t now = clock_->NowMs();
  for (auto& [id, w] : workers_) {
    if (w.info.state() == v1::WORKER_STATE_DEAD || now <= w.lease_until) continue;
    v1::WorkerInfo durable = w.info;
    durable.set_state(v1::WORKER_STATE_DEAD);
    durable.clear_job_id();
    durable.set_rank(0);
    if (!store_->PutWorker(durable).ok()) continue;  // try again next tick
    w.info.set_state(v1::WORKER_STATE_DEAD);
    if (JobEntry* e = w.info.job_id().empty() ? nullptr : FindJob(w.info.job_id())) {
      if (!IsTerminal(e->job.state())) {
        FailOrRecover(*e, absl::StrCat("worker ", id, " (rank ", w.info.rank(),
                                       ") missed its lease of ", options_.lease_ms, " ms"));
      }
    }
    w.info.clear_job_id();
    SchedulingInputsChanged();
  }
  // Time alone changes nothing a pass decides (a worker going quiet only
  // leaves the free pool; its lease running out is an event above), but a
  // whole pass every few seconds refreshes the waiting reasons' counts.
  ScheduleLocked(/*force=*/now - last_pass_ms_ >= kSchedulePassEveryMs);
}

// ------------------------------------------------------------------ jobs

absl::StatusOr<v1::Job> Coordinator::SubmitJob(const v1::SubmitJobRequest& req,
                                               const std::string& owner) {
  if (auto s = CheckSubmitRequest(req, options_.limits); !s.ok()) return s;
  if (!req.idempotency_key().empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = submit_keys_.find(req.idempotency_key());
    if (it != submit_keys_.end()) {
      if (const JobEntry* known = FindJob(it->second)) return known->job;  // a retry
    }
  }
  std::vector<std::string> overrides(req.overrides().begin(), req.overrides().end());
  absl::StatusOr<ValidSpec> valid = Validate(req.spec_yaml(), overrides);
  if (!valid.ok()) return valid.status();
  if (auto s = CheckRelativePathStaysInside("resume_from", req.resume_from()); !s.ok()) return s;
  const JobSpec& spec = valid->spec;
  const ParallelDims& dims = valid->dims;
  const std::string device(EnumName(spec.resources.device));
  const std::string canonical_yaml = JobSpecToYaml(spec);
  const std::string& key = req.idempotency_key();
  std::unique_lock<std::mutex> lock(mu_);
  if (shutdown_) return absl::UnavailableError("coordinator is shutting down");
  if (!key.empty()) {
    // A concurrent submit with this key still being committed: its outcome
    // decides (its job, or a fresh try when its commit failed).
    submits_cv_.wait(lock, [&] {
      auto it = submit_keys_.find(key);
      return it == submit_keys_.end() || FindJob(it->second) != nullptr;
    });
    if (auto it = submit_keys_.find(key); it != submit_keys_.end()) {
      return jobs_.at(it->second).job;  // a concurrent retry won
    }
  }
  if (auto s = CheckRunnable(spec); !s.ok()) return s;
  const int64_t now = clock_->NowMs();
  v1::Job job;
  job.set_job_id(absl::StrFormat("j-%06d", next_job_));
  job.set_name(spec.name);
  job.set_state(v1::JOB_STATE_PENDING);
  job.set_spec_yaml(canonical_yaml);
  job.set_world(dims.world());
  job.set_submitted_ms(now);
  job.set_updated_ms(now);
  job.set_resume_from(req.resume_from());
  job.set_device(device);
  job.set_owner(owner);
  job.set_idempotency_key(key);
  job.mutable_progress()->set_total_steps(spec.steps);
  v1::JobEvent ev;
  ev.set_job_id(job.job_id());
  ev.set_seq(1);
  ev.set_time_ms(now);
  ev.set_kind(v1::EVENT_KIND_STATE);
  ev.set_state(v1::JOB_STATE_PENDING);
  ev.set_message(absl::StrCat("submitted: ", spec.name, ", world ", dims.world(), " (dp ",
                              dims.dp(), dims.cp() > 1 ? absl::StrCat(" cp ", dims.cp()) : "",
                              " tp ", dims.tp(), " pp ", dims.pp(), "), ", spec.steps, " steps on ",
                              device));
  // Durable before OK, committed outside mu_: heartbeats and every other
  // call go on during the commit's fsync (held under mu_, a stream of
  // submits starved heartbeats until leases ran out at 10,000 workers).
  // The id is taken first; one whose commit fails is never used.
  ++next_job_;
  if (!key.empty()) submit_keys_[key] = job.job_id();  // in flight: retries wait
  lock.unlock();
  const absl::Status stored = store_->PutJobWithEvent(job, ev);
  lock.lock();
  if (!stored.ok()) {
    if (!key.empty()) submit_keys_.erase(key);
    submits_cv_.notify_all();
    return stored;
  }
  JobEntry& e = jobs_[job.job_id()];
  e.job = job;
  e.valid = *std::move(valid);
  e.events.push_back(std::move(ev));
  job_order_.push_back(job.job_id());  // commit order: concurrent submits have no other
  submits_cv_.notify_all();
  events_cv_.notify_all();
  ScheduleSubmittedLocked(e);
  return e.job;
}

absl::StatusOr<v1::Job> Coordinator::GetJob(const std::string& job_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  const JobEntry* e = FindJob(job_id);
  if (!e) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
  return e->job;
}

absl::StatusOr<v1::Job> Coordinator::CancelJob(const std::string& job_id,
                                               const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  JobEntry* e = FindJob(job_id);
  if (!e) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
  if (IsTerminal(e->job.state())) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " already ended (", JobStateLabel(e->job.state()), ")"));
  }
  std::string msg = reason.empty() ? "cancelled by user" : absl::StrCat("cancelled: ", reason);
  if (auto s = Transition(*e, v1::JOB_STATE_CANCELLED, msg); !s.ok()) return s;
  ScheduleLocked();
  return e->job;
}

absl::StatusOr<std::vector<v1::JobEvent>> Coordinator::WaitEvents(const std::string& job_id,
                                                                  int64_t after_seq,
                                                                  int64_t wait_ms, bool* ended) {
  std::unique_lock<std::mutex> lock(mu_);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
  while (true) {
    if (shutdown_) return absl::UnavailableError("coordinator is shutting down");
    const JobEntry* e = FindJob(job_id);
    if (!e) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
    std::vector<v1::JobEvent> out;
    for (const v1::JobEvent& ev : e->events) {
      if (ev.seq() > after_seq) out.push_back(ev);
    }
    *ended = IsTerminal(e->job.state());
    if (!out.empty() || *ended) return out;
    if (events_cv_.wait_until(lock, deadline) == std::cv_status::timeout) return out;
  }
}

absl::StatusOr<v1::GetHistoryResponse> Coordinator::GetHistory(const std::string& job_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  const JobEntry* e = FindJob(job_id);
  if (!e) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
  v1::GetHistoryResponse resp;
  for (const auto& [step, r] : e->history) *resp.add_steps() = r;
  for (const v1::JobEvent& ev : e->events) {
    if (ev.kind() == v1::EVENT_KIND_WARNING) *resp.add_warnings() = ev;
  }
  return resp;
}

absl::StatusOr<v1::Plan> Coordinator::GetPlan(const std::string& job_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  const JobEntry* e = FindJob(job_id);
  if (!e) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
  if (!e->has_plan) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " has no plan yet (", JobStateLabel(e->job.state()), ")"));
  }
  return e->plan;
}

// ------------------------------------------------------------------ internals

absl::StatusOr<Coordinator::ValidSpec> Coordinator::Validate(
    const std::string& yaml, const std::vector<std::string>& overrides) const {
  absl::StatusOr<JobSpec> spec;
  try {
    spec = validator_(yaml, overrides);
  } catch (const std::exception& e) {
    // A spec must never take the coordinator down (at submit or at Load):
    // it is refused, or its stored job FAILS, with the reason.
    return absl::InvalidArgumentError(absl::StrCat("spec: validation failed: ", e.what()));
  }
  if (!spec.ok()) return spec.status();
  absl::StatusOr<ParallelDims> dims = spec->Dims();
  if (!dims.ok()) return dims.status();
  if (auto s = CheckSpecLimits(*spec, *dims, options_.limits); !s.ok()) return s;
  return ValidSpec{*std::move(spec), *dims};
}

Coordinator::JobEntry* Coordinator::FindJob(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : &it->second;
}
const Coordinator::JobEntry* Coordinator::FindJob(const std::string& job_id) const {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : &it->second;
}

absl::Status Coordinator::AppendEvent(JobEntry& e, v1::EventKind kind, const std::string& message,
                                      const v1::StepReport* step) {
  v1::JobEvent ev;
  ev.set_job_id(e.job.job_id());
  ev.set_seq(e.events.empty() ? 1 : e.events.back().seq() + 1);
  ev.set_time_ms(clock_->NowMs());
  ev.set_kind(kind);
  ev.set_state(e.job.state());
  ev.set_message(SanitizeLine(message));
  if (step) *ev.mutable_step() = *step;
  // A warning is kept with the job too (the newest few), for `status`.
  const v1::Job before = kind == v1::EVENT_KIND_WARNING ? e.job : v1::Job();
  if (kind == v1::EVENT_KIND_WARNING) {
    auto* warnings = e.job.mutable_warnings();
    *warnings->Add() = ev.message();
    if (warnings->size() > kMaxJobWarnings) {
      warnings->DeleteSubrange(0, warnings->size() - kMaxJobWarnings);
    }
  }
  if (auto s = store_->PutJobWithEvent(e.job, ev); !s.ok()) {
    if (kind == v1::EVENT_KIND_WARNING) e.job = before;
    return s;
  }
  e.events.push_back(std::move(ev));
  events_cv_.notify_all();
  return absl::OkStatus();
}

absl::Status Coordinator::Transition(JobEntry& e, v1::JobState to, const std::string& message) {
  if (auto s = CheckTransition(ToDomain(e.job.state()), ToDomain(to)); !s.ok()) return s;
  const v1::Job before = e.job;
  e.job.set_state(to);
  e.job.set_updated_ms(clock_->NowMs());
  if (!WaitsForWorkers(to)) {
    e.job.clear_pending_reason();  // it waits no more
  }
  if (auto s = AppendEvent(e, v1::EVENT_KIND_STATE, message, nullptr); !s.ok()) {
    e.job = before;  // not durable: not changed
    return s;
  }
  shards_cv_.notify_all();  // a generation may have ended: its waits must see it
  SchedulingInputsChanged();
  if (IsTerminal(to)) {
    ReleaseWorkers(e);
    e.partial.clear();
    kv_.DropJob(e.job.job_id());
  }
  return absl::OkStatus();
}

void Coordinator::ReleaseWorkers(JobEntry& e) {
  SchedulingInputsChanged();
  for (const v1::RankAssignment& r : e.job.ranks()) {
    auto it = workers_.find(r.worker_id());
    if (it != workers_.end() && it->second.info.job_id() == e.job.job_id()) {
      it->second.info.clear_job_id();
      it->second.info.set_rank(0);
    }
  }
}

void Coordinator::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_ = true;
  }
  events_cv_.notify_all();
  shards_cv_.notify_all();
  kv_.Shutdown();
}

std::map<std::string, int> Coordinator::WorkerCountsByState() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, int> out;
  for (int s = v1::WORKER_STATE_ALIVE; s <= v1::WORKER_STATE_DRAINING; ++s) {
    out[WorkerStateLabel(static_cast<v1::WorkerState>(s))] = 0;
  }
  for (const auto& [id, w] : workers_) ++out[WorkerStateLabel(w.info.state())];
  return out;
}

std::map<std::string, int> Coordinator::JobCountsByState() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, int> out;
  for (int s = v1::JOB_STATE_PENDING; s <= v1::JOB_STATE_CANCELLED; ++s) {
    out[JobStateLabel(static_cast<v1::JobState>(s))] = 0;
  }
  for (const auto& [id, e] : jobs_) ++out[JobStateLabel(e.job.state())];
  return out;
}

std::map<std::string, std::map<std::string, int64_t>> Coordinator::CheckpointFailuresByJob() const {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t now = clock_->NowMs();
  std::map<std::string, std::map<std::string, int64_t>> out;
  for (const auto& [id, e] : jobs_) {
    if (e.checkpoint_failures.empty()) continue;
    if (IsTerminal(e.job.state()) && now - e.job.updated_ms() > kEndedJobMetricsMs) continue;
    out[id] = e.checkpoint_failures;
  }
  return out;
}

std::map<std::string, int64_t> Coordinator::SkippedStepsOfActiveJobs() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, int64_t> out;
  for (const auto& [id, e] : jobs_) {
    if (!IsTerminal(e.job.state())) out[id] = e.skipped_steps;
  }
  return out;
}

}  // namespace shardtrain::coordinator
