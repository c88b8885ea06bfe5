// Process-level helpers shared by the daemons and the CLI: termination
// signals, atomic small-file writes, host facts.
#ifndef SHARDTRAIN_COMMON_PROCESS_H_
#define SHARDTRAIN_COMMON_PROCESS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace shardtrain {

// Blocks SIGINT and SIGTERM in the calling thread and every thread it starts
// afterwards. Call first thing in main(), then WaitForTerminationSignal().
void BlockTerminationSignals();
// Waits until SIGINT or SIGTERM arrives; returns its number.
int WaitForTerminationSignal();

// Writes `content` to `path` through a temp file in the same directory,
// fsync and rename, so a reader sees the whole file or none of it.
absl::Status WriteFileAtomically(const std::string& path, const std::string& content);
// The file's whole contents; NOT_FOUND / PERMISSION_DENIED naming the path.
absl::Status ReadFile(const std::string& path, std::string* out);

std::string HostName();
int64_t TotalMemoryBytes();
// Peak resident set size of this process (VmHWM), bytes.
int64_t PeakRssBytes();

}  // namespace shardtrain

#endif  // SHARDTRAIN_COMMON_PROCESS_H_
