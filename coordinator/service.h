// The gRPC face of the coordinator. Every handler does three things:
// authenticate and authorize the caller (auth.h), validate the request's
// shape, call the core, translate the result
// (common/grpc_status.h is the only status conversion). It also counts RPCs
// and their latency by method for /metrics.
//
// Thread-safe (the core is).
#ifndef SHARDTRAIN_COORDINATOR_SERVICE_H_
#define SHARDTRAIN_COORDINATOR_SERVICE_H_

#include <atomic>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "common/metrics.h"
#include "coordinator/auth.h"
#include "coordinator/coordinator.h"
#include "shardtrain/v1/coordinator.grpc.pb.h"

namespace shardtrain::coordinator {

class CoordinatorService final : public v1::Coordinator::Service {
 public:
  // `core`, `registry` and `auth` must outlive the service. Without `auth`
  // (nullptr) every caller is an admin: authentication off. A null `core`:
  // a standby (etcd_election.h), which answers every RPC (after
  // authenticating it) UNAVAILABLE with kCoordinatorStandby and the
  // leader's address from `leader`, until Serve.
  CoordinatorService(Coordinator* core, MetricsRegistry* registry,
                     const Authenticator* auth = nullptr,
                     std::function<std::string()> leader = nullptr);
  // Elected: from now on every RPC goes to `core` (which must outlive the
  // service).
  void Serve(Coordinator* core) { core_ = core; }

  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest*,
                              v1::RegisterWorkerResponse*) override;
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest*,
                         v1::HeartbeatResponse*) override;
  grpc::Status ListWorkers(grpc::ServerContext*, const v1::ListWorkersRequest*,
                           v1::ListWorkersResponse*) override;
  grpc::Status SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest*,
                         v1::SubmitJobResponse*) override;
  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest*, v1::Job*) override;
  grpc::Status ListJobs(grpc::ServerContext*, const v1::ListJobsRequest*,
                        v1::ListJobsResponse*) override;
  grpc::Status CancelJob(grpc::ServerContext*, const v1::CancelJobRequest*, v1::Job*) override;
  grpc::Status WatchJob(grpc::ServerContext*, const v1::WatchJobRequest*,
                        grpc::ServerWriter<v1::JobEvent>*) override;
  grpc::Status GetHistory(grpc::ServerContext*, const v1::GetHistoryRequest*,
                          v1::GetHistoryResponse*) override;
  grpc::Status GetPlan(grpc::ServerContext*, const v1::GetPlanRequest*, v1::Plan*) override;
  grpc::Status ListCheckpoints(grpc::ServerContext*, const v1::ListCheckpointsRequest*,
                               v1::ListCheckpointsResponse*) override;
  grpc::Status ReportStep(grpc::ServerContext*, const v1::ReportStepRequest*,
                          v1::ReportStepResponse*) override;
  grpc::Status ReportCheckpoint(grpc::ServerContext*, const v1::ReportCheckpointRequest*,
                                v1::ReportCheckpointResponse*) override;
  grpc::Status WaitCheckpointShards(grpc::ServerContext*, const v1::WaitCheckpointShardsRequest*,
                                    v1::WaitCheckpointShardsResponse*) override;
  grpc::Status CommitCheckpoint(grpc::ServerContext*, const v1::CommitCheckpointRequest*,
                                v1::CommitCheckpointResponse*) override;
  grpc::Status ReportCheckpointFailure(grpc::ServerContext*,
                                       const v1::ReportCheckpointFailureRequest*,
                                       v1::ReportCheckpointFailureResponse*) override;
  grpc::Status ReportDone(grpc::ServerContext*, const v1::ReportDoneRequest*,
                          v1::ReportDoneResponse*) override;
  grpc::Status ReportFailure(grpc::ServerContext*, const v1::ReportFailureRequest*,
                             v1::ReportFailureResponse*) override;
  grpc::Status ReportEvent(grpc::ServerContext*, const v1::ReportEventRequest*,
                           v1::ReportEventResponse*) override;
  grpc::Status KvSet(grpc::ServerContext*, const v1::KvSetRequest*, v1::KvSetResponse*) override;
  grpc::Status KvGet(grpc::ServerContext*, const v1::KvGetRequest*, v1::KvGetResponse*) override;
  grpc::Status KvAdd(grpc::ServerContext*, const v1::KvAddRequest*, v1::KvAddResponse*) override;
  grpc::Status GetJobDiagnostics(grpc::ServerContext*, const v1::GetJobDiagnosticsRequest*,
                                 v1::JobDiagnostics*) override;

 private:
  // Authenticates the caller (UNAUTHENTICATED) and checks its role may call
  // `method` (PERMISSION_DENIED), then runs fn(principal); records the RPC's
  // code and latency, converts the status.
  template <typename Fn>
  grpc::Status Handle(grpc::ServerContext* ctx, const char* method, Fn&& fn);
  // PERMISSION_DENIED when `who` is a user and the job is another's;
  // NOT_FOUND for an unknown job.
  absl::Status CheckJobAccess(const Principal& who, const std::string& job_id) const;

  Coordinator* core() const { return core_.load(); }

  std::atomic<Coordinator*> core_;
  const std::function<std::string()> leader_;
  const Authenticator no_auth_;
  const Authenticator* const auth_;
  Family<Counter>& rpcs_;
  Family<Histogram>& latency_;
};

// Registers the coordinator's state gauges (workers and jobs by state, each
// active job's step, total steps, loss and newest committed checkpoint step)
// and the per-job counters of skipped fp16 steps and of checkpoints not
// committed (shardtrain_checkpoint_failures_total{job_id, reason}), computed
// from `core` at every scrape.
void RegisterCoordinatorMetrics(Coordinator* core, MetricsRegistry* registry);

}  // namespace shardtrain::coordinator

#endif  // SHARDTRAIN_COORDINATOR_SERVICE_H_
