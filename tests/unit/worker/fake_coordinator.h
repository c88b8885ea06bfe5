// An in-memory coordinator for unit tests of the worker side (daemon, job
// runner, rendezvous store): it records every request, answers the way a test
// scripts it, and otherwise behaves like a small, healthy coordinator.
//
// Default answers:
//   RegisterWorker  the previous_worker_id when given, else "w-1", "w-2", ...;
//                   worker_secret "secret-of-<id>";
//                   lease_ms() as the lease.
//   Heartbeat       scripted answers (QueueHeartbeat) first, in order; then
//                   it reconciles like the coordinator does: an abort for a
//                   reported job that is not the assigned one (Assign), a run
//                   of the assigned one when the worker does not report it,
//                   neither once the assigned rank has reported done.
//   GetPlan         the plan set by PlanJob / SetPlan for that job, else
//                   NOT_FOUND.
//   ReportStep      abort = true from step AbortAtStep(n) on.
//   Report*         OK (ReportCheckpoint: complete when every rank reported).
//   WaitCheckpointShards  the reports of (job, generation, step), shards and
//                   failures, rank order, once every rank of the job's plan
//                   (world 1 without a plan) sent one; waits up to wait_ms,
//                   then DEADLINE_EXCEEDED.
//   ReportCheckpointFailure  abort = AbortOnCheckpointFailure's setting.
//   CommitCheckpoint like the coordinator: INVALID_ARGUMENT for a rank but 0,
//                   FAILED_PRECONDITION unless every rank reported the step;
//                   then records the commit (replacing the step and newer
//                   ones), keeps the newest set_checkpoint_keep(k) (default
//                   3) and answers the oldest kept step. A step already
//                   committed by that generation is answered again.
//   Kv*             an in-memory store per (job, generation); KvGet waits.
// Errors: SetOutage(true) makes every call answer UNAVAILABLE (recorded all
// the same); FailNext makes the next calls of one RPC answer an error.
//
// Thread-safe: every method may be called from any thread.
#ifndef SHARDTRAIN_TESTS_UNIT_WORKER_FAKE_COORDINATOR_H_
#define SHARDTRAIN_TESTS_UNIT_WORKER_FAKE_COORDINATOR_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/job_spec.h"
#include "shardtrain/v1/coordinator.pb.h"
#include "worker/coordinator_api.h"

namespace shardtrain::worker {

class FakeCoordinator final : public CoordinatorApi {
 public:
  enum class Rpc {
    kRegisterWorker,
    kHeartbeat,
    kGetPlan,
    kReportStep,
    kReportDone,
    kReportCheckpoint,
    kWaitCheckpointShards,
    kCommitCheckpoint,
    kReportCheckpointFailure,
    kReportFailure,
    kReportEvent,
    kKvSet,
    kKvGet,
    kKvAdd,
  };

  // Every request the fake received, in arrival order per RPC (failed ones too).
  struct Calls {
    using Clock = std::chrono::steady_clock;
    std::vector<v1::RegisterWorkerRequest> registers;
    std::vector<v1::HeartbeatRequest> heartbeats;
    std::vector<Clock::time_point> heartbeat_times;  // when each heartbeat arrived
    std::vector<absl::StatusOr<v1::HeartbeatResponse>> heartbeat_answers;  // what each got
    std::vector<std::string> plan_requests;                                // job ids
    std::vector<v1::ReportStepRequest> steps;
    std::vector<v1::ReportDoneRequest> dones;
    std::vector<v1::ReportCheckpointRequest> checkpoints;
    std::vector<v1::WaitCheckpointShardsRequest> shard_waits;
    std::vector<v1::CommitCheckpointRequest> commits;
    std::vector<v1::ReportCheckpointFailureRequest> checkpoint_failures;
    std::vector<v1::ReportFailureRequest> failures;
    std::vector<v1::ReportEventRequest> events;
    int kv_calls = 0;
  };

  // ---- scripting

