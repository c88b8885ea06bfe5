#include "coordinator/spec_validator.h"

#include "common/spec_paths.h"

namespace shardtrain::coordinator {

absl::StatusOr<JobSpec> ValidateSpec(const std::string& yaml,
                                     const std::vector<std::string>& overrides) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(yaml, overrides);
  if (!spec.ok()) return spec;
  // Relative paths resolve under each worker's roots: none may climb out.
  if (absl::Status s = CheckSpecPaths(*spec, ""); !s.ok()) return s;
  return spec;
}

}  // namespace shardtrain::coordinator
