// Who may call what: bearer tokens from a file, each with a role and a name,
// and the table of methods each role may call. The service checks every RPC
// with it before anything else runs (coordinator/service.cc).
//
// Token file: one token a line, "TOKEN ROLE NAME" separated by spaces; blank
// lines and lines starting with '#' are skipped. ROLE is worker, user or
// admin; NAME identifies the holder (a user's jobs are the ones its name
// submitted). Tokens must be unique and at least 16 characters.
//
// Roles:
//   worker  RegisterWorker, Heartbeat, GetPlan, the reports, the checkpoint
//           calls and the KV store (fencing then checks which worker);
//   user    SubmitJob, ListJobs (its own jobs only), and for its own jobs
//           GetJob, CancelJob, WatchJob, GetHistory, GetPlan, ListCheckpoints;
//   admin   everything, every job.
//
// Thread-safe (immutable after construction).
#ifndef SHARDTRAIN_COORDINATOR_AUTH_H_
#define SHARDTRAIN_COORDINATOR_AUTH_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shardtrain::coordinator {

enum class Role { kWorker, kUser, kAdmin };

struct Principal {
  Role role = Role::kAdmin;
  std::string name;  // empty when authentication is off
};

class Authenticator {
 public:
  // Authentication off: every caller is an admin with an empty name.
  Authenticator() = default;
  // Parses a token file's text; INVALID_ARGUMENT naming the line.
  static absl::StatusOr<Authenticator> Parse(absl::string_view text);
  // Reads and parses the file at `path`; errors name the path.
  static absl::StatusOr<Authenticator> Load(const std::string& path);

  bool enabled() const { return enabled_; }
  // The caller behind an "authorization" metadata value ("Bearer TOKEN"):
  // UNAUTHENTICATED when it is missing, malformed or unknown. With
  // authentication off, an admin whatever the value.
  absl::StatusOr<Principal> Authenticate(absl::string_view authorization) const;

 private:
  struct Entry {
    std::string digest;  // SHA-256 of the token: compared in constant time
    Principal who;
  };
  bool enabled_ = false;
  std::vector<Entry> entries_;
};

// OK when `who` may call `method` (the RPC's name, "CancelJob") at all;
// PERMISSION_DENIED naming the role otherwise. Job ownership is checked
// separately (MayAccessJob).
absl::Status Authorize(const Principal& who, absl::string_view method);
// OK when `who` may see or change a job owned by `owner`: admins and
// workers always, users only their own. PERMISSION_DENIED otherwise.
absl::Status MayAccessJob(const Principal& who, const std::string& job_id,
                          const std::string& owner);

std::string RoleName(Role r);

// Whether `host` (of a listen address) is a loopback one: "localhost",
// 127.0.0.0/8 or ::1. The coordinator serves plaintext only on those unless
// told --insecure.
bool IsLoopbackHost(absl::string_view host);

}  // namespace shardtrain::coordinator

#endif  // SHARDTRAIN_COORDINATOR_AUTH_H_
