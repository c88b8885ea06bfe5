// The coordinator core, part 3: checkpoint commits. The coordinator holds
// the record (which steps are committed, durably, in the job); the files
// (shards, manifests, pruning) are the ranks' business on the volume they
// share, so nothing here touches a filesystem. Parts 1 and 2 are
// coordinator.cc and reports.cc.
#include <algorithm>
#include <chrono>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/job_spec.h"
#include "common/text_bounds.h"
#include "coordinator/checkpoint_record.h"
#include "coordinator/coordinator.h"

namespace shardtrain::coordinator {
namespace {

std::string Steps(const std::vector<v1::CheckpointInfo>& infos) {
  return absl::StrJoin(infos, ", ", [](std::string* out, const v1::CheckpointInfo& c) {
    absl::StrAppend(out, c.step());
  });
}

// CheckpointFailure.reason's labels: anything else counts as "other", so a
// report cannot grow the metric's label set.
constexpr absl::string_view kFailureReasons[] = {
    "no_space",   "read_only", "permission_denied", "not_a_directory", "io_error",
    "incomplete", "other"};

std::string FailureReason(const std::string& reason) {
  for (absl::string_view r : kFailureReasons) {
    if (reason == r) return reason;
  }
  return "other";
}

// "checkpoint step 20 not committed: rank 0: No space left on device (/ck/step-20)".
std::string FailureMessage(const v1::CheckpointFailure& f) {
  std::string msg = absl::StrCat("checkpoint step ", f.step(), " not committed: rank ", f.rank(),
                                 ": ", f.cause());
  if (!f.path().empty()) absl::StrAppend(&msg, " (", f.path(), ")");
  return msg;
}

// Ranks of `step` that reported, their shard or their failure.
int RanksReported(const std::map<int, v1::CheckpointShard>* shards,
                  const std::map<int, v1::CheckpointFailure>* failures) {
  std::set<int> ranks;
  if (shards) {
    for (const auto& [rank, shard] : *shards) ranks.insert(rank);
  }
  if (failures) {
    for (const auto& [rank, failure] : *failures) ranks.insert(rank);
  }
  return static_cast<int>(ranks.size());
}

template <typename M>
const typename M::mapped_type* Find(const M& m, int64_t key) {
  auto it = m.find(key);
  return it == m.end() ? nullptr : &it->second;
}

}  // namespace

absl::Status Coordinator::CheckCheckpointRank(const JobEntry& e, int64_t generation, int rank,
                                              const std::string& worker_id,
                                              const std::string& lease_token) const {
  if (auto s = CheckRank(e, generation, rank, worker_id, lease_token); !s.ok()) return s;
  if (e.job.state() == v1::JOB_STATE_RECOVERING) {
    return absl::AbortedError(absl::StrCat("job ", e.job.job_id(), " is RECOVERING: generation ",
                                           generation, " failed and commits no checkpoint"));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> Coordinator::ReportCheckpoint(const v1::ReportCheckpointRequest& req) {
  const v1::CheckpointShard& shard = req.shard();
  std::lock_guard<std::mutex> lock(mu_);
  JobEntry* e = FindJob(shard.job_id());
  if (!e) return absl::NotFoundError(absl::StrCat("job ", shard.job_id(), " not found"));
  if (auto s = CheckCheckpointRank(*e, shard.generation(), shard.rank(), req.worker_id(),
                                   req.lease_token());
      !s.ok()) {
    return s;
  }
  // A shard of a step already committed is a rank's re-send after a restart
  // (worker/report_outbox.h): nothing left to hold.
  if (FindCommit(e->job.checkpoints(), shard.step(), shard.generation())) return true;
  auto& ranks = e->shards[shard.step()];
  ranks[shard.rank()] = shard;
  shards_cv_.notify_all();
  return static_cast<int>(ranks.size()) == e->job.world();
}

absl::StatusOr<v1::WaitCheckpointShardsResponse> Coordinator::WaitCheckpointShards(
    const v1::WaitCheckpointShardsRequest& req) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(std::max<int64_t>(0, req.wait_ms()));
  while (true) {
    if (shutdown_) return absl::UnavailableError("coordinator is shutting down");
    const JobEntry* e = FindJob(req.job_id());
    if (!e) return absl::NotFoundError(absl::StrCat("job ", req.job_id(), " not found"));
    if (auto s = CheckCheckpointRank(*e, req.generation(), req.rank(), req.worker_id(),
                                     req.lease_token());
        !s.ok()) {
      return s;
    }
    const auto* shards = Find(e->shards, req.step());
    const auto* failures = Find(e->shard_failures, req.step());
    // A step committed already, whose reports were let go with the commit:
    // rank 0 re-sending a commit it kept through a restart. Nothing to wait
    // for, nothing to commit again.
    if (!shards && !failures && req.step() <= e->job.progress().last_committed_checkpoint_step()) {
      return absl::AlreadyExistsError(absl::StrCat("checkpoint step ", req.step(), " of job ",
                                                   req.job_id(), " is committed already"));
    }
    const int reported = RanksReported(shards, failures);
    if (reported == e->job.world()) {
      v1::WaitCheckpointShardsResponse resp;
      if (shards) {
        for (const auto& [rank, shard] : *shards) *resp.add_shards() = shard;
      }
      if (failures) {
        for (const auto& [rank, failure] : *failures) *resp.add_failures() = failure;
      }
      return resp;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "checkpoint step ", req.step(), " of job ", req.job_id(), ": ", reported, " of ",
          e->job.world(), " ranks reported their shard within ", req.wait_ms(), " ms"));
    }
    shards_cv_.wait_until(lock, deadline);
  }
}

