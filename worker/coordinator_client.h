// A worker's (or the CLI's) connection to the coordinator: the generated stub
// behind calls that return absl::Status, each with a deadline, so nothing
// waits on the coordinator forever. The worker side uses it through
// CoordinatorApi; the CLI also reaches the whole service through stub().
//
// Thread-safe (gRPC channels and stubs are).
#ifndef SHARDTRAIN_WORKER_COORDINATOR_CLIENT_H_
#define SHARDTRAIN_WORKER_COORDINATOR_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "shardtrain/v1/coordinator.grpc.pb.h"
#include "worker/coordinator_api.h"

namespace shardtrain::worker {

class CoordinatorClient final : public CoordinatorApi {
 public:
  // `address` is HOST:PORT. Connecting is lazy: errors show up on calls.
  // `rpc_timeout_ms` bounds every unary call (KvGet and
  // WaitCheckpointShards add their own wait) except Heartbeat, which has
  // its own, shorter `heartbeat_timeout_ms`: a heartbeat that cannot
  // answer soon is retried by the next one, well inside the lease.
  explicit CoordinatorClient(const std::string& address, int64_t rpc_timeout_ms = 10'000,
                             int64_t heartbeat_timeout_ms = 2'000);

  const std::string& address() const { return address_; }
  v1::Coordinator::Stub& stub() { return *stub_; }

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
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

}  // namespace shardtrain::worker

#endif  // SHARDTRAIN_WORKER_COORDINATOR_CLIENT_H_
