#include "worker/comm/rendezvous_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace shardtrain::comm {

absl::Status InMemoryStore::Set(absl::string_view key, absl::string_view value) {
  absl::MutexLock lock(&mu_);
  data_[std::string(key)] = std::string(value);
  return absl::OkStatus();
}

absl::StatusOr<std::string> InMemoryStore::Get(absl::string_view key, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto present = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return data_.find(key) != data_.end(); };
  if (!present()) {
    mu_.AwaitWithTimeout(absl::Condition(&present), timeout);
  }
  auto it = data_.find(key);
  if (it == data_.end()) {
    return absl::DeadlineExceededError(
        absl::StrCat("rendezvous key '", key, "' not set within ", absl::FormatDuration(timeout)));
  }
  return it->second;
}

absl::StatusOr<int64_t> InMemoryStore::Add(absl::string_view key, int64_t delta) {
  absl::MutexLock lock(&mu_);
  int64_t value = 0;
  auto it = data_.find(key);
  if (it != data_.end() && !absl::SimpleAtoi(it->second, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous key '", key, "' holds a non-integer"));
  }
  value += delta;
  data_[std::string(key)] = absl::StrCat(value);
  return value;
}

FileStore::FileStore(std::string dir) : dir_(std::move(dir)) {}

std::string FileStore::PathFor(absl::string_view key) const {
  std::string name;
  name.reserve(key.size());
  for (char c : key) {
    if (c == '/' || c == '%' || c == '\0') {
      absl::StrAppend(&name, "%", absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2));
    } else {
      name.push_back(c);
    }
  }
  return absl::StrCat(dir_, "/", name);
}

namespace {

absl::Status ErrnoError(absl::string_view what, const std::string& path) {
  return absl::UnavailableError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return true;
}

absl::Status WriteAtomically(const std::string& path, absl::string_view value) {
  static std::atomic<uint64_t> counter{0};
  std::string tmp = absl::StrCat(path, ".tmp.", getpid(), ".", counter.fetch_add(1));
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return ErrnoError("open", tmp);
  size_t done = 0;
  while (done < value.size()) {
    ssize_t n = ::write(fd, value.data() + done, value.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      ::close(fd);
      return ErrnoError("write", tmp);
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) return ErrnoError("rename", tmp);
  return absl::OkStatus();
}

}  // namespace

absl::Status FileStore::Set(absl::string_view key, absl::string_view value) {
  return WriteAtomically(PathFor(key), value);
}

absl::StatusOr<std::string> FileStore::Get(absl::string_view key, absl::Duration timeout) {
  const std::string path = PathFor(key);
  const absl::Time deadline = absl::Now() + timeout;
  std::string value;
  while (true) {
    if (ReadFile(path, &value)) return value;
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("rendezvous key '", key, "' not set within ",
                                                      absl::FormatDuration(timeout)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

absl::StatusOr<int64_t> FileStore::Add(absl::string_view key, int64_t delta) {
  const std::string path = PathFor(key);
  const std::string lock_path = path + ".lock";
  int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT, 0644);
  if (fd < 0) return ErrnoError("open", lock_path);
  while (::flock(fd, LOCK_EX) != 0) {
    if (errno != EINTR) {
      ::close(fd);
      return ErrnoError("flock", lock_path);
    }
  }
  int64_t value = 0;
  std::string old;
  absl::Status status;
  if (ReadFile(path, &old) && !absl::SimpleAtoi(old, &value)) {
    status =
        absl::InvalidArgumentError(absl::StrCat("rendezvous key '", key, "' holds a non-integer"));
  } else {
    value += delta;
    status = WriteAtomically(path, absl::StrCat(value));
  }
  ::flock(fd, LOCK_UN);
  ::close(fd);
  if (!status.ok()) return status;
  return value;
}

}  // namespace shardtrain::comm
