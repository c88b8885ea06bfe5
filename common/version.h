// What a build is: the project version (CMakeLists.txt, `project(VERSION)`)
// and the git revision the build was made from. The revision is read at
// build time into one small generated file (common/version.cmake), so a new
// commit recompiles that file and relinks, nothing more.
#ifndef SHARDTRAIN_COMMON_VERSION_H_
#define SHARDTRAIN_COMMON_VERSION_H_

#include <string>

namespace shardtrain {

// "0.1.0".
extern const char kVersion[];
// The short commit hash, "+dirty" appended when tracked files differ from it;
// "unknown" when built outside a git checkout.
extern const char kGitRevision[];

// The line `--version` prints: "<program> 0.1.0 (git 1a2b3c4d5e)".
inline std::string VersionLine(const std::string& program) {
  return program + " " + kVersion + " (git " + kGitRevision + ")";
}

}  // namespace shardtrain

#endif  // SHARDTRAIN_COMMON_VERSION_H_
