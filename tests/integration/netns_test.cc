// Multi-host recovery over real links: a coordinator host and 4 worker hosts,
// each a network namespace with its own address on a private bridge
// (10.231.0.0/24, veth pairs; the bridge has no address, so nothing is routed
// to or from the machine's own networks). An elastic 4-rank job trains
// across the hosts; one worker host's link is cut mid-run (`ip link set ...
// down`) and the job must recover on the others and finish.
//
// Needs root and iproute2 (`ip netns`); skips with a message elsewhere. Every
// namespace and link it made is removed when the test ends, passed or failed.
// Where bridged frames pass through iptables (br_netfilter, which a Docker
// engine loads, with its FORWARD policy DROP), the test lets its own
// bridge's traffic through with one rule of its own, removed at the end.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "tests/integration/harness.h"
#include "tests/integration/training_util.h"

namespace shardtrain::testing {
namespace {

constexpr int kWorkers = 4;
constexpr char kCoordinatorIp[] = "10.231.0.1";
std::string WorkerIp(int i) { return "10.231.0." + std::to_string(11 + i); }

std::string IptablesBinary() {
  for (const char* p : {"/usr/sbin/iptables", "/sbin/iptables"}) {
    if (access(p, X_OK) == 0) return p;
  }
  return "";
}

std::string IpBinary() {
  for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (access(p, X_OK) == 0) return p;
  }
  return "";
}

// The namespaces, veth pairs and bridge of one test run, named after the
// test's pid so concurrent runs do not collide. The destructor deletes them
// all (a namespace's deletion takes its veth pair with it).
class Hosts {
 public:
  explicit Hosts(std::string ip) : ip_(std::move(ip)), tag_(std::to_string(getpid() % 100000)) {}
  ~Hosts() {
    // The links first: a deleted namespace may linger (and keep its veth
    // pair) while the kernel still holds sockets of it.
    for (size_t h = 0; h < namespaces_.size(); ++h) Ip({"link", "del", HostEnd(int(h))});
    for (const std::string& ns : namespaces_) Ip({"netns", "del", ns});
    if (bridge_made_) Ip({"link", "del", Bridge()});
    if (forward_rule_) RunCommand(ForwardRule("-D"), std::chrono::seconds(20));
  }

  // Empty on success, else what failed (the command and its output).
  std::string Build(int hosts) {
    if (std::string e = Ip({"link", "add", Bridge(), "type", "bridge"}); !e.empty()) return e;
    bridge_made_ = true;
    if (std::string e = Ip({"link", "set", Bridge(), "up"}); !e.empty()) return e;
    // Frames between this bridge's ports may be filtered by iptables'
    // FORWARD chain (br_netfilter): accept them, this bridge's only.
    if (!IptablesBinary().empty() &&
        RunCommand(ForwardRule("-I"), std::chrono::seconds(20)).exit_code == 0) {
      forward_rule_ = true;
    }
    for (int h = 0; h < hosts; ++h) {
      const std::string ns = Namespace(h);
      if (std::string e = Ip({"netns", "add", ns}); !e.empty()) return e;
      namespaces_.push_back(ns);
      const std::string address = (h == 0 ? std::string(kCoordinatorIp) : WorkerIp(h - 1)) + "/24";
      for (const std::vector<std::string>& cmd : std::vector<std::vector<std::string>>{
               {"link", "add", HostEnd(h), "type", "veth", "peer", "name", "eth0", "netns", ns},
               {"link", "set", HostEnd(h), "master", Bridge(), "up"},
               {"-n", ns, "link", "set", "lo", "up"},
               {"-n", ns, "addr", "add", address, "dev", "eth0"},
               {"-n", ns, "link", "set", "eth0", "up"}}) {
        if (std::string e = Ip(cmd); !e.empty()) return e;
      }
    }
    return "";
  }

  // Host 0 is the coordinator's, host 1 + i worker i's.
  std::string Namespace(int h) const { return "st" + tag_ + "-h" + std::to_string(h); }
  // The root-namespace end of host h's link (on the bridge).
  std::string HostEnd(int h) const { return "stv" + tag_ + "h" + std::to_string(h); }
  std::string Bridge() const { return "stbr" + tag_; }

  // argv run inside host h's namespace.
  std::vector<std::string> In(int h, std::vector<std::string> argv) const {
    argv.insert(argv.begin(), {ip_, "netns", "exec", Namespace(h)});
    return argv;
  }

  // iptables `op` (-I or -D) of the rule accepting the bridge's own frames.
  std::vector<std::string> ForwardRule(const std::string& op) const {
    return {IptablesBinary(), op, "FORWARD", "-i", Bridge(), "-o", Bridge(), "-j", "ACCEPT"};
  }

  std::string Ip(std::vector<std::string> args) const {
    args.insert(args.begin(), ip_);
    CommandResult r = RunCommand(args, std::chrono::seconds(20));
    if (r.exit_code == 0) return "";
    std::string cmd;
    for (const std::string& a : args) cmd += a + " ";
    return cmd + "-> exit " + std::to_string(r.exit_code) + ": " + r.err;
  }

 private:
  const std::string ip_;
  const std::string tag_;
  std::vector<std::string> namespaces_;
  bool bridge_made_ = false;
  bool forward_rule_ = false;
};

class MultiHostTest : public TrainingTest {
 protected:
  std::string Cli(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {SHARDTRAIN_CLI_BIN};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.insert(argv.end(), {"--coordinator", address_});
    CommandResult r = RunCommand(hosts_->In(0, argv), std::chrono::seconds(30));
    return r.out + r.err;
  }
  std::string Status(const std::string& job) { return Cli({"status", job, "-o", "json"}); }
  std::string State(const std::string& job) { return Field(Status(job), "state"); }
  int Step(const std::string& job) {
    std::smatch m;
    const std::string s = Status(job);
    return std::regex_search(s, m, std::regex("\"step\": (\\d+)")) ? std::stoi(m[1]) : -1;
  }

