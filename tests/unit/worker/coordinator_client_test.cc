// CoordinatorClient against an in-process gRPC server on loopback that
// answers as a coordinator standing by: with a single address (a load
// balancer or a Kubernetes Service in front of the coordinators) the client
// must open a new connection after a standby's answer, or gRPC would keep
// every later call on the standby it reached; any other failure keeps the
// connection.
#include "worker/coordinator_client.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "common/grpc_status.h"

namespace shardtrain::worker {
namespace {

// Answers every Heartbeat UNAVAILABLE, as a standby (naming a leader) or
// plainly, and records which client connection (peer address) each came on.
class Standby final : public v1::Coordinator::Service {
 public:
  explicit Standby(bool names_a_leader) : names_a_leader_(names_a_leader) {}

  grpc::Status Heartbeat(grpc::ServerContext* ctx, const v1::HeartbeatRequest*,
                         v1::HeartbeatResponse*) override {
    std::lock_guard<std::mutex> lock(mu_);
    peers_.insert(ctx->peer());
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        names_a_leader_
                            ? std::string(kCoordinatorStandby) + "the leader is at 10.0.0.9:7070"
                            : "overloaded");
  }
  size_t connections() {
    std::lock_guard<std::mutex> lock(mu_);
    return peers_.size();
  }

 private:
  const bool names_a_leader_;
  std::mutex mu_;
  std::set<std::string> peers_;
};

struct Server {
  explicit Server(bool names_a_leader) : service(names_a_leader) {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(&service);
    server = b.BuildAndStart();
  }
  ~Server() { server->Shutdown(); }
  Standby service;
  int port = 0;
  std::unique_ptr<grpc::Server> server;
};

// Two heartbeats: how many connections the server saw them on.
size_t ConnectionsOverTwoCalls(Server& server) {
  CoordinatorClient client("127.0.0.1:" + std::to_string(server.port), 2'000);
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<v1::HeartbeatResponse> r = client.Heartbeat(v1::HeartbeatRequest());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  }
  return server.service.connections();
}

TEST(CoordinatorClientTest, AStandbysAnswerMakesTheNextCallOnANewConnection) {
  Server standby(/*names_a_leader=*/true);
  ASSERT_GT(standby.port, 0);
  EXPECT_EQ(ConnectionsOverTwoCalls(standby), 2u);
}

TEST(CoordinatorClientTest, AnyOtherUnavailableKeepsTheConnection) {
  Server busy(/*names_a_leader=*/false);
  ASSERT_GT(busy.port, 0);
  EXPECT_EQ(ConnectionsOverTwoCalls(busy), 1u);
}

}  // namespace
}  // namespace shardtrain::worker
