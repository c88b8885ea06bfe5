#include "common/process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

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

absl::Status WriteFileAtomically(const std::string& path, const std::string& content) {
  std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus("cannot create", tmp);
  size_t done = 0;
  while (done < content.size()) {
    ssize_t n = write(fd, content.data() + done, content.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      absl::Status s = ErrnoStatus("cannot write", tmp);
      close(fd);
      unlink(tmp.c_str());
      return s;
    }
    done += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0 || close(fd) != 0) {
    absl::Status s = ErrnoStatus("cannot sync", tmp);
    unlink(tmp.c_str());
    return s;
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    absl::Status s = ErrnoStatus("cannot rename to", path);
    unlink(tmp.c_str());
    return s;
  }
  return absl::OkStatus();
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

int64_t PeakRssBytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;
  }
  return 0;
}

}  // namespace shardtrain
