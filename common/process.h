// Process-level helpers shared by the daemons and the CLI: termination
// signals, atomic small-file writes, host facts.
#ifndef SHARDTRAIN_COMMON_PROCESS_H_
#define SHARDTRAIN_COMMON_PROCESS_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace shardtrain {

// Blocks SIGINT and SIGTERM in the calling thread and every thread it starts
// afterwards. Call first thing in main(), then WaitForTerminationSignal().
void BlockTerminationSignals();
// Waits until SIGINT or SIGTERM arrives; returns its number.
int WaitForTerminationSignal();

// Writes `pieces`, in order, to `path` through a unique temp file in the same
// directory: fsync, rename, fsync of the directory. A reader sees the whole
// file or none of it, and a failure leaves no temp file behind. The
// directory must exist. On an I/O error, a StorageError (storage_fault.h)
// naming the file: RESOURCE_EXHAUSTED when the disk is full,
// FAILED_PRECONDITION when the directory is read-only, not writable or not
// a directory, UNAVAILABLE otherwise.
// The one atomic writer of the code base (port files, weights, checkpoints).
absl::Status WriteFileAtomically(const std::string& path,
                                 absl::Span<const std::string_view> pieces);
absl::Status WriteFileAtomically(const std::string& path, std::string_view content);
// The file's whole contents; NOT_FOUND / PERMISSION_DENIED naming the path.
absl::Status ReadFile(const std::string& path, std::string* out);

std::string HostName();
int64_t TotalMemoryBytes();
// Peak resident set size of this process (VmHWM), bytes.
int64_t PeakRssBytes();
// Resident set size of this process now (VmRSS), bytes.
int64_t RssBytes();
// Restarts the peak (VmHWM) from the current RSS, so that PeakRssBytes()
// measures what follows (Linux >= 4.0; otherwise a no-op).
void ResetPeakRss();

}  // namespace shardtrain

#endif  // SHARDTRAIN_COMMON_PROCESS_H_
