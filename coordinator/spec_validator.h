// The coordinator's default SpecValidator: common/job_spec's ParseJobSpec.
// The one place in the coordinator that parses a spec; everything else uses
// the JobSpec the validator returned (kept with the job).
#ifndef SHARDTRAIN_COORDINATOR_SPEC_VALIDATOR_H_
#define SHARDTRAIN_COORDINATOR_SPEC_VALIDATOR_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/job_spec.h"

namespace shardtrain::coordinator {

// A SpecValidator: the validated spec, every field resolved; INVALID_ARGUMENT
// naming the field on any mistake. Thread-safe (a pure function).
absl::StatusOr<JobSpec> ValidateSpec(const std::string& yaml,
                                     const std::vector<std::string>& overrides);

}  // namespace shardtrain::coordinator

#endif  // SHARDTRAIN_COORDINATOR_SPEC_VALIDATOR_H_
