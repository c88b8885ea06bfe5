#include "tests/unit/worker/fake_coordinator.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/planner.h"

namespace shardtrain::worker {

// Records the request into `field` and returns the scripted error, if any;
// leaves mu_ held (as `lock`) for the rest of the call. Waiters woken by the
// notification see the call's effects: they need mu_, held until it returns.
#define FAKE_RECORD(rpc, field, r)                                  \
  std::unique_lock<std::mutex> lock(mu_);                           \
  calls_.field.push_back(r);                                        \
  changed_.notify_all();                                            \
  if (absl::Status injected = InjectedError(rpc); !injected.ok()) { \
    return injected;                                                \
  }

void FakeCoordinator::set_lease_ms(int64_t ms) {
  std::lock_guard<std::mutex> lock(mu_);
  lease_ms_ = ms;
}

void FakeCoordinator::QueueHeartbeat(absl::StatusOr<v1::HeartbeatResponse> answer) {
  std::lock_guard<std::mutex> lock(mu_);
  heartbeat_script_.push_back(std::move(answer));
}

void FakeCoordinator::Assign(std::optional<v1::RunAssignment> assignment, std::string reason) {
  std::lock_guard<std::mutex> lock(mu_);
  assigned_ = std::move(assignment);
  unassign_reason_ = std::move(reason);
}

void FakeCoordinator::FailNext(Rpc rpc, absl::Status error, int times) {
  std::lock_guard<std::mutex> lock(mu_);
  for (int i = 0; i < times; ++i) errors_[rpc].push_back(error);
}

void FakeCoordinator::SetOutage(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  outage_ = on;
}

absl::StatusOr<v1::Plan> FakeCoordinator::PlanJob(const std::string& job_id, int64_t generation,
                                                  const JobSpec& spec, int world) {
  absl::StatusOr<v1::Plan> plan = MakePlan(spec, world);
  if (!plan.ok()) return plan.status();
  plan->set_job_id(job_id);
  plan->set_generation(generation);
  SetPlan(*plan);
  return plan;
}

void FakeCoordinator::SetPlan(const v1::Plan& plan) {
  std::lock_guard<std::mutex> lock(mu_);
  plans_[plan.job_id()] = plan;
}

void FakeCoordinator::AbortAtStep(int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  abort_at_step_ = step;
}

void FakeCoordinator::set_checkpoint_keep(int keep) {
  std::lock_guard<std::mutex> lock(mu_);
  checkpoint_keep_ = std::max(keep, 1);
}

void FakeCoordinator::set_on_step(std::function<void(const v1::ReportStepRequest&)> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  on_step_ = std::move(fn);
}

FakeCoordinator::Calls FakeCoordinator::calls() const {
  std::lock_guard<std::mutex> lock(mu_);
  return calls_;
}

void FakeCoordinator::AbortOnCheckpointFailure(bool abort) {
  std::lock_guard<std::mutex> lock(mu_);
  abort_on_checkpoint_failure_ = abort;
}

std::vector<v1::CheckpointInfo> FakeCoordinator::Committed(const std::string& job_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = committed_.find(job_id);
  return it == committed_.end() ? std::vector<v1::CheckpointInfo>{} : it->second;
}

bool FakeCoordinator::WaitFor(const std::function<bool(const Calls&)>& pred,
                              absl::Duration timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  return changed_.wait_for(lock, absl::ToChronoMilliseconds(timeout), [&] { return pred(calls_); });
}

absl::Status FakeCoordinator::InjectedError(Rpc rpc) {
  if (outage_) return absl::UnavailableError("fake coordinator: outage");
  auto it = errors_.find(rpc);
  if (it == errors_.end() || it->second.empty()) return absl::OkStatus();
  absl::Status error = std::move(it->second.front());
  it->second.pop_front();
  return error;
}

absl::StatusOr<v1::RegisterWorkerResponse> FakeCoordinator::RegisterWorker(
    const v1::RegisterWorkerRequest& r) {
  FAKE_RECORD(Rpc::kRegisterWorker, registers, r);
  v1::RegisterWorkerResponse resp;
  resp.set_worker_id(r.previous_worker_id().empty() ? absl::StrCat("w-", next_worker_++)
                                                    : r.previous_worker_id());
  resp.set_lease_ms(lease_ms_);
  resp.set_worker_secret("secret-of-" + resp.worker_id());
  return resp;
}

absl::StatusOr<v1::HeartbeatResponse> FakeCoordinator::Heartbeat(const v1::HeartbeatRequest& r) {
  std::unique_lock<std::mutex> lock(mu_);
  calls_.heartbeats.push_back(r);
  calls_.heartbeat_times.push_back(Calls::Clock::now());
  changed_.notify_all();
  if (absl::Status injected = InjectedError(Rpc::kHeartbeat); !injected.ok()) {
    calls_.heartbeat_answers.push_back(injected);
    return injected;
  }
  if (!heartbeat_script_.empty()) {
    absl::StatusOr<v1::HeartbeatResponse> answer = std::move(heartbeat_script_.front());
    heartbeat_script_.pop_front();
    calls_.heartbeat_answers.push_back(answer);
    return answer;
  }
  v1::HeartbeatResponse resp;
  resp.set_lease_ms(lease_ms_);
  bool rank_done = false;
  for (const v1::ReportDoneRequest& d : calls_.dones) {
    rank_done |= assigned_ && d.job_id() == assigned_->job_id() &&
                 d.generation() == assigned_->generation() && d.rank() == assigned_->rank();
  }
  const bool want_run = assigned_ && !rank_done;
  const bool runs_assigned =
      want_run && r.job_id() == assigned_->job_id() && r.generation() == assigned_->generation();
  if (!r.job_id().empty() && !runs_assigned && !(rank_done && r.job_id() == assigned_->job_id())) {
    v1::AbortJob* abort = resp.add_commands()->mutable_abort();
    abort->set_job_id(r.job_id());
    abort->set_generation(r.generation());
    abort->set_reason(unassign_reason_);
  }
  if (want_run && !runs_assigned) *resp.add_commands()->mutable_run() = *assigned_;
  calls_.heartbeat_answers.push_back(resp);
  return resp;
}

absl::StatusOr<v1::Plan> FakeCoordinator::GetPlan(const std::string& job_id) {
  FAKE_RECORD(Rpc::kGetPlan, plan_requests, job_id);
  auto it = plans_.find(job_id);
  if (it == plans_.end()) return absl::NotFoundError(absl::StrCat("job ", job_id, " has no plan"));
  return it->second;
}

absl::StatusOr<v1::ReportStepResponse> FakeCoordinator::ReportStep(const v1::ReportStepRequest& r) {
  v1::ReportStepResponse resp;
  std::function<void(const v1::ReportStepRequest&)> on_step;
  {
    FAKE_RECORD(Rpc::kReportStep, steps, r);
    resp.set_abort(abort_at_step_ > 0 && r.report().step() >= abort_at_step_);
    on_step = on_step_;
  }
  if (on_step) on_step(r);
  return resp;
}

absl::Status FakeCoordinator::ReportDone(const v1::ReportDoneRequest& r) {
  FAKE_RECORD(Rpc::kReportDone, dones, r);
  return absl::OkStatus();
}

std::map<int, v1::CheckpointShard> FakeCoordinator::ReportedShards(
    const std::string& job_id, int64_t generation, int64_t step, bool* complete,
    std::map<int, v1::CheckpointFailure>* failures) const {
  std::map<int, v1::CheckpointShard> by_rank;
  std::set<int> reported;
  for (const v1::ReportCheckpointRequest& c : calls_.checkpoints) {
    const v1::CheckpointShard& s = c.shard();
    if (s.job_id() == job_id && s.generation() == generation && s.step() == step) {
      by_rank[s.rank()] = s;
      reported.insert(s.rank());
    }
  }
  for (const v1::ReportCheckpointFailureRequest& c : calls_.checkpoint_failures) {
    const v1::CheckpointFailure& f = c.failure();
    if (c.job_id() == job_id && c.generation() == generation && f.step() == step) {
      if (failures) (*failures)[f.rank()] = f;
      reported.insert(f.rank());
    }
  }
  auto plan = plans_.find(job_id);
  const int world = plan == plans_.end() ? 1 : plan->second.world();
  *complete = static_cast<int>(reported.size()) == world;
  return by_rank;
}

absl::StatusOr<v1::ReportCheckpointResponse> FakeCoordinator::ReportCheckpoint(
    const v1::ReportCheckpointRequest& r) {
  FAKE_RECORD(Rpc::kReportCheckpoint, checkpoints, r);
  v1::ReportCheckpointResponse resp;
  bool complete = false;
  ReportedShards(r.shard().job_id(), r.shard().generation(), r.shard().step(), &complete);
  resp.set_complete(complete);
  return resp;
}

absl::StatusOr<v1::WaitCheckpointShardsResponse> FakeCoordinator::WaitCheckpointShards(
    const v1::WaitCheckpointShardsRequest& r) {
  FAKE_RECORD(Rpc::kWaitCheckpointShards, shard_waits, r);
  std::map<int, v1::CheckpointShard> shards;
  std::map<int, v1::CheckpointFailure> failures;
  const bool complete = changed_.wait_for(lock, std::chrono::milliseconds(r.wait_ms()), [&] {
    bool done = false;
    failures.clear();
    shards = ReportedShards(r.job_id(), r.generation(), r.step(), &done, &failures);
    return done;
  });
  if (!complete) {
    return absl::DeadlineExceededError(
        absl::StrCat("checkpoint step ", r.step(), ": ", shards.size(), " ranks reported"));
  }
  v1::WaitCheckpointShardsResponse resp;
  for (const auto& [rank, shard] : shards) *resp.add_shards() = shard;
  for (const auto& [rank, failure] : failures) *resp.add_failures() = failure;
  return resp;
}

absl::StatusOr<v1::CommitCheckpointResponse> FakeCoordinator::CommitCheckpoint(
    const v1::CommitCheckpointRequest& r) {
  FAKE_RECORD(Rpc::kCommitCheckpoint, commits, r);
  if (r.rank() != 0) return absl::InvalidArgumentError("rank: only rank 0 commits");
  std::vector<v1::CheckpointInfo>& record = committed_[r.job_id()];
  v1::CommitCheckpointResponse resp;
  for (const v1::CheckpointInfo& c : record) {
    if (c.step() == r.step() && c.generation() == r.generation()) {
      *resp.mutable_checkpoint() = c;
      resp.set_keep_from_step(record.front().step());
      return resp;
    }
  }
  bool complete = false;
  std::map<int, v1::CheckpointFailure> failures;
  const std::map<int, v1::CheckpointShard> shards =
      ReportedShards(r.job_id(), r.generation(), r.step(), &complete, &failures);
  if (!complete || !failures.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint step ", r.step(), ": not every rank reported"));
  }
  v1::CheckpointInfo info;
  info.set_job_id(r.job_id());
  info.set_step(r.step());
  info.set_dir(r.dir());
  info.set_manifest_path(r.manifest_path());
  info.set_world(static_cast<int>(shards.size()));
  info.set_generation(r.generation());
  for (const auto& [rank, shard] : shards) info.set_bytes(info.bytes() + shard.bytes());
  while (!record.empty() && record.back().step() >= r.step()) record.pop_back();
  record.push_back(info);
  while (static_cast<int>(record.size()) > checkpoint_keep_) {
    *resp.add_pruned() = record.front();
    record.erase(record.begin());
  }
  *resp.mutable_checkpoint() = info;
  resp.set_keep_from_step(record.front().step());
  return resp;
}

absl::StatusOr<v1::ReportCheckpointFailureResponse> FakeCoordinator::ReportCheckpointFailure(
    const v1::ReportCheckpointFailureRequest& r) {
  FAKE_RECORD(Rpc::kReportCheckpointFailure, checkpoint_failures, r);
  v1::ReportCheckpointFailureResponse resp;
  resp.set_abort(abort_on_checkpoint_failure_);
  return resp;
}

absl::Status FakeCoordinator::ReportFailure(const v1::ReportFailureRequest& r) {
  FAKE_RECORD(Rpc::kReportFailure, failures, r);
  return absl::OkStatus();
}

absl::Status FakeCoordinator::ReportEvent(const v1::ReportEventRequest& r) {
  FAKE_RECORD(Rpc::kReportEvent, events, r);
  return absl::OkStatus();
}

absl::Status FakeCoordinator::KvSet(const v1::KvSetRequest& r) {
  std::unique_lock<std::mutex> lock(mu_);
  ++calls_.kv_calls;
  changed_.notify_all();
  if (absl::Status injected = InjectedError(Rpc::kKvSet); !injected.ok()) return injected;
  kv_[{r.job_id(), r.generation(), r.key()}] = r.value();
  return absl::OkStatus();
}

absl::StatusOr<std::string> FakeCoordinator::KvGet(const v1::KvGetRequest& r) {
  std::unique_lock<std::mutex> lock(mu_);
  ++calls_.kv_calls;
  changed_.notify_all();
  if (absl::Status injected = InjectedError(Rpc::kKvGet); !injected.ok()) return injected;
  const auto key = std::make_tuple(r.job_id(), r.generation(), r.key());
  const bool found = changed_.wait_for(lock, std::chrono::milliseconds(r.wait_ms()),
                                       [&] { return kv_.count(key) > 0; });
  if (found) return kv_.at(key);
  if (r.wait_ms() == 0) return absl::NotFoundError(absl::StrCat("key ", r.key(), " is not set"));
  return absl::DeadlineExceededError(
      absl::StrCat("key ", r.key(), " not set within ", r.wait_ms(), " ms"));
}

absl::StatusOr<int64_t> FakeCoordinator::KvAdd(const v1::KvAddRequest& r) {
  std::unique_lock<std::mutex> lock(mu_);
  ++calls_.kv_calls;
  changed_.notify_all();
  if (absl::Status injected = InjectedError(Rpc::kKvAdd); !injected.ok()) return injected;
  std::string& value = kv_[{r.job_id(), r.generation(), r.key()}];
  int64_t current = 0;
  if (!value.empty() && !absl::SimpleAtoi(value, &current)) {
    return absl::InvalidArgumentError(absl::StrCat("key ", r.key(), " holds a non-integer value"));
  }
  value = absl::StrCat(current + r.delta());
  return current + r.delta();
}

#undef FAKE_RECORD

}  // namespace shardtrain::worker
