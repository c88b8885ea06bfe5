#include "common/storage_fault.h"

#include <sys/statvfs.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace shardtrain {
namespace {

// Payloads of a StorageError: the fault's name and the cause.
constexpr char kFaultUrl[] = "type.shardtrain.dev/storage_fault";
constexpr char kCauseUrl[] = "type.shardtrain.dev/storage_cause";

constexpr StorageFault kAllFaults[] = {StorageFault::kNoSpace, StorageFault::kReadOnly,
                                       StorageFault::kPermissionDenied,
                                       StorageFault::kNotADirectory, StorageFault::kIo};

}  // namespace

StorageFault StorageFaultOfErrno(int err) {
  switch (err) {
    case ENOSPC:
    case EDQUOT:
      return StorageFault::kNoSpace;
    case EROFS:
      return StorageFault::kReadOnly;
    case EACCES:
    case EPERM:
      return StorageFault::kPermissionDenied;
    case ENOTDIR:
    case EISDIR:
    case EEXIST:
      return StorageFault::kNotADirectory;
    default:
      return StorageFault::kIo;
  }
}

bool RetryCannotFix(StorageFault f) {
  return f == StorageFault::kNoSpace || f == StorageFault::kReadOnly ||
         f == StorageFault::kPermissionDenied || f == StorageFault::kNotADirectory;
}

absl::string_view StorageFaultName(StorageFault f) {
  switch (f) {
    case StorageFault::kNone:
      return "";
    case StorageFault::kNoSpace:
      return "no_space";
    case StorageFault::kReadOnly:
      return "read_only";
    case StorageFault::kPermissionDenied:
      return "permission_denied";
    case StorageFault::kNotADirectory:
      return "not_a_directory";
    case StorageFault::kIo:
      return "io_error";
  }
  return "";
}

absl::Status StorageError(StorageFault f, absl::string_view message, absl::string_view cause) {
  absl::Status s = f == StorageFault::kNoSpace ? absl::ResourceExhaustedError(message)
                   : RetryCannotFix(f)         ? absl::FailedPreconditionError(message)
                                               : absl::UnavailableError(message);
  s.SetPayload(kFaultUrl, absl::Cord(StorageFaultName(f)));
  s.SetPayload(kCauseUrl, absl::Cord(cause));
  return s;
}

absl::Status ErrnoStorageError(absl::string_view what, const std::string& path, int err) {
  const std::string cause = std::strerror(err);
  return StorageError(StorageFaultOfErrno(err), absl::StrCat(what, " ", path, ": ", cause), cause);
}

StorageFault StorageFaultOf(const absl::Status& s) {
  const absl::optional<absl::Cord> name = s.GetPayload(kFaultUrl);
  if (!name) return StorageFault::kNone;
  for (StorageFault f : kAllFaults) {
    if (*name == StorageFaultName(f)) return f;
  }
  return StorageFault::kNone;
}

std::string StorageCause(const absl::Status& s) {
  const absl::optional<absl::Cord> cause = s.GetPayload(kCauseUrl);
  return cause ? std::string(*cause) : std::string(s.message());
}

absl::StatusOr<int64_t> FreeBytesAt(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path p = path.empty() ? fs::path(".") : fs::path(path);
  while (true) {
    struct statvfs st {};
    if (::statvfs(p.c_str(), &st) == 0) {
      return static_cast<int64_t>(st.f_bavail) * static_cast<int64_t>(st.f_frsize);
    }
    const int err = errno;
    // A path not made yet: ask its nearest existing ancestor's file system.
    fs::path parent = p.has_relative_path() ? p.parent_path() : p;
    if (parent.empty()) parent = ".";
    if ((err != ENOENT && err != ENOTDIR) || parent == p) {
      return ErrnoStorageError("statvfs", p.string(), err);
    }
    p = parent;
  }
}

absl::Status NoRoomError(const std::string& path, int64_t needed, int64_t free) {
  const std::string cause =
      absl::StrCat("needs ", FormatStorageBytes(needed), ", ", FormatStorageBytes(free), " free");
  return StorageError(StorageFault::kNoSpace, absl::StrCat("cannot write ", path, ": ", cause),
                      cause);
}

absl::Status CheckFreeSpace(const std::string& path, int64_t bytes) {
  absl::StatusOr<int64_t> free = FreeBytesAt(path);
  if (!free.ok() || *free >= bytes) return absl::OkStatus();
  return NoRoomError(path, bytes, *free);
}

std::string FormatStorageBytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes >= int64_t{1} << 30) return absl::StrFormat("%.2f GiB", b / double(int64_t{1} << 30));
  if (bytes >= int64_t{1} << 20) return absl::StrFormat("%.1f MiB", b / double(int64_t{1} << 20));
  if (bytes >= 1024) return absl::StrFormat("%.1f KiB", b / 1024.0);
  return absl::StrFormat("%d B", bytes);
}

}  // namespace shardtrain
