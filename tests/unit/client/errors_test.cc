// The CLI's exit-code table, its errors as text and JSON, and the argv scan
// that makes parse errors JSON.
#include "client/errors.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"

namespace shardtrain::client {
namespace {

TEST(CliErrorsTest, EveryStatusCodeHasItsExitCode) {
  using C = absl::StatusCode;
  const std::vector<std::pair<C, int>> table = {
      {C::kOk, 0},
      {C::kCancelled, 130},
      {C::kUnknown, 1},
      {C::kInvalidArgument, 2},
      {C::kDeadlineExceeded, 4},
      {C::kNotFound, 3},
      {C::kAlreadyExists, 1},
      {C::kPermissionDenied, 1},
      {C::kResourceExhausted, 1},
      {C::kFailedPrecondition, 1},
      {C::kAborted, 1},
      {C::kOutOfRange, 2},
      {C::kUnimplemented, 1},
      {C::kInternal, 1},
      {C::kUnavailable, 4},
      {C::kDataLoss, 1},
      {C::kUnauthenticated, 1},
  };
  for (const auto& [code, exit_code] : table) {
    EXPECT_EQ(ExitCodeFor(code), exit_code) << absl::StatusCodeToString(code);
  }
}

TEST(CliErrorsTest, HelpListsEveryExitCode) {
  const std::string help = ExitCodeHelp();
  for (int code :
       {kExitOk, kExitFailed, kExitUsage, kExitNotFound, kExitUnreachable, kExitInterrupted}) {
    EXPECT_NE(help.find(absl::StrCat("\n  ", code, " ")), std::string::npos)
        << code << " missing from:\n"
        << help;
  }
}

TEST(CliErrorsTest, UnreachableCoordinatorBecomesAHintWithTheRawCauseAsDetail) {
  const absl::Status raw = absl::UnavailableError(
      "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Connection "
      "refused");
  CliError e = Describe(raw, "127.0.0.1:1", 10'000);
  EXPECT_EQ(e.code, absl::StatusCode::kUnavailable);
  EXPECT_EQ(e.message,
            "cannot reach the coordinator at 127.0.0.1:1. Start one (shardtrain-coordinator "
            "--state-dir DIR), or point at it with --coordinator HOST:PORT or "
            "SHARDTRAIN_COORDINATOR");
  EXPECT_EQ(e.detail, raw.message());
  // Text: the hint only; -v adds the cause.
  EXPECT_EQ(ErrorText(e, false), "shardtrain: " + e.message + "\n");
  EXPECT_EQ(ErrorText(e, true),
            "shardtrain: " + e.message + "\nshardtrain: detail: " + e.detail + "\n");

  e = Describe(absl::DeadlineExceededError("Deadline Exceeded"), "10.0.0.1:7070", 2000);
  EXPECT_NE(e.message.find("no answer from the coordinator at 10.0.0.1:7070 within 2000 ms"),
            std::string::npos)
      << e.message;
  EXPECT_EQ(e.detail, "Deadline Exceeded");
}

// The coordinator answered UNAVAILABLE because its state store (etcd
// without a majority) refused the write: that is not "cannot reach".
TEST(CliErrorsTest, AStoreThatCannotWriteIsNotAnUnreachableCoordinator) {
  const absl::Status raw =
      absl::UnavailableError(std::string("SubmitJob: ") + kStateStoreUnavailable +
                             "etcd: no member answered Txn within 1000 ms (127.0.0.1:2379)");
  CliError e = Describe(raw, "10.0.0.1:7070", 10'000);
  EXPECT_EQ(e.code, absl::StatusCode::kUnavailable);
  EXPECT_EQ(e.message,
            "the coordinator at 10.0.0.1:7070 answered, but cannot store its state, so nothing was "
            "changed (retry once its store is back): etcd: no member answered Txn within 1000 ms "
            "(127.0.0.1:2379)");
  EXPECT_EQ(ExitCodeFor(e.code), kExitUnreachable);
}

TEST(CliErrorsTest, AStandbyCoordinatorNamesTheLeader) {
  CliError e = Describe(
      absl::UnavailableError(std::string(kCoordinatorStandby) + "the leader is at 10.0.0.2:7070"),
      "10.0.0.1:7070", 10'000);
  EXPECT_EQ(e.message,
            "the coordinator at 10.0.0.1:7070 is a standby: the leader is at 10.0.0.2:7070 "
            "(--coordinator there)");
  EXPECT_EQ(ExitCodeFor(e.code), kExitUnreachable);
}

TEST(CliErrorsTest, OtherErrorsKeepTheirMessage) {
  CliError e = Describe(absl::NotFoundError("job j-9 not found"), "127.0.0.1:7070", 10'000);
  EXPECT_EQ(e.code, absl::StatusCode::kNotFound);
  EXPECT_EQ(e.message, "job j-9 not found");
  EXPECT_EQ(e.detail, "");
  EXPECT_EQ(ErrorText(e, true), "shardtrain: job j-9 not found\n");
}

TEST(CliErrorsTest, JsonIsOneObjectWithCodeMessageAndDetailWhenSet) {
  EXPECT_EQ(ErrorJson({absl::StatusCode::kNotFound, "job j-9 not found", ""}),
            R"({"error": {"code": "NOT_FOUND", "message": "job j-9 not found"}})");
  EXPECT_EQ(ErrorJson({absl::StatusCode::kUnavailable, "say \"hi\"", "line 1\nline 2"}),
            R"({"error": {"code": "UNAVAILABLE", "message": "say \"hi\"", )"
            R"("detail": "line 1\nline 2"}})");
  EXPECT_EQ(WarningJson("no checkpoint.dir"), R"({"warning": {"message": "no checkpoint.dir"}})");
}

bool Json(std::vector<const char*> args) {
  args.insert(args.begin(), "shardtrain");
  return WantsJson(static_cast<int>(args.size()), args.data());
}

TEST(CliErrorsTest, WantsJsonReadsEveryWayOfSayingOutputJson) {
  EXPECT_TRUE(Json({"status", "j-1", "-o", "json"}));
  EXPECT_TRUE(Json({"status", "-ojson"}));
  EXPECT_TRUE(Json({"status", "--output", "json", "j-1"}));
  EXPECT_TRUE(Json({"status", "--output=json"}));
  EXPECT_TRUE(Json({"list", "-o", "table", "-o", "json"}));  // the last one wins
  EXPECT_FALSE(Json({"list", "-o", "json", "-o", "table"}));
  EXPECT_FALSE(Json({"list"}));
  EXPECT_FALSE(Json({"list", "-o"}));
  EXPECT_FALSE(Json({"history", "j-1", "-o", "csv"}));
  EXPECT_FALSE(Json({"submit", "--", "-o", "json"}));  // positional after --
}

}  // namespace
}  // namespace shardtrain::client