  // The lease RegisterWorker and Heartbeat answer with (default 3000 ms).
  void set_lease_ms(int64_t ms);
  // The next heartbeats answer these, in order, before reconciling again.
  void QueueHeartbeat(absl::StatusOr<v1::HeartbeatResponse> answer);
  // The job the worker should run: heartbeats that do not report it get a run
  // command (and an abort for the job they report instead) until ReportDone
  // for its (job, generation, rank). std::nullopt: none, so a reported job
  // gets an abort with `reason`.
  void Assign(std::optional<v1::RunAssignment> assignment, std::string reason = "stale assignment");
  // The next `times` calls of `rpc` answer `error` (recorded all the same).
  void FailNext(Rpc rpc, absl::Status error, int times = 1);
  // While on, every call answers UNAVAILABLE.
  void SetOutage(bool on);
  // Stores MakePlan(spec, world) for `job_id` with job_id and generation
  // filled in, as the coordinator does; returns it (errors: MakePlan's).
  absl::StatusOr<v1::Plan> PlanJob(const std::string& job_id, int64_t generation,
                                   const JobSpec& spec, int world);
  // Stores `plan` (for plan.job_id()) as it is.
  void SetPlan(const v1::Plan& plan);
  // ReportStep answers abort = true for steps >= `step` (0: never).
  void AbortAtStep(int64_t step);
  // ReportCheckpointFailure answers abort = `abort` (default false).
  void AbortOnCheckpointFailure(bool abort);
  // Commits CommitCheckpoint keeps per job (>= 1).
  void set_checkpoint_keep(int keep);
  // Called (outside the fake's lock) after each ReportStep is recorded.
  void set_on_step(std::function<void(const v1::ReportStepRequest&)> fn);

  // ---- what happened

  Calls calls() const;
  // The job's recorded commits, ascending step.
  std::vector<v1::CheckpointInfo> Committed(const std::string& job_id) const;
  // Waits until `pred(calls)` holds (re-checked after every call the fake
  // receives); false when `timeout` passes first.
  bool WaitFor(const std::function<bool(const Calls&)>& pred,
               absl::Duration timeout = absl::Seconds(3)) const;

  // ---- CoordinatorApi

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
  // The scripted error for a call of `rpc`, if any (consumes one FailNext).
  // Requires mu_ held.
  absl::Status InjectedError(Rpc rpc);
  // The reported shards of (job, generation, step) by rank, and whether
  // every rank of the job reported one or a failure (*failures, when given,
  // gets those). Requires mu_ held.
  std::map<int, v1::CheckpointShard> ReportedShards(
      const std::string& job_id, int64_t generation, int64_t step, bool* complete,
      std::map<int, v1::CheckpointFailure>* failures = nullptr) const;

  mutable std::mutex mu_;
  mutable std::condition_variable changed_;                             // notified after every call
  Calls calls_;                                                         // GUARDED_BY(mu_)
  int64_t lease_ms_ = 3000;                                             // GUARDED_BY(mu_)
  int next_worker_ = 1;                                                 // GUARDED_BY(mu_)
  std::deque<absl::StatusOr<v1::HeartbeatResponse>> heartbeat_script_;  // GUARDED_BY(mu_)
  std::optional<v1::RunAssignment> assigned_;                           // GUARDED_BY(mu_)
  std::string unassign_reason_ = "stale assignment";                    // GUARDED_BY(mu_)
  std::map<Rpc, std::deque<absl::Status>> errors_;                      // GUARDED_BY(mu_)
  bool outage_ = false;                                                 // GUARDED_BY(mu_)
  std::map<std::string, v1::Plan> plans_;                               // GUARDED_BY(mu_)
  int64_t abort_at_step_ = 0;                                           // GUARDED_BY(mu_)
  int checkpoint_keep_ = 3;                                             // GUARDED_BY(mu_)
  bool abort_on_checkpoint_failure_ = false;                            // GUARDED_BY(mu_)
  std::map<std::string, std::vector<v1::CheckpointInfo>> committed_;    // GUARDED_BY(mu_)
  std::function<void(const v1::ReportStepRequest&)> on_step_;           // GUARDED_BY(mu_)
  std::map<std::tuple<std::string, int64_t, std::string>, std::string> kv_;  // GUARDED_BY(mu_)
};

}  // namespace shardtrain::worker

#endif  // SHARDTRAIN_TESTS_UNIT_WORKER_FAKE_COORDINATOR_H_
