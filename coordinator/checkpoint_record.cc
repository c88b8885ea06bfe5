#include "coordinator/checkpoint_record.h"

#include <algorithm>

namespace shardtrain::coordinator {

RecordedCommit RecordCommit(CheckpointRecord* record, const v1::CheckpointInfo& commit, int keep) {
  RecordedCommit out;
  // Ascending by step: the superseded entries are a suffix.
  std::sort(
      record->begin(), record->end(),
      [](const v1::CheckpointInfo& a, const v1::CheckpointInfo& b) { return a.step() < b.step(); });
  int first_superseded = record->size();
  while (first_superseded > 0 && record->Get(first_superseded - 1).step() >= commit.step()) {
    --first_superseded;
  }
  for (int i = first_superseded; i < record->size(); ++i) out.superseded.push_back(record->Get(i));
  record->DeleteSubrange(first_superseded, record->size() - first_superseded);
  *record->Add() = commit;
  const int excess = record->size() - std::max(keep, 1);
  for (int i = 0; i < excess; ++i) out.pruned.push_back(record->Get(i));
  if (excess > 0) record->DeleteSubrange(0, excess);
  out.keep_from_step = record->Get(0).step();
  return out;
}

const v1::CheckpointInfo* FindCommit(const CheckpointRecord& record, int64_t step,
                                     int64_t generation) {
  for (const v1::CheckpointInfo& c : record) {
    if (c.step() == step && c.generation() == generation) return &c;
  }
  return nullptr;
}

}  // namespace shardtrain::coordinator
