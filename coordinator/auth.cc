#include "coordinator/auth.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <algorithm>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/process.h"

namespace shardtrain::coordinator {
namespace {

constexpr size_t kMinTokenLength = 16;

std::string Digest(absl::string_view token) {
  unsigned char out[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), out);
  return std::string(reinterpret_cast<const char*>(out), sizeof(out));
}

// What a worker daemon and its job runner call.
constexpr absl::string_view kWorkerMethods[] = {"RegisterWorker",
                                                "Heartbeat",
                                                "GetPlan",
                                                "ReportStep",
                                                "ReportCheckpoint",
                                                "WaitCheckpointShards",
                                                "CommitCheckpoint",
                                                "ReportCheckpointFailure",
                                                "ReportDone",
                                                "ReportFailure",
                                                "ReportEvent",
                                                "KvSet",
                                                "KvGet",
                                                "KvAdd"};
// What a user calls (job-scoped ones only on its own jobs).
constexpr absl::string_view kUserMethods[] = {"SubmitJob", "ListJobs",        "GetJob",
                                              "CancelJob", "WatchJob",        "GetHistory",
                                              "GetPlan",   "ListCheckpoints", "GetJobDiagnostics"};

template <size_t N>
bool Contains(const absl::string_view (&methods)[N], absl::string_view m) {
  return std::find(std::begin(methods), std::end(methods), m) != std::end(methods);
}

}  // namespace

std::string RoleName(Role r) {
  switch (r) {
    case Role::kWorker:
      return "worker";
    case Role::kUser:
      return "user";
    case Role::kAdmin:
      return "admin";
  }
  return "?";
}

absl::StatusOr<Authenticator> Authenticator::Parse(absl::string_view text) {
  Authenticator a;
  a.enabled_ = true;
  std::set<std::string> digests;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line.front() == '#') continue;
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipWhitespace());
    const std::string where = absl::StrCat("line ", line_no, ": ");
    if (f.size() != 3) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "want \"TOKEN ROLE NAME\", found ", f.size(), " fields"));
    }
    if (f[0].size() < kMinTokenLength) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "token shorter than ", kMinTokenLength, " characters"));
    }
    Entry e;
    if (f[1] == "worker") {
      e.who.role = Role::kWorker;
    } else if (f[1] == "user") {
      e.who.role = Role::kUser;
    } else if (f[1] == "admin") {
      e.who.role = Role::kAdmin;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "role must be worker, user or admin, not \"", f[1], "\""));
    }
    e.who.name = std::string(f[2]);
    e.digest = Digest(f[0]);
    if (!digests.insert(e.digest).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, "token listed twice"));
    }
    a.entries_.push_back(std::move(e));
  }
  if (a.entries_.empty()) return absl::InvalidArgumentError("no tokens in the file");
  return a;
}

absl::StatusOr<Authenticator> Authenticator::Load(const std::string& path) {
  std::string text;
  if (auto s = ReadFile(path, &text); !s.ok()) return s;
  absl::StatusOr<Authenticator> a = Parse(text);
  if (!a.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", a.status().message()));
  return a;
}

absl::StatusOr<Principal> Authenticator::Authenticate(absl::string_view authorization) const {
  if (!enabled_) return Principal{};
  constexpr absl::string_view kScheme = "Bearer ";
  if (!absl::StartsWith(authorization, kScheme)) {
    return absl::UnauthenticatedError(
        "no bearer token: pass --token, --token-file or set SHARDTRAIN_TOKEN");
  }
  const std::string digest = Digest(authorization.substr(kScheme.size()));
  const Entry* found = nullptr;
  for (const Entry& e : entries_) {  // every entry compared: timing says nothing
    if (CRYPTO_memcmp(e.digest.data(), digest.data(), digest.size()) == 0) found = &e;
  }
  if (!found) return absl::UnauthenticatedError("unknown token");
  return found->who;
}

absl::Status Authorize(const Principal& who, absl::string_view method) {
  const bool allowed = who.role == Role::kAdmin ||
                       (who.role == Role::kWorker && Contains(kWorkerMethods, method)) ||
                       (who.role == Role::kUser && Contains(kUserMethods, method));
  if (allowed) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat(method, " is not allowed for role ", RoleName(who.role), " (", who.name, ")"));
}

absl::Status MayAccessJob(const Principal& who, const std::string& job_id,
                          const std::string& owner) {
  if (who.role != Role::kUser || who.name == owner) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat("job ", job_id, " belongs to another user than ", who.name));
}

bool IsLoopbackHost(absl::string_view host) {
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

}  // namespace shardtrain::coordinator
