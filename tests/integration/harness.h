// Real processes for integration tests: the coordinator, workers and the CLI
// binaries started as children on 127.0.0.1 with port 0, killed on scope
// exit. Every wait is bounded.
#ifndef SHARDTRAIN_TESTS_INTEGRATION_HARNESS_H_
#define SHARDTRAIN_TESTS_INTEGRATION_HARNESS_H_

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace shardtrain::testing {

// A child process; SIGKILLed and reaped on destruction if still running.
class Process {
 public:
  Process() = default;
  // Runs argv (stdout and stderr to `log_path`) in `cwd`, or in the test's
  // working directory when it is empty.
  Process(std::vector<std::string> argv, std::string log_path, const std::string& cwd = "");
  Process(Process&& o) noexcept;
  Process& operator=(Process&& o) noexcept;
  ~Process();

  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_; }
  void Signal(int sig);
  // Waits for exit up to `timeout`; true when it exited (exit code in *code).
  bool Wait(std::chrono::milliseconds timeout, int* code = nullptr);
  std::string Log() const;

 private:
  void Reap();  // SIGKILL and wait, if still running

  pid_t pid_ = -1;
  std::string log_;
};

struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs a binary to completion (at most `timeout`) and captures its output.
CommandResult RunCommand(const std::vector<std::string>& argv,
                         std::chrono::milliseconds timeout = std::chrono::seconds(60));

// A fresh directory under /tmp, removed by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Polls `pred` every 20 ms until it is true or `timeout` passes.
bool WaitFor(const std::function<bool()>& pred, std::chrono::milliseconds timeout);

struct Coordinator {
  Process process;
  int port = 0;
  int metrics_port = 0;
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }
};

// Starts shardtrain-coordinator on `listen` (default port 0) with its state
// in `state_dir`, and waits for its port file. `lease_ms` 0: the default
// lease (no --lease-ms). `cwd`: its working directory (default: the
// test's). `extra`: more flags
// (--tokens, --tls-cert, ...).
Coordinator StartCoordinator(const std::string& dir, int64_t lease_ms,
                             const std::string& listen = "127.0.0.1:0", const std::string& cwd = "",
                             const std::vector<std::string>& extra = {});
Process StartWorker(const std::string& dir, const std::string& coordinator, int index,
                    const std::vector<std::string>& extra = {}, const std::string& cwd = "");
// Runs `shardtrain ARGS... --coordinator ADDR` (when `coordinator` is set).
CommandResult Cli(const std::vector<std::string>& args, const std::string& coordinator = "");

std::string SourceDir();

}  // namespace shardtrain::testing

#endif  // SHARDTRAIN_TESTS_INTEGRATION_HARNESS_H_
