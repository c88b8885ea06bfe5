// A job's record of committed checkpoints (Job.checkpoints, ascending step):
// what recovery resumes from (the newest entry) and what `shardtrain
// checkpoints` lists. Pure: no I/O, no locks; the coordinator stores the job
// after each change.
#ifndef SHARDTRAIN_COORDINATOR_CHECKPOINT_RECORD_H_
#define SHARDTRAIN_COORDINATOR_CHECKPOINT_RECORD_H_

#include <cstdint>
#include <vector>

#include "google/protobuf/repeated_ptr_field.h"
#include "shardtrain/v1/types.pb.h"

namespace shardtrain::coordinator {

using CheckpointRecord = google::protobuf::RepeatedPtrField<v1::CheckpointInfo>;

struct RecordedCommit {
  // Entries taken off the record because more than `keep` remained, oldest
  // first: their step directories are to be deleted.
  std::vector<v1::CheckpointInfo> pruned;
  // Entries at or after the new step, replaced by it (oldest first): the job
  // resumed from before them (a commit lost to a crash, or one that failed
  // its checksums), so the run that commits now writes their steps again.
  // Their directories are left alone: the ranks are rewriting them.
  std::vector<v1::CheckpointInfo> superseded;
  // The oldest step left on the record: every step directory below it may go.
  int64_t keep_from_step = 0;
};

// Adds `commit` to `record` as its newest entry: first drops the entries
// with step >= commit.step() (superseded), then prunes the oldest ones beyond
// `keep` (>= 1). The step just committed is therefore never pruned, and the
// newest entry, the one recovery resumes from, is always the last commit.
RecordedCommit RecordCommit(CheckpointRecord* record, const v1::CheckpointInfo& commit, int keep);

// The entry for `step` written by `generation`, or nullptr.
const v1::CheckpointInfo* FindCommit(const CheckpointRecord& record, int64_t step,
                                     int64_t generation);

}  // namespace shardtrain::coordinator

#endif  // SHARDTRAIN_COORDINATOR_CHECKPOINT_RECORD_H_
