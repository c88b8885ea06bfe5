// The coordinator control_plane_bench measures. CoordinatorUnderTest: the
// coordinator assembled as coordinator/main.cc does, in the bench's
// process. CoordinatorProcess: the real shardtrain-coordinator program in a
// process of its own (--process): started, killed (SIGKILL) and started
// again on the same state and port, its RSS and CPU time read from /proc.
// Header-only, for the bench alone.
#ifndef SHARDTRAIN_BENCH_COORDINATOR_PROCESS_H_
#define SHARDTRAIN_BENCH_COORDINATOR_PROCESS_H_

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "bench/control_plane_rpc.h"
#include "common/metrics.h"
#include "coordinator/clock.h"
#include "coordinator/coordinator.h"
#include "coordinator/service.h"
#include "coordinator/spec_validator.h"
#include "coordinator/state_store.h"

namespace shardtrain::coordinator {

// The coordinator as coordinator/main.cc assembles it, on 127.0.0.1:0 with the
// SQLite store in a fresh temp dir (removed on destruction).
class CoordinatorUnderTest {
 public:
  static absl::StatusOr<std::unique_ptr<CoordinatorUnderTest>> Start(int64_t lease_ms) {
    auto c = std::unique_ptr<CoordinatorUnderTest>(new CoordinatorUnderTest());
    std::string tmpl = (std::filesystem::temp_directory_path() / "cpbench-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) return absl::UnavailableError("mkdtemp failed");
    c->dir_ = tmpl;
    auto store = OpenSqliteStateStore(c->dir_);
    if (!store.ok()) return store.status();
    CoordinatorOptions options;
    options.lease_ms = lease_ms;
    auto core = Coordinator::Create(options, *std::move(store), ValidateSpec, &c->clock_);
    if (!core.ok()) return core.status();
    c->core_ = *std::move(core);
    RegisterCoordinatorMetrics(c->core_.get(), &c->registry_);
    c->service_ = std::make_unique<CoordinatorService>(c->core_.get(), &c->registry_);
    c->server_ = StartServer(c->service_.get(), &c->port_);
    if (!c->server_) return absl::UnavailableError("cannot listen on 127.0.0.1:0");
    const auto period = std::chrono::milliseconds(std::clamp<int64_t>(lease_ms / 10, 20, 500));
    c->ticker_ = std::thread([raw = c.get(), period] {
      std::unique_lock<std::mutex> lock(raw->tick_mu_);
      while (!raw->tick_cv_.wait_for(lock, period, [raw] { return raw->stopping_; })) {
        lock.unlock();
        raw->core_->Tick();
        lock.lock();
      }
    });
    return c;
  }

  ~CoordinatorUnderTest() {
    if (ticker_.joinable()) {
      {
        std::lock_guard<std::mutex> lock(tick_mu_);
        stopping_ = true;
      }
      tick_cv_.notify_all();
      ticker_.join();
    }
    if (core_) core_->Shutdown();
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server_.reset();
    service_.reset();
    core_.reset();
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }

  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

 private:
  CoordinatorUnderTest() = default;

  std::string dir_;
  RealClock clock_;
  MetricsRegistry registry_;
  std::unique_ptr<Coordinator> core_;
  std::unique_ptr<CoordinatorService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::mutex tick_mu_;
  std::condition_variable tick_cv_;
  bool stopping_ = false;  // GUARDED_BY(tick_mu_)
  std::thread ticker_;
};

// Spawns argv with stdout and stderr to `log`; its pid (-1 and the error
// otherwise).
inline absl::StatusOr<pid_t> SpawnLogged(std::vector<std::string> args, const std::string& log) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0)
    return absl::InternalError(absl::StrCat("cannot start ", args[0], ": ", strerror(rc)));
  return pid;
}

