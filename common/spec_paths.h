// Which files a job spec makes a worker open, and whether each stays inside
// the directory it is meant to resolve against. Pure: paths are compared
// lexically (lexically_normal), no file is touched and symbolic links are
// not followed. Used by the coordinator at submit (relative paths must not
// escape with "..") and by workers before they open anything (a path must
// resolve under the worker's --data-root / --checkpoint-root).
#ifndef SHARDTRAIN_COMMON_SPEC_PATHS_H_
#define SHARDTRAIN_COMMON_SPEC_PATHS_H_

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/job_spec.h"

namespace shardtrain {

// OK when `path` is absolute, empty, or relative and stays inside the
// directory it is resolved against ("a/../b" does, "../b" and "a/../../b" do
// not). INVALID_ARGUMENT naming `field` otherwise.
absl::Status CheckRelativePathStaysInside(std::string_view field, const std::string& path);

// CheckRelativePathStaysInside for every path of the spec (data.train,
// data.val, model.init, checkpoint.dir) and for `resume_from` (field "resume_from").
absl::Status CheckSpecPaths(const JobSpec& spec, const std::string& resume_from);

// `path` as a worker opens it: relative paths joined to `root` (an absolute
// directory; empty = the working directory), absolute ones unchanged, empty
// stays empty. A relative path escaping with ".." is INVALID_ARGUMENT naming
// `field`; when `confine` is set, so is an absolute path outside `root`.
absl::StatusOr<std::string> ResolveSpecPath(std::string_view field, const std::string& root,
                                            const std::string& path, bool confine);

}  // namespace shardtrain

#endif  // SHARDTRAIN_COMMON_SPEC_PATHS_H_
