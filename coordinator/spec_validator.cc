#include "coordinator/spec_validator.h"

namespace shardtrain::coordinator {

absl::StatusOr<JobSpec> ValidateSpec(const std::string& yaml,
                                     const std::vector<std::string>& overrides) {
  return ParseJobSpec(yaml, overrides);
}

}  // namespace shardtrain::coordinator
