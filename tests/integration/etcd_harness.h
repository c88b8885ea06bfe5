// An etcd cluster for tests: `members` etcd servers (Debian's etcd-server,
// which scripts/setup installs) on 127.0.0.1 with ports picked free, data in
// a directory of the test's; each member can be killed and started again.
// Everything is stopped by the destructor.
#ifndef SHARDTRAIN_TESTS_INTEGRATION_ETCD_HARNESS_H_
#define SHARDTRAIN_TESTS_INTEGRATION_ETCD_HARNESS_H_

#include <string>
#include <vector>

#include "tests/integration/harness.h"

namespace shardtrain::testing {

// Whether an etcd binary is installed (tests skip without it), and etcdctl
// (etcd-client), which reads etcd's history for the fencing test.
bool HaveEtcd();
bool HaveEtcdctl();
inline constexpr const char* kEtcdctl = "/usr/bin/etcdctl";
// A loopback port nothing listens on now.
int FreeLoopbackPort();

class EtcdCluster {
 public:
  // Starts every member and waits until each serves clients (false from
  // ok() otherwise, with the logs in `dir`).
  EtcdCluster(const std::string& dir, int members);
  bool ok() const { return ok_; }
  // "etcd://127.0.0.1:P1,127.0.0.1:P2,..." (with `prefix` appended when set).
  std::string url(const std::string& prefix = "") const;
  std::string endpoint(int i) const;
  void Kill(int i);  // SIGKILL
  // Starts member i again on its data; true once it serves clients.
  bool Start(int i);
  std::string Log(int i) const { return members_[i].process.Log(); }

 private:
  struct Member {
    std::string name;
    int client_port = 0, peer_port = 0;
    Process process;
  };
  void Launch(int i, bool fresh);
  bool WaitReady(int i);

  std::string dir_;
  std::vector<Member> members_;
  bool ok_ = false;
};

}  // namespace shardtrain::testing

#endif  // SHARDTRAIN_TESTS_INTEGRATION_ETCD_HARNESS_H_
