#include "worker/checkpoint_commit.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "worker/checkpoint/directory.h"
#include "worker/checkpoint/manifest.h"
#include "worker/checkpoint/shard_file.h"

namespace shardtrain::worker {
namespace {

constexpr absl::Duration kWaitSlice = absl::Seconds(1);

// Step 1: every rank's report of `step`, its shard or its failure, rank order.
absl::StatusOr<v1::WaitCheckpointShardsResponse> WaitForShards(CoordinatorApi& client,
                                                               const CommitTarget& t, int64_t step,
                                                               const std::atomic<bool>& stop) {
  const absl::Time deadline = absl::Now() + t.wait;
  while (true) {
    if (stop) return absl::CancelledError("stopped while waiting for the ranks' shard reports");
    const absl::Duration left = std::max(deadline - absl::Now(), absl::ZeroDuration());
    v1::WaitCheckpointShardsRequest req;
    req.set_job_id(t.job_id);
    req.set_generation(t.generation);
    req.set_rank(0);
    req.set_worker_id(t.worker_id);
    req.set_lease_token(t.lease_token);
    req.set_step(step);
    req.set_wait_ms(absl::ToInt64Milliseconds(std::min(left, kWaitSlice)));
    absl::StatusOr<v1::WaitCheckpointShardsResponse> resp = client.WaitCheckpointShards(req);
    if (resp.ok()) return resp;
    if (!absl::IsDeadlineExceeded(resp.status()) || left <= kWaitSlice) return resp.status();
  }
}

// Step 2's inputs: what the manifest records of each shard. Each reported
// file must be in rank 0's view of the step directory, else the ranks do not
// share one checkpoint.dir and the manifest would name files nobody can load.
absl::StatusOr<std::vector<checkpoint::ShardFileInfo>> ShardInfos(
    checkpoint::CheckpointStorage& storage, const std::string& step_dir,
    const std::vector<v1::CheckpointShard>& shards) {
  absl::StatusOr<std::vector<std::string>> present = storage.List(step_dir);
  if (!present.ok() && !absl::IsNotFound(present.status())) return present.status();
  std::vector<checkpoint::ShardFileInfo> out;
  for (const v1::CheckpointShard& s : shards) {
    checkpoint::ShardFileInfo info;
    info.rank = s.rank();
    info.file = checkpoint::ShardFileName(s.rank());
    const bool here = present.ok() && std::count(present->begin(), present->end(), info.file) > 0;
    if (!here) {
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", s.rank(), " wrote ", s.path(), " but rank 0 finds no ", info.file,
                       " in ", step_dir,
                       ": all ranks of a job must see one checkpoint.dir (a shared volume; "
                       "see the workers' --checkpoint-root)"));
    }
    for (const v1::FlatRange& r : s.ranges()) {
      info.ranges.push_back({uint64_t(r.begin()), uint64_t(r.end())});
    }
    info.bytes = uint64_t(s.bytes());
    info.checksum = s.crc64();
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace

std::string ResolveCheckpointPath(const std::string& root, const std::string& path) {
  if (path.empty() || path.front() == '/' || root.empty()) return path;
  return checkpoint::JoinPath(root, path);
}

absl::StatusOr<CommitResult> CommitCheckpoint(CoordinatorApi& client,
                                              checkpoint::CheckpointStorage& storage,
                                              const model::ParamLayout& layout,
                                              const CommitTarget& t, int64_t step,
                                              const std::atomic<bool>& stop) {
  const std::string local_step_dir = checkpoint::StepDir(t.local_dir, step);
  // Every rank is done with the step's directory: a step that cannot be
  // committed leaves nothing behind (no empty or partial step-N).
  auto abandon = [&](absl::Status why) {
    absl::Status rm = storage.RemoveAll(local_step_dir);
    if (rm.ok()) return why;
    absl::Status both(why.code(), absl::StrCat(why.message(), "; removing ", local_step_dir,
                                               " failed too: ", rm.message()));
    why.ForEachPayload(
        [&](absl::string_view url, const absl::Cord& payload) { both.SetPayload(url, payload); });
    return both;
  };
  absl::StatusOr<v1::WaitCheckpointShardsResponse> answered = WaitForShards(client, t, step, stop);
  if (!answered.ok()) return answered.status();
  if (answered->failures_size() > 0) {
    const v1::CheckpointFailure& f = answered->failures(0);
    return abandon(absl::FailedPreconditionError(
        absl::StrCat("rank ", f.rank(), " could not write its shard: ", f.cause(),
                     f.path().empty() ? "" : absl::StrCat(" (", f.path(), ")"))));
  }
  const std::vector<v1::CheckpointShard> shards(answered->shards().begin(),
                                                answered->shards().end());
  absl::StatusOr<std::vector<checkpoint::ShardFileInfo>> infos =
      ShardInfos(storage, local_step_dir, shards);
  if (!infos.ok()) return infos.status();
  absl::StatusOr<checkpoint::Manifest> manifest =
      checkpoint::MakeManifest(layout, step, t.world, t.zero_stage, *std::move(infos));
  if (!manifest.ok()) return manifest.status();
  if (absl::Status s =
          checkpoint::WriteManifest(storage, checkpoint::ManifestPath(local_step_dir), *manifest);
      !s.ok()) {
    return abandon(s);
  }

  v1::CommitCheckpointRequest req;
  req.set_job_id(t.job_id);
  req.set_generation(t.generation);
  req.set_rank(0);
  req.set_worker_id(t.worker_id);
  req.set_lease_token(t.lease_token);
  req.set_step(step);
  req.set_dir(checkpoint::StepDir(t.dir, step));
  req.set_manifest_path(checkpoint::ManifestPath(req.dir()));
  absl::StatusOr<v1::CommitCheckpointResponse> resp =
      absl::CancelledError("stopped before the commit");
  // A retry is safe: the coordinator answers a commit it already recorded again.
  for (int attempt = 0; attempt < 20 && !stop; ++attempt) {
    resp = client.CommitCheckpoint(req);
    if (resp.ok() || !absl::IsUnavailable(resp.status())) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  if (!resp.ok()) {
    // Refused for this generation (FAILED_PRECONDITION: the coordinator lost
    // the reports, or a rank failed): nobody resumes from it. A generation
    // that is over (ABORTED) leaves it to the next commit's cleanup.
    if (absl::IsFailedPrecondition(resp.status())) return abandon(resp.status());
    return resp.status();
  }

  CommitResult out;
  out.commit = *std::move(resp);
  // The coordinator never answers above the step just committed; should it,
  // that step stays anyway.
  absl::StatusOr<std::vector<std::string>> removed = checkpoint::RemoveStepDirsBelow(
      storage, t.local_dir, std::min(out.commit.keep_from_step(), step));
  if (removed.ok()) {
    out.removed = *std::move(removed);
  } else {
    out.cleanup = removed.status();
  }
  return out;
}

}  // namespace shardtrain::worker
