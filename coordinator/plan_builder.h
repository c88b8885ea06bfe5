// The plan of a scheduled job: rank -> (dp, tp, pp) coordinates, the
// communication groups and each dp rank's slice of the global batch. Pure.
//
// Rank order: tp varies fastest, then dp, then pp (Megatron's order), so a
// tp group holds consecutive ranks — on one host when hosts are filled in
// order — and pipeline stages are the outermost split.
#ifndef SHARDTRAIN_COORDINATOR_PLAN_BUILDER_H_
#define SHARDTRAIN_COORDINATOR_PLAN_BUILDER_H_

#include "absl/status/statusor.h"
#include "coordinator/coordinator.h"
#include "shardtrain/v1/types.pb.h"

namespace shardtrain::coordinator {

// INVALID_ARGUMENT when the job's ranks do not match dp·tp·pp.
absl::StatusOr<v1::Plan> BuildPlan(const SpecSummary& spec, const v1::Job& job);

}  // namespace shardtrain::coordinator

#endif  // SHARDTRAIN_COORDINATOR_PLAN_BUILDER_H_
