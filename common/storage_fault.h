// Storage errors by what the caller should do about them. A write that
// fails because the file system is full, read-only, not ours to write, or
// not a directory where one is needed fails the same way on every retry and
// on every rerun of the job: someone must free space or fix the path first.
// Anything else (EIO, a network file system that timed out) may pass.
//
// The atomic writer (WriteFileAtomically) and the checkpoint storage attach
// the fault to the status they return, so a caller far up (the job runner)
// can tell "retrying cannot fix this" from "retry" without parsing messages,
// and say the cause in the user's words ("No space left on device").
//
// Thread-safe (pure functions over values).
#ifndef SHARDTRAIN_COMMON_STORAGE_FAULT_H_
#define SHARDTRAIN_COMMON_STORAGE_FAULT_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shardtrain {

enum class StorageFault {
  kNone,              // not a storage error
  kNoSpace,           // ENOSPC, EDQUOT, or too little free space for what is about to be written
  kReadOnly,          // EROFS
  kPermissionDenied,  // EACCES, EPERM
  kNotADirectory,     // ENOTDIR, EISDIR, EEXIST on mkdir: a path that cannot be the directory
  kIo,                // any other errno: transient as far as anyone can tell (EIO, ETIMEDOUT, ...)
};

// The fault an errno of a create, write, fsync, rename or mkdir stands for.
StorageFault StorageFaultOfErrno(int err);

// True for the faults a retry (or a rerun of the job) cannot fix: kNoSpace,
// kReadOnly, kPermissionDenied, kNotADirectory.
bool RetryCannotFix(StorageFault f);

// A stable lower-case name, used as a metric label and on the wire:
// "no_space", "read_only", "permission_denied", "not_a_directory", "io_error";
// "" for kNone.
absl::string_view StorageFaultName(StorageFault f);

// A failed storage call: the status says `message`, carries `f` and `cause`
// (the reason in the user's words, e.g. "No space left on device" or "needs
// 10.2 MiB, 3.1 MiB free") for StorageFaultOf and StorageCause, and its code
// says what to do: RESOURCE_EXHAUSTED for kNoSpace, FAILED_PRECONDITION for
// the other faults a retry cannot fix (fix the path first), UNAVAILABLE for
// kIo (retry). Precondition: f != kNone.
absl::Status StorageError(StorageFault f, absl::string_view message, absl::string_view cause);

// StorageError for a failed system call on `path`: "<what> <path>: <strerror>".
absl::Status ErrnoStorageError(absl::string_view what, const std::string& path, int err);

// The fault StorageError attached to `s`; kNone for OK and other errors.
StorageFault StorageFaultOf(const absl::Status& s);

// The cause StorageError attached to `s`; `s`'s message when it has none.
std::string StorageCause(const absl::Status& s);

// Bytes an unprivileged writer may still use on the file system holding
// `path` (statvfs: f_bavail × f_frsize), asked of `path` or, when it does
// not exist yet, its nearest existing ancestor. ErrnoStorageError when none
// can be asked.
absl::StatusOr<int64_t> FreeBytesAt(const std::string& path);

// The StorageError of a write of `needed` bytes to `path` where only `free`
// are left: RESOURCE_EXHAUSTED, kNoSpace, cause "needs 10.2 MiB, 3.1 MiB free".
absl::Status NoRoomError(const std::string& path, int64_t needed, int64_t free);

// NoRoomError when the file system of `path` has fewer than `bytes` free
// (FreeBytesAt); OK otherwise, and OK when the free space cannot be asked
// (the write itself will then say what is wrong).
absl::Status CheckFreeSpace(const std::string& path, int64_t bytes);

// "10.2 MiB": binary units, as `shardtrain plan` and `df -h` print them.
std::string FormatStorageBytes(int64_t bytes);

}  // namespace shardtrain

#endif  // SHARDTRAIN_COMMON_STORAGE_FAULT_H_