absl::StatusOr<v1::CommitCheckpointResponse> Coordinator::CommitCheckpoint(
    const v1::CommitCheckpointRequest& req) {
  std::lock_guard<std::mutex> lock(mu_);
  JobEntry* e = FindJob(req.job_id());
  if (!e) return absl::NotFoundError(absl::StrCat("job ", req.job_id(), " not found"));
  if (auto s =
          CheckCheckpointRank(*e, req.generation(), req.rank(), req.worker_id(), req.lease_token());
      !s.ok()) {
    return s;
  }
  if (req.rank() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank: ", req.rank(), " cannot commit a checkpoint; rank 0 commits"));
  }
  if (req.dir().empty()) return absl::InvalidArgumentError("dir: must not be empty");
  v1::CommitCheckpointResponse resp;
  if (const v1::CheckpointInfo* done =
          FindCommit(e->job.checkpoints(), req.step(), req.generation())) {
    *resp.mutable_checkpoint() = *done;  // a retry: the record already holds it
    resp.set_keep_from_step(e->job.checkpoints(0).step());
    return resp;
  }
  if (const auto* failures = Find(e->shard_failures, req.step())) {
    const v1::CheckpointFailure& f = failures->begin()->second;
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint step ", req.step(), " of job ", req.job_id(), ": rank ", f.rank(),
                     " reported a failure (", f.cause(), "): not committed"));
  }
  auto it = e->shards.find(req.step());
  const int reported = it == e->shards.end() ? 0 : static_cast<int>(it->second.size());
  if (reported != e->job.world()) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint step ", req.step(), " of job ", req.job_id(),
                     ": the coordinator holds ", reported, " of ", e->job.world(),
                     " ranks' shard reports (it may have restarted since): not committed"));
  }
  if (!e->valid) return absl::FailedPreconditionError("job has no valid spec");  // not reached
  v1::CheckpointInfo info;
  info.set_job_id(e->job.job_id());
  info.set_step(req.step());
  info.set_dir(req.dir());
  info.set_manifest_path(req.manifest_path());
  int64_t bytes = 0;
  for (const auto& [rank, shard] : it->second) bytes += shard.bytes();
  info.set_bytes(bytes);
  info.set_world(e->job.world());
  info.set_committed_ms(clock_->NowMs());
  info.set_generation(req.generation());

  const v1::Job before = e->job;
  const RecordedCommit recorded =
      RecordCommit(e->job.mutable_checkpoints(), info, e->valid->spec.checkpoint.keep);
  e->job.mutable_progress()->set_last_committed_checkpoint_step(info.step());
  e->job.mutable_progress()->set_checkpoint_failures_in_a_row(0);
  std::string message = absl::StrCat("checkpoint step ", info.step(), " committed (", bytes,
                                     " bytes in ", info.world(), " shards)");
  if (!recorded.pruned.empty()) absl::StrAppend(&message, "; pruned step ", Steps(recorded.pruned));
  if (!recorded.superseded.empty()) {
    absl::StrAppend(&message, "; replaces the commit of step ", Steps(recorded.superseded));
  }
  // The job and its event in one durable write: the commit point.
  if (auto s = AppendEvent(*e, v1::EVENT_KIND_CHECKPOINT, message, nullptr); !s.ok()) {
    e->job = before;  // not durable: not committed
    return s;
  }
  e->shards.erase(e->shards.begin(), e->shards.upper_bound(req.step()));
  e->shard_failures.erase(e->shard_failures.begin(), e->shard_failures.upper_bound(req.step()));
  *resp.mutable_checkpoint() = info;
  resp.set_keep_from_step(recorded.keep_from_step);
  for (const v1::CheckpointInfo& p : recorded.pruned) *resp.add_pruned() = p;
  return resp;
}

