#include "common/process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/storage_fault.h"

namespace shardtrain {
namespace {

sigset_t TerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

absl::Status ErrnoStatus(const std::string& what, const std::string& path) {
  std::string msg = absl::StrCat(what, " ", path, ": ", std::strerror(errno));
  switch (errno) {
    case ENOENT:
      return absl::NotFoundError(msg);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(msg);
    default:
      return absl::UnavailableError(msg);
  }
}

}  // namespace

void BlockTerminationSignals() {
  sigset_t set = TerminationSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

int WaitForTerminationSignal() {
  sigset_t set = TerminationSignals();
  int sig = 0;
  sigwait(&set, &sig);
  return sig;
}

absl::Status WriteFileAtomically(const std::string& path,
                                 absl::Span<const std::string_view> pieces) {
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid(), ".", counter++);
  // errno is read before anything else may change it (close, unlink).
  auto fail = [&](const char* what, const std::string& file, int fd = -1) {
    const int err = errno;
    if (fd >= 0) close(fd);
    unlink(tmp.c_str());
    return ErrnoStorageError(what, file, err);
  };
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStorageError("cannot create", tmp, errno);
  for (std::string_view piece : pieces) {
    size_t done = 0;
    while (done < piece.size()) {
      ssize_t n = write(fd, piece.data() + done, piece.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return fail("cannot write", tmp, fd);
      done += static_cast<size_t>(n);
    }
  }
  if (fsync(fd) != 0) return fail("cannot sync", tmp, fd);
  if (close(fd) != 0) return fail("cannot close", tmp);
  if (rename(tmp.c_str(), path.c_str()) != 0) return fail("cannot rename to", path);
  // Make the new directory entry durable too (best effort).
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  const int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& path, std::string_view content) {
  const std::string_view pieces[] = {content};
  return WriteFileAtomically(path, pieces);
}

absl::Status ReadFile(const std::string& path, std::string* out) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return ErrnoStatus("cannot read", path);
  if (S_ISDIR(st.st_mode)) return absl::InvalidArgumentError(absl::StrCat(path, " is a directory"));
  std::ifstream in(path, std::ios::binary);
  if (!in) return ErrnoStatus("cannot read", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return absl::OkStatus();
}

std::string HostName() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

int64_t TotalMemoryBytes() {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? int64_t{pages} * page : 0;
}

namespace {
// A "Name:   N kB" line of /proc/self/status, in bytes (0 if absent).
int64_t StatusBytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) return std::atoll(line.c_str() + field.size()) * 1024;
  }
  return 0;
}
}  // namespace

int64_t PeakRssBytes() { return StatusBytes("VmHWM:"); }

int64_t RssBytes() { return StatusBytes("VmRSS:"); }

void ResetPeakRss() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";  // Linux >= 4.0: VmHWM := current RSS
}

}  // namespace shardtrain
