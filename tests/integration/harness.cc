#include "tests/integration/harness.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace shardtrain::testing {
namespace {

pid_t SpawnTo(const std::vector<std::string>& argv, const std::string& out, const std::string& err,
              const std::string& cwd = "") {
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (!cwd.empty() && chdir(cwd.c_str()) != 0) _exit(126);
    int o = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int e = err == out ? o : open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(o, 1);
    dup2(e, 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

std::string SourceDir() { return SHARDTRAIN_SOURCE_DIR; }

Process::Process(std::vector<std::string> argv, std::string log_path, const std::string& cwd)
    : log_(std::move(log_path)) {
  pid_ = SpawnTo(argv, log_, log_, cwd);
}
Process::Process(Process&& o) noexcept : pid_(o.pid_), log_(std::move(o.log_)) { o.pid_ = -1; }
Process& Process::operator=(Process&& o) noexcept {
  if (this != &o) {
    Reap();
    pid_ = o.pid_;
    log_ = std::move(o.log_);
    o.pid_ = -1;
  }
  return *this;
}
Process::~Process() { Reap(); }

void Process::Reap() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
}

void Process::Signal(int sig) {
  if (pid_ > 0) kill(pid_, sig);
}

bool Process::Wait(std::chrono::milliseconds timeout, int* code) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (pid_ > 0) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      if (code) *code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      pid_ = -1;
      return true;
    }
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

std::string Process::Log() const { return ReadAll(log_); }

CommandResult RunCommand(const std::vector<std::string>& argv, std::chrono::milliseconds timeout) {
  TempDir tmp;
  Process p;
  pid_t pid = SpawnTo(argv, tmp.path() + "/out", tmp.path() + "/err");
  CommandResult r;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) != pid) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      r.err = "(killed: timeout)\n";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = ReadAll(tmp.path() + "/out");
  r.err += ReadAll(tmp.path() + "/err");
  return r;
}

TempDir::TempDir() {
  char tmpl[] = "/tmp/shardtrain-test-XXXXXX";
  if (!mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}
TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

bool WaitFor(const std::function<bool()>& pred, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return pred();
}

Coordinator StartCoordinator(const std::string& dir, int64_t lease_ms, const std::string& listen,
                             const std::string& cwd, const std::vector<std::string>& extra) {
  Coordinator c;
  const std::string port_file = dir + "/coordinator.port";
  std::filesystem::remove(port_file);
  std::vector<std::string> argv = {SHARDTRAIN_COORDINATOR_BIN,
                                   "--listen",
                                   listen,
                                   "--state-dir",
                                   dir + "/state",
                                   "--port-file",
                                   port_file,
                                   "--metrics-listen",
                                   "127.0.0.1:0"};
  if (lease_ms > 0) argv.insert(argv.end(), {"--lease-ms", std::to_string(lease_ms)});
  argv.insert(argv.end(), extra.begin(), extra.end());
  c.process = Process(argv, dir + "/coordinator.log", cwd);
  WaitFor(
      [&] {
        std::ifstream in(port_file);
        return static_cast<bool>(in >> c.port >> c.metrics_port);
      },
      std::chrono::seconds(20));
  return c;
}

Process StartWorker(const std::string& dir, const std::string& coordinator, int index,
                    const std::vector<std::string>& extra, const std::string& cwd) {
  std::vector<std::string> argv = {SHARDTRAIN_WORKER_BIN,
                                   "--coordinator",
                                   coordinator,
                                   "--heartbeat-ms",
                                   "100",
                                   "--threads",
                                   "1"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return Process(argv, dir + "/worker-" + std::to_string(index) + ".log", cwd);
}

CommandResult Cli(const std::vector<std::string>& args, const std::string& coordinator) {
  std::vector<std::string> argv = {SHARDTRAIN_CLI_BIN};
  argv.insert(argv.end(), args.begin(), args.end());
  if (!coordinator.empty()) {
    argv.push_back("--coordinator");
    argv.push_back(coordinator);
  }
  return RunCommand(argv);
}

}  // namespace shardtrain::testing
