#include "common/job_state.h"

#include <set>
#include <string>
#include <utility>

#include "gtest/gtest.h"

namespace shardtrain {
namespace {

using S = JobState;

// The allowed transitions, written out independently of the implementation.
const std::set<std::pair<S, S>> kAllowed = {
    {S::kPending, S::kScheduled},   {S::kPending, S::kFailed},
    {S::kPending, S::kCancelled},   {S::kScheduled, S::kRunning},
    {S::kScheduled, S::kPending},   {S::kScheduled, S::kFailed},
    {S::kScheduled, S::kCancelled}, {S::kRunning, S::kSucceeded},
    {S::kRunning, S::kFailed},      {S::kRunning, S::kCancelled},
    {S::kRunning, S::kRecovering},  {S::kRecovering, S::kScheduled},
    {S::kRecovering, S::kFailed},   {S::kRecovering, S::kCancelled},
};

TEST(JobStateTest, EveryPairMatchesTheTable) {
  int checked = 0, allowed = 0;
  for (S from : kAllJobStates) {
    for (S to : kAllJobStates) {
      ++checked;
      absl::Status st = CheckTransition(from, to);
      SCOPED_TRACE(std::string(JobStateName(from)) + " -> " + std::string(JobStateName(to)));
      if (kAllowed.count({from, to}) > 0) {
        ++allowed;
        EXPECT_TRUE(st.ok()) << st;
      } else {
        EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
        EXPECT_NE(st.message().find(std::string(JobStateName(from))), absl::string_view::npos)
            << st;
        EXPECT_NE(st.message().find(std::string(JobStateName(to))), absl::string_view::npos) << st;
      }
    }
  }
  EXPECT_EQ(checked, 49);
  EXPECT_EQ(allowed, 14);
}

TEST(JobStateTest, TerminalStatesGoNowhereAndNoSelfTransitions) {
  for (S s : kAllJobStates) {
    EXPECT_FALSE(CheckTransition(s, s).ok()) << JobStateName(s);
    if (IsTerminal(s)) {
      for (S to : kAllJobStates) EXPECT_FALSE(CheckTransition(s, to).ok());
    }
  }
  EXPECT_TRUE(IsTerminal(S::kSucceeded));
  EXPECT_TRUE(IsTerminal(S::kFailed));
  EXPECT_TRUE(IsTerminal(S::kCancelled));
  EXPECT_FALSE(IsTerminal(S::kPending));
  EXPECT_FALSE(IsTerminal(S::kScheduled));
  EXPECT_FALSE(IsTerminal(S::kRunning));
  EXPECT_FALSE(IsTerminal(S::kRecovering));
}

TEST(JobStateTest, NamesRoundTrip) {
  const std::pair<S, const char*> kNames[] = {
      {S::kPending, "PENDING"},       {S::kScheduled, "SCHEDULED"}, {S::kRunning, "RUNNING"},
      {S::kRecovering, "RECOVERING"}, {S::kSucceeded, "SUCCEEDED"}, {S::kFailed, "FAILED"},
      {S::kCancelled, "CANCELLED"}};
  for (const auto& [state, name] : kNames) {
    EXPECT_EQ(JobStateName(state), name);
    auto parsed = ParseJobState(name);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, state);
  }
  auto lower = ParseJobState("running");
  ASSERT_TRUE(lower.ok());
  EXPECT_EQ(*lower, S::kRunning);
}

TEST(JobStateTest, ParseRejectsUnknownNames) {
  for (const char* bad : {"", "RUN", "DONE", "PENDING "}) {
    auto parsed = ParseJobState(bad);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace shardtrain
