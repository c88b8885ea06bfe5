#include "coordinator/spec_summary.h"

#include "common/job_spec.h"

namespace shardtrain::coordinator {

absl::StatusOr<SpecSummary> ValidateSpec(const std::string& yaml,
                                         const std::vector<std::string>& overrides) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(yaml, overrides);
  if (!spec.ok()) return spec.status();
  SpecSummary s;
  s.canonical_yaml = JobSpecToYaml(*spec);
  s.name = spec->name;
  s.world = spec->World();
  s.dp = spec->parallel.dp;
  s.tp = spec->parallel.tp;
  s.pp = spec->parallel.pp;
  s.device = std::string(EnumName(spec->resources.device));
  s.steps = spec->steps;
  return s;
}

}  // namespace shardtrain::coordinator
