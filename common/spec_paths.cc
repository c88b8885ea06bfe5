#include "common/spec_paths.h"

#include <filesystem>

#include "absl/strings/str_cat.h"

namespace shardtrain {
namespace {

namespace fs = std::filesystem;

// Whether the lexically normal `rel` (relative) climbs above its base.
bool Escapes(const fs::path& rel) {
  const fs::path n = rel.lexically_normal();
  return !n.empty() && *n.begin() == "..";
}

}  // namespace

absl::Status CheckRelativePathStaysInside(std::string_view field, const std::string& path) {
  if (path.empty() || fs::path(path).is_absolute() || !Escapes(path)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(std::string(field), ": '", path.substr(0, 256),
                   "' escapes its root with '..'; name a path inside it"));
}

absl::Status CheckSpecPaths(const JobSpec& spec, const std::string& resume_from) {
  for (const auto& [field, path] :
       {std::pair<const char*, const std::string&>{"data.train", spec.data.train},
        {"data.val", spec.data.val},
        {"model.init", spec.model.init},
        {"model.adapter", spec.model.adapter},
        {"checkpoint.dir", spec.checkpoint.dir},
        {"resume_from", resume_from}}) {
    if (absl::Status s = CheckRelativePathStaysInside(field, path); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ResolveSpecPath(std::string_view field, const std::string& root,
                                            const std::string& path, bool confine) {
  if (path.empty()) return path;
  if (absl::Status s = CheckRelativePathStaysInside(field, path); !s.ok()) return s;
  const fs::path p(path);
  if (!p.is_absolute()) {
    if (root.empty()) return path;
    return root.back() == '/' ? root + path : root + "/" + path;
  }
  std::string base = root;
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  const fs::path rel = p.lexically_normal().lexically_relative(base);
  if (confine && !root.empty() && (rel.empty() || Escapes(rel))) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(field), ": '", path.substr(0, 256),
                                                   "' is outside this worker's root ", root,
                                                   "; name a path inside it (or a relative one)"));
  }
  return path;
}

}  // namespace shardtrain
