#ifndef SHARDTRAIN_COMMON_JOB_STATE_H_
#define SHARDTRAIN_COMMON_JOB_STATE_H_

// The lifecycle of a job, as a pure state machine. The coordinator checks
// every change of a job's state with CheckTransition before persisting it.
//
//   PENDING ──► SCHEDULED ──► RUNNING ──► SUCCEEDED
//      ▲  │         │  │         │  ├───► FAILED
//      └──┼─────────┘  │         │  └───► CANCELLED
//         │            │         ▼
//         │            │     RECOVERING ──► SCHEDULED (re-gang, new generation)
//         ▼            ▼         └────────► FAILED | CANCELLED
//   FAILED | CANCELLED  FAILED | CANCELLED
//
// PENDING -> FAILED: a queued job that can never run (its stored spec no
// longer validates when the coordinator restarts).
//
// Terminal states (SUCCEEDED, FAILED, CANCELLED) have no way out; no state
// moves to itself. Thread-compatible: everything here is a pure function.

#include <array>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace shardtrain {

enum class JobState {
  kPending,     // accepted and persisted; waiting for a gang of workers
  kScheduled,   // ranks assigned; workers are bootstrapping
  kRunning,     // all ranks started training
  kRecovering,  // a rank failed; waiting to re-gang from the last checkpoint
  kSucceeded,   // all steps done
  kFailed,      // gave up (error, invalid stored spec, or max_restarts exhausted)
  kCancelled,   // cancelled by a user
};

// Every state, in declaration order (for tables and exhaustive tests).
inline constexpr std::array<JobState, 7> kAllJobStates = {
    JobState::kPending,   JobState::kScheduled, JobState::kRunning,  JobState::kRecovering,
    JobState::kSucceeded, JobState::kFailed,    JobState::kCancelled};

// True for SUCCEEDED, FAILED and CANCELLED.
bool IsTerminal(JobState state);

// OK when a job may move from `from` to `to`; otherwise FAILED_PRECONDITION
// naming both states ("job state RUNNING cannot move to PENDING").
absl::Status CheckTransition(JobState from, JobState to);

// "PENDING", "SCHEDULED", "RUNNING", "RECOVERING", "SUCCEEDED", "FAILED",
// "CANCELLED". The view points to static storage.
std::string_view JobStateName(JobState state);

// Inverse of JobStateName; case-insensitive. INVALID_ARGUMENT for other text.
absl::StatusOr<JobState> ParseJobState(std::string_view name);

}  // namespace shardtrain

#endif  // SHARDTRAIN_COMMON_JOB_STATE_H_
