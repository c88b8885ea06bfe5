#include "tests/integration/etcd_harness.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>

namespace shardtrain::testing {
namespace {

constexpr char kEtcd[] = "/usr/bin/etcd";

}  // namespace

// The kernel's pick for port 0: free again when the socket closes, and taken
// by the caller's server a moment later.
int FreeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

namespace {

std::string Http(int port) { return "http://127.0.0.1:" + std::to_string(port); }

}  // namespace

bool HaveEtcd() { return ::access(kEtcd, X_OK) == 0; }
bool HaveEtcdctl() { return ::access(kEtcdctl, X_OK) == 0; }

EtcdCluster::EtcdCluster(const std::string& dir, int members) : dir_(dir) {
  // A port picked free may be taken by another test before its member binds
  // it (ctest runs tests in parallel): that member exits and the cluster
  // never forms. Then every member is stopped, its data and log removed, and
  // the cluster starts again on new ports (three tries).
  for (int attempt = 1; attempt <= 3 && !ok_; ++attempt) {
    for (Member& m : members_) {
      m.process.Signal(SIGKILL);
      m.process.Wait(std::chrono::seconds(5));
    }
    members_.clear();
    for (int i = 0; i < members; ++i) {
      Member m;
      m.name = "etcd" + std::to_string(i);
      m.client_port = FreeLoopbackPort();
      m.peer_port = FreeLoopbackPort();
      std::error_code ec;
      std::filesystem::remove_all(dir_ + "/" + m.name + ".etcd", ec);
      std::filesystem::remove(dir_ + "/" + m.name + ".log", ec);
      members_.push_back(std::move(m));
    }
    for (int i = 0; i < members; ++i) Launch(i, /*fresh=*/true);
    ok_ = true;
    for (int i = 0; i < members; ++i) ok_ = WaitReady(i) && ok_;
  }
}

void EtcdCluster::Launch(int i, bool fresh) {
  Member& m = members_[i];
  std::string cluster;
  for (const Member& o : members_) {
    if (!cluster.empty()) cluster += ",";
    cluster += o.name + "=" + Http(o.peer_port);
  }
  std::vector<std::string> argv = {
      kEtcd, "--name", m.name, "--data-dir", dir_ + "/" + m.name + ".etcd", "--listen-client-urls",
      Http(m.client_port), "--advertise-client-urls", Http(m.client_port), "--listen-peer-urls",
      Http(m.peer_port), "--initial-advertise-peer-urls", Http(m.peer_port), "--initial-cluster",
      cluster, "--initial-cluster-token", "shardtrain-test", "--initial-cluster-state",
      fresh ? "new" : "existing",
      // Loopback: elections in a fraction of a second.
      "--heartbeat-interval", "50", "--election-timeout", "500"};
  m.process = Process(argv, dir_ + "/" + m.name + ".log");
}

bool EtcdCluster::WaitReady(int i) {
  // Ready, or gone (a member that could not bind its port exits at once).
  WaitFor(
      [&] {
        return members_[i].process.Log().find("ready to serve client requests") !=
                   std::string::npos ||
               members_[i].process.Wait(std::chrono::milliseconds(0));
      },
      std::chrono::seconds(30));
  return members_[i].process.Log().find("ready to serve client requests") != std::string::npos;
}

std::string EtcdCluster::url(const std::string& prefix) const {
  std::string u = "etcd://";
  for (size_t i = 0; i < members_.size(); ++i) {
    if (i > 0) u += ",";
    u += endpoint(int(i));
  }
  return u + prefix;
}

std::string EtcdCluster::endpoint(int i) const {
  return "127.0.0.1:" + std::to_string(members_[i].client_port);
}

void EtcdCluster::Kill(int i) {
  members_[i].process.Signal(SIGKILL);
  members_[i].process.Wait(std::chrono::seconds(5));
}

bool EtcdCluster::Start(int i) {
  // A new log: "ready" must be this run's.
  std::filesystem::remove(dir_ + "/" + members_[i].name + ".log");
  Launch(i, /*fresh=*/false);
  return WaitReady(i);
}

}  // namespace shardtrain::testing
