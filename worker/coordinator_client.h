// A worker's (or the CLI's) connection to the coordinator: the generated stub
// behind calls that return absl::Status, each with a deadline, so nothing
// waits on the coordinator forever. The worker side uses it through
// CoordinatorApi; the CLI also reaches the whole service through stub().
//
// Thread-safe (gRPC channels and stubs are).
#ifndef SHARDTRAIN_WORKER_COORDINATOR_CLIENT_H_
#define SHARDTRAIN_WORKER_COORDINATOR_CLIENT_H_

#include <grpcpp/security/credentials.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "shardtrain/v1/coordinator.grpc.pb.h"
#include "worker/coordinator_api.h"

namespace shardtrain::worker {

// How to reach a coordinator that asks for TLS and tokens. Empty fields:
// plaintext, no token.
struct ConnectOptions {
  std::string token;     // sent as "authorization: Bearer TOKEN" on every call
  std::string tls_ca;    // PEM text of the CA that signed the coordinator's certificate: TLS on
  std::string tls_cert;  // PEM text of this client's certificate chain (mutual TLS)
  std::string tls_key;   // PEM text of its private key
};

// The token and TLS files the programs take (--token, --token-file,
// $SHARDTRAIN_TOKEN; --tls-ca, --tls-cert, --tls-key), read into
// ConnectOptions. The first of `token`, the contents of `token_file`
// (whitespace trimmed) and `env_token` that is set wins. Errors name the file.
absl::StatusOr<ConnectOptions> ReadConnectOptions(
    const std::string& token, const std::string& token_file, const std::string& env_token,
    const std::string& tls_ca, const std::string& tls_cert, const std::string& tls_key);

class CoordinatorClient final : public CoordinatorApi {
 public:
  // `address` is HOST:PORT, or several separated by commas: coordinators
  // that share one etcd, of which one leads (coordinator/etcd_election.h).
  // A call that finds its coordinator unreachable, or a standby (which names
  // the leader), goes to the leader named when it is in the list, else to
  // the next address, each address tried once; the one that answered is
  // used first from then on. Connecting is lazy: errors show up on calls.
  // `rpc_timeout_ms` bounds every unary call (KvGet and
  // WaitCheckpointShards add their own wait) except Heartbeat, which has
  // its own, shorter `heartbeat_timeout_ms`: a heartbeat that cannot
  // answer soon is retried by the next one, well inside the lease.
  // `connect`: token and TLS (ReadConnectOptions).
  explicit CoordinatorClient(const std::string& address, int64_t rpc_timeout_ms = 10'000,
                             const ConnectOptions& connect = {},
                             int64_t heartbeat_timeout_ms = 2'000);

  // Adds the token (if any) to a context the caller made for stub() calls.
  void Authorize(grpc::ClientContext* ctx) const;

  // The addresses as given (comma-separated), and the one in use now.
  const std::string& address() const { return address_; }
  std::string current_address() const;
  // The stub of the coordinator in use now (streams: WatchJob).
  v1::Coordinator::Stub& stub();
  // After a call on stub() failed with `s`: moves to the leader a standby
  // named, or the next address. Returns whether there was another to move
  // to (false with a single address). With a single address (a load
  // balancer, a Kubernetes Service) a standby's answer makes the next call
  // go over a new connection (at most one a second), which the balancer
  // sends to the leader: gRPC keeps a connection, so the calls would stay on
  // the standby it reached.
  bool FollowLeader(const grpc::Status& s);
  // Runs call(stub, context) with a fresh context (the unary deadline plus
  // extra_ms, the token) on the coordinator in use, following the leader
  // on UNAVAILABLE as above; the last answer. A call that ran out of time
  // (a hung or paused coordinator) is not repeated, but the next call goes
  // to the next address — unless `deadline_is_an_answer` (KvGet's and
  // WaitCheckpointShards' waits end that way).
  template <typename Call>
  grpc::Status Invoke(Call call, int64_t extra_ms = 0, bool deadline_is_an_answer = false) {
    grpc::Status s;
    for (size_t tried = 0; tried < endpoints_.size(); ++tried) {
      auto ctx = Context(extra_ms);
      s = call(stub(), ctx.get());
      if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED && !deadline_is_an_answer) {
        FollowLeader(s);
        return s;
      }
      if (s.error_code() != grpc::StatusCode::UNAVAILABLE || !FollowLeader(s)) return s;
    }
    return s;
  }

  absl::StatusOr<v1::RegisterWorkerResponse> RegisterWorker(
      const v1::RegisterWorkerRequest& r) override;
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& r) override;
  absl::StatusOr<v1::Plan> GetPlan(const std::string& job_id) override;
  absl::StatusOr<v1::ReportStepResponse> ReportStep(const v1::ReportStepRequest& r) override;
  absl::Status ReportDone(const v1::ReportDoneRequest& r) override;
  absl::StatusOr<v1::ReportCheckpointResponse> ReportCheckpoint(
      const v1::ReportCheckpointRequest& r) override;
  absl::StatusOr<v1::WaitCheckpointShardsResponse> WaitCheckpointShards(
      const v1::WaitCheckpointShardsRequest& r) override;
  absl::StatusOr<v1::CommitCheckpointResponse> CommitCheckpoint(
      const v1::CommitCheckpointRequest& r) override;
  absl::StatusOr<v1::ReportCheckpointFailureResponse> ReportCheckpointFailure(
      const v1::ReportCheckpointFailureRequest& r) override;
  absl::Status ReportFailure(const v1::ReportFailureRequest& r) override;
  absl::Status ReportEvent(const v1::ReportEventRequest& r) override;
  absl::Status KvSet(const v1::KvSetRequest& r) override;
  absl::StatusOr<std::string> KvGet(const v1::KvGetRequest& r) override;
  absl::StatusOr<int64_t> KvAdd(const v1::KvAddRequest& r) override;

 private:
  // A context with the unary deadline plus `extra_ms`.
  std::unique_ptr<grpc::ClientContext> Context(int64_t extra_ms = 0) const;

  const std::string address_;
  const int64_t rpc_timeout_ms_;
  const int64_t heartbeat_timeout_ms_;
  const std::string authorization_;  // "Bearer TOKEN", empty without a token
  // One address and its connection. A new connection (Redial) replaces the
  // stub in use; the earlier ones are kept, unused, until the client goes
  // (a caller may still hold a reference from stub()), and their channels
  // drop their connections once idle.
  struct Endpoint {
    std::string address;
    std::atomic<v1::Coordinator::Stub*> stub{nullptr};  // the connection in use
    std::mutex mu;                                      // guards what follows
    std::vector<std::shared_ptr<grpc::Channel>> channels;
    std::vector<std::unique_ptr<v1::Coordinator::Stub>> stubs;
    std::chrono::steady_clock::time_point redialed;  // the last Dial after a standby's answer
  };
  // Opens a new connection to e's address and uses it from now on.
  void Dial(Endpoint& e);

  const std::shared_ptr<grpc::ChannelCredentials> credentials_;
  std::vector<std::unique_ptr<Endpoint>> endpoints_;  // one per address; fixed after construction
  std::atomic<size_t> current_{0};                    // the one in use
};

}  // namespace shardtrain::worker

#endif  // SHARDTRAIN_WORKER_COORDINATOR_CLIENT_H_