  std::unique_ptr<Hosts> hosts_;
  std::string address_;
};

TEST_F(MultiHostTest, CutLinkOfOneWorkerHostTheJobRecoversOnTheOthersAndFinishes) {
  const std::string ip = IpBinary();
  if (ip.empty()) GTEST_SKIP() << "no `ip` (iproute2): cannot make network namespaces";
  if (geteuid() != 0) GTEST_SKIP() << "not root: cannot make network namespaces";
  TempDir dir;
  // Declared before the processes, so the links outlive them.
  hosts_ = std::make_unique<Hosts>(ip);
  if (std::string e = hosts_->Build(1 + kWorkers); !e.empty()) {
    GTEST_SKIP() << "cannot make network namespaces here: " << e;
  }

  const std::string port_file = dir.path() + "/coordinator.port";
  Process coordinator(
      hosts_->In(
          0, {SHARDTRAIN_COORDINATOR_BIN, "--listen", std::string(kCoordinatorIp) + ":0",
              "--state-dir", dir.path() + "/state", "--port-file", port_file, "--lease-ms", "2000",
              // Plaintext off loopback: a private link between namespaces.
              "--insecure"}),
      dir.path() + "/coordinator.log");
  int port = 0;
  ASSERT_TRUE(WaitFor(
      [&] {
        std::ifstream in(port_file);
        return static_cast<bool>(in >> port);
      },
      seconds(20)))
      << coordinator.Log();
  address_ = std::string(kCoordinatorIp) + ":" + std::to_string(port);
  std::vector<Process> workers;
  for (int i = 0; i < kWorkers; ++i) {
    workers.emplace_back(
        hosts_->In(1 + i, {SHARDTRAIN_WORKER_BIN, "--coordinator", address_, "--collective-address",
                           WorkerIp(i), "--heartbeat-ms", "100", "--threads", "1"}),
        dir.path() + "/worker-" + std::to_string(i) + ".log");
  }
  ASSERT_TRUE(WaitFor(
      [&] {
        const std::string w = Cli({"workers", "-o", "json"});
        const std::regex id("\"worker_id\"");
        return std::distance(std::sregex_iterator(w.begin(), w.end(), id),
                             std::sregex_iterator()) >= kWorkers;
      },
      seconds(30)))
      << Cli({"workers"});

  const std::string submitted =
      Cli({"submit", kDdpSpec, "--set", "data.train=" + kData, "--set",
           "checkpoint.dir=" + dir.path() + "/ckpt", "--set", "eval.every=0", "--set", "steps=30",
           "--set", "checkpoint.every=10", "--set", "resources.min_workers=2", "--set",
           "resources.max_workers=4", "--set", "timeouts.collective_s=10"});
  std::smatch m;
  ASSERT_TRUE(std::regex_search(submitted, m, std::regex("j-\\d+"))) << submitted;
  const std::string job = m[0];
  ASSERT_TRUE(WaitFor([&] { return Step(job) >= 12; }, seconds(60))) << Status(job);
  EXPECT_NE(Status(job).find("\"world\": 4"), std::string::npos) << Status(job);

  // Cut the link of the host running rank 2: its process lives on, unreachable.
  const std::string status = Status(job);
  ASSERT_TRUE(std::regex_search(status, m, std::regex("\"rank\": 2, \"worker_id\": \"(w-\\d+)\"")))
      << status;
  int victim = -1;
  for (int i = 0; i < kWorkers; ++i) {
    if (workers[i].Log().find(" as " + m[1].str() + " ") != std::string::npos) victim = i;
  }
  ASSERT_GE(victim, 0) << "no worker log names " << m[1];
  ASSERT_EQ(hosts_->Ip({"link", "set", hosts_->HostEnd(1 + victim), "down"}), "");
  std::cout << "cut the link of host " << WorkerIp(victim) << " (" << m[1] << ", rank 2) at step "
            << Step(job) << std::endl;

  // On failure, the end of every worker's log too (a rank that died says why there).
  auto logs = [&] {
    std::string out;
    for (int i = 0; i < kWorkers; ++i) {
      const std::string log = workers[i].Log();
      out += "--- worker " + std::to_string(i) + " log (end):\n" +
             log.substr(log.size() > 3000 ? log.size() - 3000 : 0) + "\n";
    }
    return out;
  };
  ASSERT_TRUE(WaitFor([&] { return State(job) == "SUCCEEDED"; }, seconds(90)))
      << Status(job) << "\n"
      << Cli({"watch", job}) << logs();
  const std::string done = Status(job);
  EXPECT_NE(done.find("\"world\": 2"), std::string::npos) << done;
  EXPECT_EQ(done.find("\"worker_id\": \"" + m[1].str() + "\""), std::string::npos) << done;
  const std::string watch = Cli({"watch", job});
  EXPECT_NE(watch.find("elastic: world 4 -> 2"), std::string::npos) << watch;
  const std::vector<double> losses = Losses(Cli({"history", job, "-o", "json"}));
  EXPECT_EQ(losses.size(), 30u);
  std::cout << watch << std::endl;
}

}  // namespace
}  // namespace shardtrain::testing
