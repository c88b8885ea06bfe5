// How the `shardtrain` CLI ends: its exit codes, and its errors and warnings
// as text for people or as one JSON object for programs. Pure: main and the
// commands print what these return.
//
// With `--output json`, errors and warnings go to stderr as one JSON object
// per line and stdout holds only the data the command prints on success, so
// `shardtrain status J -o json | jq` never parses an error as a job.
#ifndef SHARDTRAIN_CLIENT_ERRORS_H_
#define SHARDTRAIN_CLIENT_ERRORS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace shardtrain::client {

// The exit codes, listed in `shardtrain --help` (ExitCodeHelp).
enum ExitCode : int {
  kExitOk = 0,             // success; watch, submit --wait, local: the job SUCCEEDED
  kExitFailed = 1,         // the job did not succeed, or the operation failed
  kExitUsage = 2,          // bad flags, address or spec
  kExitNotFound = 3,       // no such job or checkpoint
  kExitUnreachable = 4,    // the coordinator did not answer
  kExitInterrupted = 130,  // Ctrl-C or SIGTERM (local)
};

// The one mapping from an error's code to the exit code.
int ExitCodeFor(absl::StatusCode code);

// The table of exit codes for --help.
std::string ExitCodeHelp();

// An error as the CLI reports it.
struct CliError {
  absl::StatusCode code = absl::StatusCode::kUnknown;
  std::string message;  // what happened and what to do, for people
  std::string detail;   // the raw cause (gRPC's words); may be empty
};

// What the user reads for `s`. An unreachable coordinator (UNAVAILABLE,
// DEADLINE_EXCEEDED) becomes a hint naming `coordinator` and what to do, with
// gRPC's own message moved to `detail`; any other error keeps its message.
CliError Describe(const absl::Status& s, const std::string& coordinator, int64_t timeout_ms);

// {"error": {"code": "NOT_FOUND", "message": "...", "detail": "..."}}, one
// line, no newline; "detail" only when there is one.
std::string ErrorJson(const CliError& e);
// "shardtrain: <message>\n", then "shardtrain: detail: <detail>\n" when
// `verbose` and there is a detail.
std::string ErrorText(const CliError& e, bool verbose);
// {"warning": {"message": "..."}}, one line, no newline.
std::string WarningJson(const std::string& message);

// Whether argv asks for JSON output (--output json, --output=json, -o json,
// -ojson), read before the flags are parsed so that a parse error already
// comes out as JSON.
bool WantsJson(int argc, const char* const* argv);

}  // namespace shardtrain::client

#endif  // SHARDTRAIN_CLIENT_ERRORS_H_
