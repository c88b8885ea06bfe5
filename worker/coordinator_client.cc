#include "worker/coordinator_client.h"

#include <grpcpp/grpcpp.h>

#include <chrono>

#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/grpc_status.h"
#include "common/process.h"

namespace shardtrain::worker {

namespace {

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(const ConnectOptions& c) {
  if (c.tls_ca.empty()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions opts;
  opts.pem_root_certs = c.tls_ca;
  opts.pem_cert_chain = c.tls_cert;
  opts.pem_private_key = c.tls_key;
  return grpc::SslCredentials(opts);
}

// A coordinator that restarts (or fails over) is reached again within about
// 2 s: gRPC's default reconnect backoff grows to 120 s, which kept workers
// away from a restarted coordinator for many seconds after it answered.
// Each channel has subchannels of its own, so a new channel to the same
// address is a new connection (Dial); an unused one lets its connection go
// after a minute.
grpc::ChannelArguments ChannelArgs() {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 250);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 250);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_CLIENT_IDLE_TIMEOUT_MS, 60'000);
  return args;
}

// At most one new connection a second per address.
constexpr auto kRedialInterval = std::chrono::seconds(1);

absl::Status ReadIfSet(const std::string& path, std::string* out) {
  if (path.empty()) return absl::OkStatus();
  return ReadFile(path, out);
}

}  // namespace

absl::StatusOr<ConnectOptions> ReadConnectOptions(
    const std::string& token, const std::string& token_file, const std::string& env_token,
    const std::string& tls_ca, const std::string& tls_cert, const std::string& tls_key) {
  ConnectOptions c;
  if (!token.empty()) {
    c.token = token;
  } else if (!token_file.empty()) {
    if (auto s = ReadFile(token_file, &c.token); !s.ok()) return s;
    c.token = std::string(absl::StripAsciiWhitespace(c.token));
    if (c.token.empty())
      return absl::InvalidArgumentError(token_file + ": the token file is empty");
  } else {
    c.token = env_token;
  }
  if (tls_ca.empty() && !(tls_cert.empty() && tls_key.empty())) {
    return absl::InvalidArgumentError("--tls-cert/--tls-key need --tls-ca");
  }
  if (tls_cert.empty() != tls_key.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  if (auto s = ReadIfSet(tls_ca, &c.tls_ca); !s.ok()) return s;
  if (auto s = ReadIfSet(tls_cert, &c.tls_cert); !s.ok()) return s;
  if (auto s = ReadIfSet(tls_key, &c.tls_key); !s.ok()) return s;
  return c;
}

CoordinatorClient::CoordinatorClient(const std::string& address, int64_t rpc_timeout_ms,
                                     const ConnectOptions& connect, int64_t heartbeat_timeout_ms)
    : address_(address),
      rpc_timeout_ms_(rpc_timeout_ms),
      heartbeat_timeout_ms_(heartbeat_timeout_ms),
      authorization_(connect.token.empty() ? "" : "Bearer " + connect.token),
      credentials_(ChannelCredentials(connect)) {
  std::vector<std::string> addresses;
  for (absl::string_view a : absl::StrSplit(address, ',', absl::SkipWhitespace())) {
    addresses.emplace_back(absl::StripAsciiWhitespace(a));
  }
  // None: the caller checked the flag; a call then fails cleanly.
  if (addresses.empty()) addresses.push_back(address);
  for (const std::string& a : addresses) {
    endpoints_.push_back(std::make_unique<Endpoint>());
    endpoints_.back()->address = a;
    Dial(*endpoints_.back());
  }
}

void CoordinatorClient::Dial(Endpoint& e) {
  std::lock_guard<std::mutex> lock(e.mu);
  e.channels.push_back(grpc::CreateCustomChannel(e.address, credentials_, ChannelArgs()));
  e.stubs.push_back(v1::Coordinator::NewStub(e.channels.back()));
  e.stub = e.stubs.back().get();
}

std::string CoordinatorClient::current_address() const {
  return endpoints_[current_.load() % endpoints_.size()]->address;
}

v1::Coordinator::Stub& CoordinatorClient::stub() {
  return *endpoints_[current_.load() % endpoints_.size()]->stub.load();
}

bool CoordinatorClient::FollowLeader(const grpc::Status& s) {
  if (endpoints_.size() < 2) {
    Endpoint& e = *endpoints_.front();
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE &&
        s.error_message().find(kCoordinatorStandby) != std::string::npos) {
      bool due;
      {
        std::lock_guard<std::mutex> lock(e.mu);
        const auto now = std::chrono::steady_clock::now();
        due = now - e.redialed >= kRedialInterval;
        if (due) e.redialed = now;
      }
      if (due) Dial(e);
    }
    return false;
  }
  const size_t from = current_.load() % endpoints_.size();
  size_t to = (from + 1) % endpoints_.size();
  // A standby names the leader: "... the leader is at HOST:PORT".
  const std::string& msg = s.error_message();
  const std::string kLeaderIs = "the leader is at ";
  if (const size_t at = msg.find(kLeaderIs); at != std::string::npos) {
    const std::string leader = msg.substr(at + kLeaderIs.size());
    for (size_t i = 0; i < endpoints_.size(); ++i) {
      if (leader.rfind(endpoints_[i]->address, 0) == 0 && i != from) to = i;
    }
  }
  size_t expected = from;
  current_.compare_exchange_strong(expected, to);
  return true;
}

void CoordinatorClient::Authorize(grpc::ClientContext* ctx) const {
  if (!authorization_.empty()) ctx->AddMetadata("authorization", authorization_);
}

