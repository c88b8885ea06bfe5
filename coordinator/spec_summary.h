// Validates a job spec with common/job_spec and keeps what the coordinator
// core needs of it (SpecSummary).
#ifndef SHARDTRAIN_COORDINATOR_SPEC_SUMMARY_H_
#define SHARDTRAIN_COORDINATOR_SPEC_SUMMARY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/coordinator.h"

namespace shardtrain::coordinator {

// A SpecValidator: INVALID_ARGUMENT naming the field on any mistake.
absl::StatusOr<SpecSummary> ValidateSpec(const std::string& yaml,
                                         const std::vector<std::string>& overrides);

}  // namespace shardtrain::coordinator

#endif  // SHARDTRAIN_COORDINATOR_SPEC_SUMMARY_H_
