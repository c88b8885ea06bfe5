// The coordinator as the worker side sees it: the calls the daemon, the job
// runner and the rendezvous store make, and nothing else. CoordinatorClient
// (worker/coordinator_client.h) is the real one over gRPC; tests use an
// in-memory fake (tests/unit/worker/fake_coordinator.h).
//
// Every call returns the coordinator's answer or its error with the codes of
// proto/shardtrain/v1/coordinator.proto: UNAVAILABLE when it cannot be
// reached or is shutting down (retry), NOT_FOUND for an unknown worker or job
// (a heartbeat's NOT_FOUND means: register again), ABORTED for a stale
// generation, FAILED_PRECONDITION for a report that no longer fits the job,
// DEADLINE_EXCEEDED when a call (or KvGet's wait) ran out.
//
// Implementations must be thread-safe: the daemon calls from its loop thread
// and the job runner from the job's thread at the same time.
#ifndef SHARDTRAIN_WORKER_COORDINATOR_API_H_
#define SHARDTRAIN_WORKER_COORDINATOR_API_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "shardtrain/v1/coordinator.pb.h"

namespace shardtrain::worker {

class CoordinatorApi {
 public:
  virtual ~CoordinatorApi() = default;

  // ---- membership (the daemon)

  // The worker's id (the previous one when the coordinator knows it) and lease.
  virtual absl::StatusOr<v1::RegisterWorkerResponse> RegisterWorker(
      const v1::RegisterWorkerRequest& r) = 0;
  // Renews the lease; the answer's commands say what to run, abort or drain.
  virtual absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& r) = 0;

  // ---- one job's rank (the job runner)

  // The plan of a scheduled job.
  virtual absl::StatusOr<v1::Plan> GetPlan(const std::string& job_id) = 0;
  // The answer's abort is true when the job was cancelled or failed.
  virtual absl::StatusOr<v1::ReportStepResponse> ReportStep(const v1::ReportStepRequest& r) = 0;
  virtual absl::Status ReportDone(const v1::ReportDoneRequest& r) = 0;
  // Checkpoint commits (see the Coordinator service in coordinator.proto):
  // every rank reports its shard, or its failure to write it; rank 0 waits
  // for the set (r.wait_ms at most, then DEADLINE_EXCEEDED), writes the
  // manifest and commits, or reports why it could not.
  virtual absl::StatusOr<v1::ReportCheckpointResponse> ReportCheckpoint(
      const v1::ReportCheckpointRequest& r) = 0;
  virtual absl::StatusOr<v1::WaitCheckpointShardsResponse> WaitCheckpointShards(
      const v1::WaitCheckpointShardsRequest& r) = 0;
  virtual absl::StatusOr<v1::CommitCheckpointResponse> CommitCheckpoint(
      const v1::CommitCheckpointRequest& r) = 0;
  // The answer's abort is true when checkpoint.on_failure failed the job.
  virtual absl::StatusOr<v1::ReportCheckpointFailureResponse> ReportCheckpointFailure(
      const v1::ReportCheckpointFailureRequest& r) = 0;
  virtual absl::Status ReportFailure(const v1::ReportFailureRequest& r) = 0;
  virtual absl::Status ReportEvent(const v1::ReportEventRequest& r) = 0;

  // ---- rendezvous KV of one (job, generation) (the collectives' bootstrap)

  virtual absl::Status KvSet(const v1::KvSetRequest& r) = 0;
  // With r.wait_ms > 0 waits up to that long for the key (then
  // DEADLINE_EXCEEDED); with 0 answers NOT_FOUND at once when it is absent.
  virtual absl::StatusOr<std::string> KvGet(const v1::KvGetRequest& r) = 0;
  // Adds r.delta to the integer key (absent = 0); returns the sum.
  virtual absl::StatusOr<int64_t> KvAdd(const v1::KvAddRequest& r) = 0;
};

}  // namespace shardtrain::worker

#endif  // SHARDTRAIN_WORKER_COORDINATOR_API_H_
