// Rank 0's side of committing a sharded checkpoint. Every rank has written
// its shard and reported it, or reported why it could not; rank 0 then
//   1. waits until the coordinator holds every rank's report of the step,
//   2. writes the manifest next to the shards (temp -> fsync -> rename),
//   3. asks the coordinator to record the commit (the commit point: recovery
//      resumes from the newest recorded commit, never from files alone),
//   4. deletes the step directories below the oldest step still recorded.
// A crash or refusal anywhere before 3 leaves the step uncommitted: recovery
// resumes from the previous commit and a re-run commits the step again,
// rewriting its shards and manifest. When every rank answered and the step
// still cannot be committed (a rank could not write its shard, the manifest
// could not be written, the coordinator refused the commit), rank 0 removes
// the step's directory: no empty or partial step-N is left behind. The
// coordinator itself never reads or writes checkpoint files.
#ifndef SHARDTRAIN_WORKER_CHECKPOINT_COMMIT_H_
#define SHARDTRAIN_WORKER_CHECKPOINT_COMMIT_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/model/param_layout.h"
#include "shardtrain/v1/coordinator.pb.h"
#include "worker/checkpoint/storage.h"
#include "worker/coordinator_api.h"

namespace shardtrain::worker {

// Who commits, and where: rank 0 of one generation of a job.
struct CommitTarget {
  std::string job_id;
  int64_t generation = 0;
  std::string worker_id;
  std::string lease_token;  // the assignment's (RunAssignment.lease_token)
  int world = 1;
  int zero_stage = 0;     // recorded in the manifest (informational)
  std::string dir;        // the job's checkpoint.dir as its spec says: what the coordinator records
  std::string local_dir;  // the same directory as this worker reaches it (ResolveCheckpointPath)
  // How long the other ranks' reports may take to arrive. They block in the
  // next step's collectives meanwhile, so keep it below the collective timeout.
  absl::Duration wait = absl::Seconds(30);
};

struct CommitResult {
  v1::CommitCheckpointResponse commit;  // what the coordinator recorded
  std::vector<std::string> removed;     // step directories deleted (below keep_from_step)
  absl::Status cleanup;                 // why deleting stopped early, if it did: the commit stands
};

// Commits checkpoint `step` (steps 1-4 above). Waits in slices of at most a
// second, and gives up when `stop` is set. Any error means the step is not
// committed; training may go on. Errors: DEADLINE_EXCEEDED when some rank's
// report did not arrive within target.wait; ALREADY_EXISTS when the step was
// committed already (a commit re-sent after a coordinator restart: nothing
// is written or removed); FAILED_PRECONDITION when a rank
// reported it could not write its shard (naming the rank, the cause and the
// path), a reported shard file is not in rank 0's step directory (the ranks
// do not share checkpoint.dir) or the coordinator no longer holds every
// report; CANCELLED when stopped; ABORTED for a generation that is over; the
// manifest's errors (InvalidArgument for inconsistent shards, the storage's
// StorageError); the coordinator's otherwise. The step directory is removed
// after a rank's failure, the manifest's storage error and the coordinator's
// FAILED_PRECONDITION.
absl::StatusOr<CommitResult> CommitCheckpoint(CoordinatorApi& client,
                                              checkpoint::CheckpointStorage& storage,
                                              const model::ParamLayout& layout,
                                              const CommitTarget& target, int64_t step,
                                              const std::atomic<bool>& stop);

// `path` when absolute or empty; otherwise JoinPath(root, path).
std::string ResolveCheckpointPath(const std::string& root, const std::string& path);

}  // namespace shardtrain::worker

#endif  // SHARDTRAIN_WORKER_CHECKPOINT_COMMIT_H_
