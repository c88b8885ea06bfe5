#include "worker/checkpoint/storage.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "common/process.h"
#include "common/storage_fault.h"

namespace shardtrain::checkpoint {
namespace {

namespace fs = std::filesystem;

// Reads: NotFound for a missing file, Unavailable otherwise.
absl::Status ErrnoError(const std::string& what, const std::string& path, int err) {
  const std::string msg = absl::StrCat(what, " ", path, ": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(msg);
  return absl::UnavailableError(msg);
}

std::string ParentDir(const std::string& path) {
  std::string dir = fs::path(path).parent_path().string();
  return dir.empty() ? "." : dir;
}

// Best effort: makes a directory entry change durable.
void FsyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace

absl::Status MakeDirectories(const std::string& dir) {
  std::vector<std::string> created;
  for (fs::path p = dir; !p.empty(); p = p.parent_path()) {
    std::error_code ec;
    if (fs::exists(p, ec)) break;
    created.push_back(p.string());
    if (p == p.parent_path()) break;
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    // A file where a directory must be is EEXIST to mkdir: "not a directory".
    const int err = ec == std::errc::file_exists ? ENOTDIR : ec.value();
    return ErrnoStorageError("creating directory", dir, err);
  }
  for (const std::string& d : created) FsyncDir(ParentDir(d));
  return absl::OkStatus();
}

std::string JoinPath(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (b.empty()) return a;
  if (a.back() == '/') return b.front() == '/' ? a + b.substr(1) : a + b;
  return b.front() == '/' ? a + b : a + "/" + b;
}

absl::Status FileCheckpointStorage::WriteFileAtomic(const std::string& path,
                                                    absl::Span<const std::string_view> pieces) {
  const std::string dir = ParentDir(path);
  if (absl::Status s = MakeDirectories(dir); !s.ok()) return s;
  return WriteFileAtomically(path, pieces);
}

absl::StatusOr<std::string> FileCheckpointStorage::Read(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("opening", path, errno);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return ErrnoError("stat", path, errno);
  if (S_ISDIR(st.st_mode))
    return absl::UnavailableError(absl::StrCat("reading ", path, ": is a directory"));
  std::string out;
  out.resize(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (true) {
    if (done == out.size()) out.resize(out.size() + 4096);  // the file may have grown
    const ssize_t r = ::read(fd, out.data() + done, out.size() - done);
    if (r < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("reading", path, errno);
    }
    if (r == 0) break;
    done += static_cast<size_t>(r);
  }
  out.resize(done);
  return out;
}

absl::StatusOr<std::vector<std::string>> FileCheckpointStorage::List(const std::string& dir) {
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) {
    const std::string msg = absl::StrCat("listing ", dir, ": ", ec.message());
    if (ec == std::errc::no_such_file_or_directory) return absl::NotFoundError(msg);
    return absl::UnavailableError(msg);
  }
  std::vector<std::string> names;
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    names.push_back(it->path().filename().string());
  }
  if (ec) return absl::UnavailableError(absl::StrCat("listing ", dir, ": ", ec.message()));
  std::sort(names.begin(), names.end());
  return names;
}

absl::Status FileCheckpointStorage::RemoveAll(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  // A path under a file (ENOTDIR) does not exist either.
  if (ec && ec != std::errc::not_a_directory)
    return ErrnoStorageError("removing", path, ec.value());
  FsyncDir(ParentDir(path));
  return absl::OkStatus();
}

absl::StatusOr<int64_t> FileCheckpointStorage::FreeBytes(const std::string& path) {
  return FreeBytesAt(path);
}

absl::Status CheckRoomFor(CheckpointStorage& storage, const std::string& path, uint64_t bytes) {
  absl::StatusOr<int64_t> free = storage.FreeBytes(path);
  if (!free.ok() || *free < 0 || static_cast<uint64_t>(*free) >= bytes) return absl::OkStatus();
  return NoRoomError(path, static_cast<int64_t>(bytes), *free);
}

}  // namespace shardtrain::checkpoint
