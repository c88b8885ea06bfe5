// The pure part of the coordinator's step reports: how every rank's report
// of one step becomes the job's.
#ifndef SHARDTRAIN_COORDINATOR_REPORTS_H_
#define SHARDTRAIN_COORDINATOR_REPORTS_H_

#include <map>

#include "common/parallel_dims.h"
#include "shardtrain/v1/types.pb.h"

namespace shardtrain::coordinator {

// The job's report of one step from every rank's (by_rank: rank -> its
// report, non-empty; ranks of `dims`). One rule per field, by the ranks'
// places in the mesh, listed at the definition (reports.cc): loss and
// val_loss are the mean over the ranks that speak for a replica, etc.
v1::StepReport AggregateStep(const ParallelDims& dims,
                             const std::map<int, v1::StepReport>& by_rank);

}  // namespace shardtrain::coordinator

#endif  // SHARDTRAIN_COORDINATOR_REPORTS_H_
