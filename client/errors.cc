#include "client/errors.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/output.h"
#include "common/grpc_status.h"

namespace shardtrain::client {

int ExitCodeFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return kExitOk;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return kExitUsage;
    case absl::StatusCode::kNotFound:
      return kExitNotFound;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return kExitUnreachable;
    case absl::StatusCode::kCancelled:
      return kExitInterrupted;
    default:
      return kExitFailed;
  }
}

std::string ExitCodeHelp() {
  return "Exit codes:\n"
         "  0    success (watch, submit --wait, local: the job SUCCEEDED)\n"
         "  1    the job did not succeed, or the operation failed\n"
         "  2    usage error: bad flags, address or spec\n"
         "  3    not found: no such job or checkpoint\n"
         "  4    the coordinator did not answer\n"
         "  130  interrupted (Ctrl-C, SIGTERM)\n";
}

CliError Describe(const absl::Status& s, const std::string& coordinator, int64_t timeout_ms) {
  CliError e{s.code(), std::string(s.message()), ""};
  const std::string what_to_do = absl::StrCat(
      ". Start one (shardtrain-coordinator --state-dir DIR), or point at it with --coordinator ",
      "HOST:PORT or SHARDTRAIN_COORDINATOR");
  if (absl::IsUnavailable(s) && absl::StrContains(s.message(), kStateStoreUnavailable)) {
    const size_t at = s.message().find(kStateStoreUnavailable);
    e.message = absl::StrCat("the coordinator at ", coordinator,
                             " answered, but cannot store its state, so nothing was changed "
                             "(retry once its store is back): ",
                             s.message().substr(at + sizeof(kStateStoreUnavailable) - 1));
  } else if (absl::IsUnavailable(s) && absl::StrContains(s.message(), kCoordinatorStandby)) {
    const size_t at = s.message().find(kCoordinatorStandby);
    e.message =
        absl::StrCat("the coordinator at ", coordinator,
                     " is a standby: ", s.message().substr(at + sizeof(kCoordinatorStandby) - 1),
                     " (--coordinator there)");
  } else if (absl::IsUnavailable(s)) {
    e.message = absl::StrCat("cannot reach the coordinator at ", coordinator, what_to_do);
    e.detail = std::string(s.message());
  } else if (absl::IsDeadlineExceeded(s)) {
    e.message = absl::StrCat("no answer from the coordinator at ", coordinator, " within ",
                             timeout_ms, " ms (--timeout-ms)", what_to_do);
    e.detail = std::string(s.message());
  }
  return e;
}

std::string ErrorJson(const CliError& e) {
  return absl::StrCat("{\"error\": {\"code\": ", JsonString(absl::StatusCodeToString(e.code)),
                      ", \"message\": ", JsonString(e.message),
                      e.detail.empty() ? "" : ", \"detail\": " + JsonString(e.detail), "}}");
}

std::string ErrorText(const CliError& e, bool verbose) {
  std::string out = absl::StrCat("shardtrain: ", e.message, "\n");
  if (verbose && !e.detail.empty()) absl::StrAppend(&out, "shardtrain: detail: ", e.detail, "\n");
  return out;
}

std::string WarningJson(const std::string& message) {
  return absl::StrCat("{\"warning\": {\"message\": ", JsonString(message), "}}");
}

bool WantsJson(int argc, const char* const* argv) {
  std::string output;  // the last one given wins, as in the parser
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") break;  // what follows is positional
    if ((a == "--output" || a == "-o") && i + 1 < argc) {
      output = argv[++i];
    } else if (a.rfind("--output=", 0) == 0) {
      output = a.substr(9);
    } else if (a.rfind("-o", 0) == 0 && a.size() > 2) {
      output = a.substr(2);
    }
  }
  return output == "json";
}

}  // namespace shardtrain::client
