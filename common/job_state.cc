#include "common/job_state.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/enum_names.h"

namespace shardtrain {
namespace {

absl::string_view Absl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

}  // namespace

bool IsTerminal(JobState state) {
  return state == JobState::kSucceeded || state == JobState::kFailed ||
         state == JobState::kCancelled;
}

absl::Status CheckTransition(JobState from, JobState to) {
  using S = JobState;
  bool allowed = false;
  switch (from) {
    case S::kPending:
      allowed = to == S::kScheduled || to == S::kFailed || to == S::kCancelled;
      break;
    case S::kScheduled:
      // PENDING: a worker died before training started, so the job re-queues.
      allowed = to == S::kRunning || to == S::kPending || to == S::kFailed || to == S::kCancelled;
      break;
    case S::kRunning:
      allowed =
          to == S::kSucceeded || to == S::kFailed || to == S::kCancelled || to == S::kRecovering;
      break;
    case S::kRecovering:
      allowed = to == S::kScheduled || to == S::kFailed || to == S::kCancelled;
      break;
    case S::kSucceeded:
    case S::kFailed:
    case S::kCancelled:
      allowed = false;
      break;
  }
  if (allowed) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("job state ", Absl(JobStateName(from)),
                                                    " cannot move to ", Absl(JobStateName(to)),
                                                    IsTerminal(from) ? " (it is terminal)" : ""));
}

std::string_view JobStateName(JobState state) {
  static constexpr std::string_view kNames[] = {"PENDING",   "SCHEDULED", "RUNNING",  "RECOVERING",
                                                "SUCCEEDED", "FAILED",    "CANCELLED"};
  return NameIn(kNames, state, std::string_view("UNKNOWN"));
}

absl::StatusOr<JobState> ParseJobState(std::string_view name) {
  for (JobState s : kAllJobStates) {
    if (absl::EqualsIgnoreCase(Absl(name), Absl(JobStateName(s)))) return s;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown job state \"", Absl(name),
      "\" (expected PENDING, SCHEDULED, RUNNING, RECOVERING, SUCCEEDED, FAILED or CANCELLED)"));
}

}  // namespace shardtrain
