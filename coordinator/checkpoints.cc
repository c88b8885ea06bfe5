// The coordinator core, part 3: checkpoint commits. The coordinator holds
// the record (which steps are committed, durably, in the job); the files
// (shards, manifests, pruning) are the ranks' business on the volume they
// share, so nothing here touches a filesystem. Parts 1 and 2 are
// coordinator.cc and reports.cc.
#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/checkpoint_record.h"
#include "coordinator/coordinator.h"

namespace shardtrain::coordinator {
namespace {

std::string Steps(const std::vector<v1::CheckpointInfo>& infos) {
  return absl::StrJoin(infos, ", ", [](std::string* out, const v1::CheckpointInfo& c) {
    absl::StrAppend(out, c.step());
  });
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
    auto it = e->shards.find(req.step());
    const int reported = it == e->shards.end() ? 0 : static_cast<int>(it->second.size());
    if (reported == e->job.world()) {
      v1::WaitCheckpointShardsResponse resp;
      for (const auto& [rank, shard] : it->second) *resp.add_shards() = shard;
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
  *resp.mutable_checkpoint() = info;
  resp.set_keep_from_step(recorded.keep_from_step);
  for (const v1::CheckpointInfo& p : recorded.pruned) *resp.add_pruned() = p;
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