std::unique_ptr<grpc::ClientContext> CoordinatorClient::Context(int64_t extra_ms) const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  Authorize(ctx.get());
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::milliseconds(rpc_timeout_ms_ + extra_ms));
  return ctx;
}

// Calls Method with a fresh deadline, following the leader, and converts
// the status.
#define SHARDTRAIN_UNARY(Method, req, resp)                                              \
  do {                                                                                   \
    grpc::Status s = Invoke([&](v1::Coordinator::Stub& stub, grpc::ClientContext* ctx) { \
      return stub.Method(ctx, req, resp);                                                \
    });                                                                                  \
    if (!s.ok()) return FromGrpcStatus(s, #Method " to " + current_address());           \
  } while (0)

absl::StatusOr<v1::RegisterWorkerResponse> CoordinatorClient::RegisterWorker(
    const v1::RegisterWorkerRequest& r) {
  v1::RegisterWorkerResponse resp;
  SHARDTRAIN_UNARY(RegisterWorker, r, &resp);
  return resp;
}

absl::StatusOr<v1::HeartbeatResponse> CoordinatorClient::Heartbeat(const v1::HeartbeatRequest& r) {
  v1::HeartbeatResponse resp;
  grpc::Status s = Invoke([&](v1::Coordinator::Stub& stub,
                              grpc::ClientContext* ctx) { return stub.Heartbeat(ctx, r, &resp); },
                          heartbeat_timeout_ms_ - rpc_timeout_ms_);  // its own, shorter deadline
  if (!s.ok()) return FromGrpcStatus(s, "Heartbeat to " + current_address());
  return resp;
}

absl::StatusOr<v1::Plan> CoordinatorClient::GetPlan(const std::string& job_id) {
  v1::GetPlanRequest r;
  r.set_job_id(job_id);
  v1::Plan resp;
  SHARDTRAIN_UNARY(GetPlan, r, &resp);
  return resp;
}

absl::StatusOr<v1::ReportStepResponse> CoordinatorClient::ReportStep(
    const v1::ReportStepRequest& r) {
  v1::ReportStepResponse resp;
  SHARDTRAIN_UNARY(ReportStep, r, &resp);
  return resp;
}

absl::Status CoordinatorClient::ReportDone(const v1::ReportDoneRequest& r) {
  v1::ReportDoneResponse resp;
  SHARDTRAIN_UNARY(ReportDone, r, &resp);
  return absl::OkStatus();
}

absl::StatusOr<v1::ReportCheckpointResponse> CoordinatorClient::ReportCheckpoint(
    const v1::ReportCheckpointRequest& r) {
  v1::ReportCheckpointResponse resp;
  SHARDTRAIN_UNARY(ReportCheckpoint, r, &resp);
  return resp;
}

absl::StatusOr<v1::WaitCheckpointShardsResponse> CoordinatorClient::WaitCheckpointShards(
    const v1::WaitCheckpointShardsRequest& r) {
  v1::WaitCheckpointShardsResponse resp;
  grpc::Status s =
      Invoke([&](v1::Coordinator::Stub& stub,
                 grpc::ClientContext* ctx) { return stub.WaitCheckpointShards(ctx, r, &resp); },
             r.wait_ms(), /*deadline_is_an_answer=*/true);  // the server waits up to wait_ms
  if (!s.ok()) return FromGrpcStatus(s, "WaitCheckpointShards to " + current_address());
  return resp;
}

absl::StatusOr<v1::CommitCheckpointResponse> CoordinatorClient::CommitCheckpoint(
    const v1::CommitCheckpointRequest& r) {
  v1::CommitCheckpointResponse resp;
  SHARDTRAIN_UNARY(CommitCheckpoint, r, &resp);
  return resp;
}

absl::StatusOr<v1::ReportCheckpointFailureResponse> CoordinatorClient::ReportCheckpointFailure(
    const v1::ReportCheckpointFailureRequest& r) {
  v1::ReportCheckpointFailureResponse resp;
  SHARDTRAIN_UNARY(ReportCheckpointFailure, r, &resp);
  return resp;
}

absl::Status CoordinatorClient::ReportFailure(const v1::ReportFailureRequest& r) {
  v1::ReportFailureResponse resp;
  SHARDTRAIN_UNARY(ReportFailure, r, &resp);
  return absl::OkStatus();
}

absl::Status CoordinatorClient::ReportEvent(const v1::ReportEventRequest& r) {
  v1::ReportEventResponse resp;
  SHARDTRAIN_UNARY(ReportEvent, r, &resp);
  return absl::OkStatus();
}

absl::Status CoordinatorClient::KvSet(const v1::KvSetRequest& r) {
  v1::KvSetResponse resp;
  SHARDTRAIN_UNARY(KvSet, r, &resp);
  return absl::OkStatus();
}

absl::StatusOr<std::string> CoordinatorClient::KvGet(const v1::KvGetRequest& r) {
  v1::KvGetResponse resp;
  grpc::Status s =
      Invoke([&](v1::Coordinator::Stub& stub,
                 grpc::ClientContext* ctx) { return stub.KvGet(ctx, r, &resp); },
             r.wait_ms(), /*deadline_is_an_answer=*/true);  // the server waits up to wait_ms
  if (!s.ok()) return FromGrpcStatus(s, "KvGet to " + current_address());
  return resp.value();
}

absl::StatusOr<int64_t> CoordinatorClient::KvAdd(const v1::KvAddRequest& r) {
  v1::KvAddResponse resp;
  SHARDTRAIN_UNARY(KvAdd, r, &resp);
  return resp.value();
}

#undef SHARDTRAIN_UNARY

}  // namespace shardtrain::worker
