// The client side of control_plane_bench (control_plane_bench.cc): how the
// simulated workers and users call the coordinator — credentials and bearer
// tokens, one channel (TCP connection) per client thread, timed unary calls
// made as worker/coordinator_client.cc makes them — and the latency samples
// and table rows the bench prints. Header-only, for the bench alone.
#ifndef SHARDTRAIN_BENCH_CONTROL_PLANE_RPC_H_
#define SHARDTRAIN_BENCH_CONTROL_PLANE_RPC_H_

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "shardtrain/v1/coordinator.grpc.pb.h"

namespace shardtrain::coordinator {

using SteadyClock = std::chrono::steady_clock;

constexpr auto kRpcDeadline = std::chrono::seconds(10);
constexpr auto kHeartbeatPeriod = std::chrono::seconds(1);  // worker daemon default

// How clients reach the coordinator: channel credentials (TLS or plaintext)
// and the bearer token of each role ("" without --tokens); the servers'
// credentials (the baseline's too, so it runs over the same stack).
struct Auth {
  std::string ca_pem;  // TLS: the certificate clients trust; "" = plaintext
  std::shared_ptr<grpc::ServerCredentials> server = grpc::InsecureServerCredentials();
  std::string worker, user, admin;
};
inline Auth& TheAuth() {
  static Auth* auth = new Auth();
  return *auth;
}

// Per-call latencies (µs) of one phase, plus its failures and wall time.
struct Samples {
  std::vector<double> us;
  int64_t errors = 0;
  double seconds = 0;
  void Merge(const Samples& o) {
    us.insert(us.end(), o.us.begin(), o.us.end());
    errors += o.errors;
  }
};

struct Row {
  std::string metric;
  int workers = 0;
  size_t calls = 0;
  int64_t errors = 0;
  double p50 = 0, p99 = 0, max = 0;
  double rate = 0;  // completed calls per second of the phase
};

inline double Micros(SteadyClock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

inline Row MakeRow(const std::string& metric, int workers, Samples s) {
  std::sort(s.us.begin(), s.us.end());
  Row r;
  r.metric = metric;
  r.workers = workers;
  r.calls = s.us.size();
  r.errors = s.errors;
  r.p50 = bench::Percentile(s.us, 0.50);
  r.p99 = bench::Percentile(s.us, 0.99);
  r.max = s.us.empty() ? 0 : s.us.back();
  r.rate = s.seconds > 0 ? static_cast<double>(s.us.size()) / s.seconds : 0;
  return r;
}

// A channel with its own TCP connection (gRPC otherwise shares one connection
// among channels to the same target).
inline std::shared_ptr<grpc::Channel> NewChannel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // Credentials of its own, as each worker process has.
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (!TheAuth().ca_pem.empty()) {
    grpc::SslCredentialsOptions tls;
    tls.pem_root_certs = TheAuth().ca_pem;
    creds = grpc::SslCredentials(tls);
  }
  auto channel = grpc::CreateCustomChannel(address, creds, args);
  channel->WaitForConnected(std::chrono::system_clock::now() + kRpcDeadline);
  return channel;
}

// Times one unary call made like worker/coordinator_client.cc makes it, with
// `token` (a role's bearer token; "" without authentication).
template <typename Call>
inline bool TimedCall(Call&& call, Samples* out, const std::string& token = TheAuth().worker) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + kRpcDeadline);
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  const auto t0 = SteadyClock::now();
  grpc::Status s = call(&ctx);
  out->us.push_back(Micros(SteadyClock::now() - t0));
  if (!s.ok()) ++out->errors;
  return s.ok();
}

inline std::unique_ptr<grpc::Server> StartServer(grpc::Service* service, int* port) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", TheAuth().server, port);
  builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || *port == 0) return nullptr;
  return server;
}

// One stub per client thread, each on its own connection.
inline std::vector<std::unique_ptr<v1::Coordinator::Stub>> NewStubs(const std::string& address,
                                                                    int n) {
  std::vector<std::unique_ptr<v1::Coordinator::Stub>> stubs;
  for (int i = 0; i < n; ++i) stubs.push_back(v1::Coordinator::NewStub(NewChannel(address)));
  return stubs;
}

// Runs body(t) on `threads` threads and merges their samples; wall time of
// the whole run goes into `seconds`.
inline Samples RunThreads(int threads, const std::function<void(int, Samples*)>& body) {
  std::vector<Samples> per(threads);
  std::vector<std::thread> pool;
  const auto t0 = SteadyClock::now();
  for (int t = 0; t < threads; ++t) pool.emplace_back([&, t] { body(t, &per[t]); });
  for (auto& th : pool) th.join();
  Samples all;
  all.seconds = std::chrono::duration<double>(SteadyClock::now() - t0).count();
  for (const Samples& s : per) all.Merge(s);
  return all;
}

}  // namespace shardtrain::coordinator

#endif  // SHARDTRAIN_BENCH_CONTROL_PLANE_RPC_H_
