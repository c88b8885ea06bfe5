// libFuzzer target: the job-spec parser (ParseJobSpec with --set overrides)
// and its canonical form. Input: the spec's YAML text, then optionally lines
// after a "\n---overrides---\n" separator, one "key.path=value" each.
// Properties checked besides "no crash, no sanitizer report": a spec that
// parses round-trips through JobSpecToYaml to the same canonical text.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "common/job_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  constexpr std::string_view kSeparator = "\n---overrides---\n";
  std::string_view yaml = input;
  std::vector<std::string> overrides;
  if (size_t at = input.find(kSeparator); at != std::string_view::npos) {
    yaml = input.substr(0, at);
    std::string_view rest = input.substr(at + kSeparator.size());
    while (!rest.empty()) {
      const size_t nl = std::min(rest.find('\n'), rest.size());
      if (nl > 0) overrides.emplace_back(rest.substr(0, nl));
      rest.remove_prefix(std::min(nl + 1, rest.size()));
    }
  }
  absl::StatusOr<shardtrain::JobSpec> spec = shardtrain::ParseJobSpec(yaml, overrides);
  if (!spec.ok()) return 0;
  const std::string canonical = shardtrain::JobSpecToYaml(*spec);
  absl::StatusOr<shardtrain::JobSpec> again = shardtrain::ParseJobSpec(canonical);
  if (!again.ok() || shardtrain::JobSpecToYaml(*again) != canonical) {
    std::cerr << "canonical spec does not round-trip:\n"
              << canonical << "\n"
              << (again.ok() ? shardtrain::JobSpecToYaml(*again) : again.status().ToString())
              << std::endl;
    std::abort();
  }
  return 0;
}
