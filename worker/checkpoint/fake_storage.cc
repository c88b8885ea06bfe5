#include "worker/checkpoint/fake_storage.h"

#include <set>

#include "absl/strings/str_cat.h"

namespace shardtrain::checkpoint {
namespace {

// "a/b/" -> "a/b"; the form used as map keys and prefixes.
std::string Normalize(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

}  // namespace

absl::Status FakeCheckpointStorage::WriteFileAtomic(const std::string& path,
                                                    absl::Span<const std::string_view> pieces) {
  std::string bytes;
  for (std::string_view piece : pieces) bytes.append(piece.data(), piece.size());
  absl::MutexLock lock(&mu_);
  ++writes_;
  if (!fail_all_.ok()) return fail_all_;
  if (fail_at_ != 0 && writes_ == fail_at_) {
    fail_at_ = 0;
    files_[Normalize(path) + ".tmp"] = bytes.substr(0, bytes.size() / 2);
    return absl::UnavailableError(absl::StrCat("writing ", path, ": injected failure"));
  }
  files_[Normalize(path)] = std::move(bytes);
  return absl::OkStatus();
}

void FakeCheckpointStorage::FailWritesWith(absl::Status error) {
  absl::MutexLock lock(&mu_);
  fail_all_ = std::move(error);
}

void FakeCheckpointStorage::set_free_bytes(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  free_bytes_ = bytes;
}

absl::StatusOr<int64_t> FakeCheckpointStorage::FreeBytes(const std::string&) {
  absl::MutexLock lock(&mu_);
  return free_bytes_;
}

absl::StatusOr<std::string> FakeCheckpointStorage::Read(const std::string& path) {
  absl::MutexLock lock(&mu_);
  auto it = files_.find(Normalize(path));
  if (it == files_.end())
    return absl::NotFoundError(absl::StrCat("opening ", path, ": no such file"));
  return it->second;
}

absl::StatusOr<std::vector<std::string>> FakeCheckpointStorage::List(const std::string& dir) {
  const std::string prefix = Normalize(dir) + "/";
  absl::MutexLock lock(&mu_);
  std::set<std::string> names;
  for (auto it = files_.lower_bound(prefix); it != files_.end(); ++it) {
    if (it->first.compare(0, prefix.size(), prefix) != 0) break;
    const std::string rest = it->first.substr(prefix.size());
    names.insert(rest.substr(0, rest.find('/')));
  }
  if (names.empty())
    return absl::NotFoundError(absl::StrCat("listing ", dir, ": no such directory"));
  return std::vector<std::string>(names.begin(), names.end());
}

absl::Status FakeCheckpointStorage::RemoveAll(const std::string& path) {
  const std::string p = Normalize(path);
  const std::string prefix = p + "/";
  absl::MutexLock lock(&mu_);
  files_.erase(p);
  for (auto it = files_.lower_bound(prefix); it != files_.end();) {
    if (it->first.compare(0, prefix.size(), prefix) != 0) break;
    it = files_.erase(it);
  }
  return absl::OkStatus();
}

void FakeCheckpointStorage::FailNthWrite(int n) {
  absl::MutexLock lock(&mu_);
  fail_at_ = n > 0 ? writes_ + n : 0;
}

absl::Status FakeCheckpointStorage::Truncate(const std::string& path, size_t size) {
  absl::MutexLock lock(&mu_);
  auto it = files_.find(Normalize(path));
  if (it == files_.end()) return absl::NotFoundError(absl::StrCat("no file ", path));
  if (size > it->second.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Truncate(", path, ", ", size, "): file has ", it->second.size(), " bytes"));
  }
  it->second.resize(size);
  return absl::OkStatus();
}

absl::Status FakeCheckpointStorage::FlipByte(const std::string& path, size_t offset) {
  absl::MutexLock lock(&mu_);
  auto it = files_.find(Normalize(path));
  if (it == files_.end()) return absl::NotFoundError(absl::StrCat("no file ", path));
  if (offset >= it->second.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("FlipByte(", path, ", ", offset, "): file has ", it->second.size(), " bytes"));
  }
  it->second[offset] = static_cast<char>(~it->second[offset]);
  return absl::OkStatus();
}

int FakeCheckpointStorage::write_count() const {
  absl::MutexLock lock(&mu_);
  return writes_;
}

bool FakeCheckpointStorage::Exists(const std::string& path) const {
  absl::MutexLock lock(&mu_);
  return files_.count(Normalize(path)) > 0;
}

}  // namespace shardtrain::checkpoint
