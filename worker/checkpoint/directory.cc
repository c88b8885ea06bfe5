#include "worker/checkpoint/directory.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "worker/checkpoint/loader.h"

namespace shardtrain::checkpoint {
namespace {

constexpr char kStepPrefix[] = "step-";

// Step directories under `dir` (by name), newest first; empty if no `dir`.
absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> StepDirs(CheckpointStorage& storage,
                                                                      const std::string& dir) {
  absl::StatusOr<std::vector<std::string>> names = storage.List(dir);
  if (!names.ok()) {
    if (absl::IsNotFound(names.status())) return std::vector<std::pair<int64_t, std::string>>{};
    return names.status();
  }
  std::vector<std::pair<int64_t, std::string>> out;
  for (const std::string& name : *names) {
    if (std::optional<int64_t> step = ParseStepDirName(name)) {
      out.emplace_back(*step, JoinPath(dir, name));
    }
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

// The manifest of one step directory, checked to be for that step.
// NotFound if there is none; DataLoss if it is corrupt.
absl::StatusOr<Manifest> ReadStepManifest(CheckpointStorage& storage, int64_t step,
                                          const std::string& step_dir) {
  const std::string path = ManifestPath(step_dir);
  absl::StatusOr<Manifest> m = ReadManifest(storage, path);
  if (!m.ok()) {
    if (absl::IsNotFound(m.status())) {
      return absl::NotFoundError(
          absl::StrCat(step_dir, " has no manifest (uncommitted: a save cut short)"));
    }
    return m.status();
  }
  if (m->step != step) {
    return absl::DataLossError(
        absl::StrCat("checkpoint manifest ", path, " is for step ", m->step, ", not ", step));
  }
  return m;
}

bool IsMissingOrCorrupt(const absl::Status& s) {
  return absl::IsNotFound(s) || absl::IsDataLoss(s);
}

}  // namespace

std::string StepDirName(int64_t step) { return absl::StrCat(kStepPrefix, step); }

std::string StepDir(const std::string& dir, int64_t step) {
  return JoinPath(dir, StepDirName(step));
}

std::optional<int64_t> ParseStepDirName(const std::string& name) {
  const std::string prefix = kStepPrefix;
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) {
    return std::nullopt;
  }
  const std::string digits = name.substr(prefix.size());
  for (char ch : digits) {
    if (ch < '0' || ch > '9') return std::nullopt;
  }
  int64_t step = 0;
  if (!absl::SimpleAtoi(digits, &step) || StepDirName(step) != name) return std::nullopt;
  return step;
}

absl::StatusOr<std::vector<CommittedCheckpoint>> ListCommitted(CheckpointStorage& storage,
                                                               const std::string& dir) {
  auto dirs = StepDirs(storage, dir);
  if (!dirs.ok()) return dirs.status();
  std::vector<CommittedCheckpoint> out;
  for (auto& [step, step_dir] : *dirs) {
    absl::StatusOr<Manifest> m = ReadStepManifest(storage, step, step_dir);
    if (!m.ok()) {
      if (IsMissingOrCorrupt(m.status())) continue;
      return m.status();
    }
    out.push_back(CommittedCheckpoint{step, step_dir, *std::move(m)});
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> RemoveStepDirsBelow(CheckpointStorage& storage,
                                                             const std::string& dir, int64_t step) {
  auto dirs = StepDirs(storage, dir);
  if (!dirs.ok()) return dirs.status();
  std::vector<std::string> removed;
  for (auto it = dirs->rbegin(); it != dirs->rend() && it->first < step; ++it) {
    if (absl::Status s = storage.RemoveAll(ManifestPath(it->second)); !s.ok()) return s;
    if (absl::Status s = storage.RemoveAll(it->second); !s.ok()) return s;
    removed.push_back(it->second);
  }
  return removed;
}

absl::StatusOr<LatestValidResult> LatestValid(CheckpointStorage& storage, const std::string& dir) {
  auto dirs = StepDirs(storage, dir);
  if (!dirs.ok()) return dirs.status();
  LatestValidResult result;
  for (auto& [step, step_dir] : *dirs) {
    absl::StatusOr<Manifest> m = ReadStepManifest(storage, step, step_dir);
    absl::Status s = m.status();
    if (s.ok()) s = VerifyShards(storage, step_dir, *m);
    if (s.ok()) {
      result.checkpoint = CommittedCheckpoint{step, step_dir, *std::move(m)};
      return result;
    }
    if (!IsMissingOrCorrupt(s)) return s;
    result.skipped.push_back(SkippedCheckpoint{step_dir, s});
  }
  return result;
}

}  // namespace shardtrain::checkpoint