// A one-member etcd for the run (Debian's etcd-server), in `dir`, on
// loopback ports picked free; stopped on destruction.
class EtcdProcess {
 public:
  static absl::StatusOr<std::unique_ptr<EtcdProcess>> Start(const std::string& dir) {
    auto e = std::unique_ptr<EtcdProcess>(new EtcdProcess());
    const int client = FreePort(), peer = FreePort();
    const std::string c = absl::StrCat("http://127.0.0.1:", client);
    const std::string p = absl::StrCat("http://127.0.0.1:", peer);
    absl::StatusOr<pid_t> pid =
        SpawnLogged({"/usr/bin/etcd", "--name", "bench", "--data-dir", dir + "/etcd",
                     "--listen-client-urls", c, "--advertise-client-urls", c, "--listen-peer-urls",
                     p, "--initial-advertise-peer-urls", p, "--initial-cluster", "bench=" + p},
                    dir + "/etcd.log");
    if (!pid.ok()) return pid.status();
    e->pid_ = *pid;
    e->url_ = absl::StrCat("etcd://127.0.0.1:", client);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      std::ifstream log(dir + "/etcd.log");
      const std::string text((std::istreambuf_iterator<char>(log)),
                             std::istreambuf_iterator<char>());
      if (text.find("ready to serve client requests") != std::string::npos) return e;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return absl::DeadlineExceededError("etcd did not serve within 30 s (see " + dir + "/etcd.log)");
  }
  ~EtcdProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
    }
  }
  const std::string& url() const { return url_; }

 private:
  EtcdProcess() = default;
  static int FreePort() {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    int port = 0;
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
      port = ntohs(a.sin_port);
    }
    close(fd);
    return port;
  }
  pid_t pid_ = -1;
  std::string url_;
};

// The real shardtrain-coordinator program in its own process (--process):
// 127.0.0.1:0, --port-file, its own --state-dir; TLS and tokens when the run
// has them. Kill9() and Restart() keep the state directory.
class CoordinatorProcess {
 public:
  static absl::StatusOr<std::unique_ptr<CoordinatorProcess>> Start(
      const std::string& binary, const std::string& dir, std::vector<std::string> extra_args) {
    auto c = std::unique_ptr<CoordinatorProcess>(new CoordinatorProcess());
    c->dir_ = dir;
    c->args_ = {binary,         "--listen",    "127.0.0.1:0", "--state-dir",
                dir + "/state", "--port-file", dir + "/port"};
    for (std::string& a : extra_args) c->args_.push_back(std::move(a));
    if (absl::Status s = c->Launch(); !s.ok()) return s;
    return c;
  }
  ~CoordinatorProcess() { Stop(); }

  // Forks and execs the program; waits (60 s at most) for its port file.
  absl::Status Launch() {
    std::filesystem::remove(dir_ + "/port");
    // posix_spawn, not fork: gRPC's fork handlers would disturb this
    // process's live channels (their reconnects failed their TLS handshakes).
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    std::vector<char*> argv;
    for (std::string& a : args_) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int rc = posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) {
      pid_ = -1;
      return absl::InternalError(absl::StrCat("cannot start ", args_[0], ": ", strerror(rc)));
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline) {
      std::ifstream f(dir_ + "/port");
      int port = 0;
      if (f >> port && port > 0) {
        port_ = port;
        return absl::OkStatus();
      }
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return absl::InternalError(absl::StrCat(args_[0], " exited before listening"));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return absl::DeadlineExceededError("the coordinator wrote no port file in 60 s");
  }
  void Kill9() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  void Stop() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  // On the same port (free again after the kill): clients reconnect to the
  // same address, as workers do.
  absl::Status Restart() {
    args_[2] = address();
    return Launch();
  }

  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  int64_t RssBytes() const {
    std::ifstream f(absl::StrCat("/proc/", pid_, "/status"));
    std::string key;
    int64_t kb = 0;
    while (f >> key) {
      if (key == "VmRSS:" && f >> kb) return kb * 1024;
    }
    return 0;
  }
  double CpuSeconds() const {  // user + system time so far
    std::ifstream f(absl::StrCat("/proc/", pid_, "/stat"));
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const size_t close = text.rfind(')');
    if (close == std::string::npos) return 0;
    std::istringstream rest(text.substr(close + 2));
    std::string field;
    double utime = 0, stime = 0;
    for (int i = 3; i <= 15 && rest >> field; ++i) {
      if (i == 14) utime = std::stod(field);
      if (i == 15) stime = std::stod(field);
    }
    return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
  }

 private:
  CoordinatorProcess() = default;
  std::string dir_;
  std::vector<std::string> args_;
  pid_t pid_ = -1;
  int port_ = 0;
};

}  // namespace shardtrain::coordinator

#endif  // SHARDTRAIN_BENCH_COORDINATOR_PROCESS_H_
