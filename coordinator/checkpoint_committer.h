// The coordinator's commit step of sharded checkpoints, on the filesystem
// the workers write to: validates every rank's shard report against the
// job's parameter layout, writes the manifest (temp -> fsync -> rename: the
// commit point) and prunes checkpoints beyond the spec's `keep`.
#ifndef SHARDTRAIN_COORDINATOR_CHECKPOINT_COMMITTER_H_
#define SHARDTRAIN_COORDINATOR_CHECKPOINT_COMMITTER_H_

#include "coordinator/coordinator.h"

namespace shardtrain::coordinator {

CheckpointCommitter NewFileCheckpointCommitter();

}  // namespace shardtrain::coordinator

#endif  // SHARDTRAIN_COORDINATOR_CHECKPOINT_COMMITTER_H_