absl::StatusOr<v1::ReportCheckpointFailureResponse> Coordinator::ReportCheckpointFailure(
    const v1::ReportCheckpointFailureRequest& req) {
  std::lock_guard<std::mutex> lock(mu_);
  JobEntry* e = FindJob(req.job_id());
  if (!e) return absl::NotFoundError(absl::StrCat("job ", req.job_id(), " not found"));
  v1::ReportCheckpointFailureResponse resp;
  if (IsTerminal(e->job.state())) {
    resp.set_abort(true);  // ended meanwhile (perhaps by this step's first failure)
    return resp;
  }
  v1::CheckpointFailure f = req.failure();
  if (auto s =
          CheckCheckpointRank(*e, req.generation(), f.rank(), req.worker_id(), req.lease_token());
      !s.ok()) {
    return s;
  }
  if (f.step() < 1) {
    return absl::InvalidArgumentError(absl::StrCat("failure.step: ", f.step(), " is below 1"));
  }
  // Reports are bounded like events are: one line each.
  f.set_cause(SanitizeLine(f.cause(), kMaxEchoBytes));
  f.set_path(SanitizeLine(f.path(), kMaxPathBytes));
  f.set_reason(FailureReason(f.reason()));
  std::map<int, v1::CheckpointFailure>& failures = e->shard_failures[f.step()];
  const bool first = failures.empty();
  failures[f.rank()] = f;
  shards_cv_.notify_all();
  if (!first) return resp;  // the step's warning and policy were applied already

  // The step's first failure: a warning the user sees, a count, the policy.
  const v1::Job before = e->job;
  v1::JobProgress* p = e->job.mutable_progress();
  p->set_checkpoint_failures_in_a_row(p->checkpoint_failures_in_a_row() + 1);
  const std::string message = FailureMessage(f);
  if (auto s = AppendEvent(*e, v1::EVENT_KIND_WARNING, message, nullptr); !s.ok()) {
    e->job = before;  // not durable: not recorded; the step stays uncommitted all the same
    return s;
  }
  ++e->checkpoint_failures[f.reason()];
  if (!e->valid) return resp;  // not reached: an active job has its spec
  const CheckpointSpec& policy = e->valid->spec.checkpoint;
  const int in_a_row = p->checkpoint_failures_in_a_row();
  std::string why;
  if (policy.on_failure == CheckpointFailurePolicy::kFail) {
    why = absl::StrCat(message, " (checkpoint.on_failure: fail)");
  } else if (policy.max_consecutive_failures > 0 && in_a_row >= policy.max_consecutive_failures) {
    why = absl::StrCat(message, " (", in_a_row,
                       " checkpoints in a row not committed: checkpoint.max_consecutive_failures ",
                       policy.max_consecutive_failures, ")");
  }
  if (why.empty()) return resp;
  // Training on cannot fix the volume and a restart would retrain: the job
  // fails once, saying what it could resume from.
  absl::StrAppend(&why, "; ",
                  e->job.checkpoints_size() > 0
                      ? absl::StrCat("newest committed checkpoint: step ",
                                     e->job.checkpoints().rbegin()->step())
                      : std::string("no checkpoint committed"));
  HoldForHeartbeat(*e);
  e->job.set_failure_reason(SanitizeLine(why));
  if (auto s = Transition(*e, v1::JOB_STATE_FAILED, why); !s.ok()) return s;
  ScheduleLocked();
  resp.set_abort(true);
  return resp;
}

absl::StatusOr<v1::ListCheckpointsResponse> Coordinator::ListCheckpoints(
    const std::string& job_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  const JobEntry* e = FindJob(job_id);
  if (!e) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
  v1::ListCheckpointsResponse resp;
  for (auto it = e->job.checkpoints().rbegin(); it != e->job.checkpoints().rend(); ++it) {
    *resp.add_checkpoints() = *it;
  }
  return resp;
}

}  // namespace shardtrain::coordinator
