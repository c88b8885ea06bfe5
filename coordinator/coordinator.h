// The coordinator's core: membership (registration, leases, death), the job
// queue with gang scheduling, job state, step history, events, and the
// rendezvous KV. No gRPC here: the service in service.h translates.
//
// Durability: every call that changes a job or a worker writes it to the
// StateStore before returning OK, so an acknowledged change survives a crash.
// Worker assignments are derived from the jobs (job.ranks), so they need no
// record of their own.
//
// Workers are driven by reconciliation, not by queued commands: each
// Heartbeat compares what the worker says it runs with what it should run,
// and answers with the commands that close the gap (run, abort). A lost
// response or a coordinator restart therefore loses nothing.
//
// Thread-safe: one mutex guards all state; store writes happen under it.
#ifndef SHARDTRAIN_COORDINATOR_COORDINATOR_H_
#define SHARDTRAIN_COORDINATOR_COORDINATOR_H_

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/job_spec.h"
#include "common/parallel_dims.h"
#include "coordinator/admission.h"
#include "coordinator/clock.h"
#include "coordinator/fencing.h"
#include "coordinator/rendezvous_kv.h"
#include "coordinator/scheduler.h"
#include "coordinator/state_store.h"
#include "shardtrain/v1/coordinator.pb.h"

namespace shardtrain::coordinator {

// Validates a spec (YAML text + "key=value" overrides) and returns it with
// every field resolved (the default: ValidateSpec in spec_validator.h).
// INVALID_ARGUMENT naming the field on any mistake. The coordinator stores
// and ships JobSpecToYaml of what it returns, and keeps the value with the
// job: it validates a submitted spec once, each stored job's spec once when
// it loads, and a recovering job's spec once more per elastic shrink (with
// the override "parallel.dp=N"); nothing else parses a spec. Must be
// thread-safe and must not call the coordinator (it may run under its lock).
using SpecValidator = std::function<absl::StatusOr<JobSpec>(
    const std::string& yaml, const std::vector<std::string>& overrides)>;

struct CoordinatorOptions {
  int64_t lease_ms = 10'000;  // a worker silent this long is DEAD
  AdmissionLimits limits;     // bounds a job must meet at submit (admission.h)
  // Scheduling passes a waiting job may be overtaken (backfilled past) by
  // later jobs before it reserves its device kind (scheduler.h).
  int reserve_after = 3;
  // Derives lease tokens and worker secrets (fencing.h). main() loads it from
  // the state directory so a restart keeps running ranks' tokens valid.
  FencingKey fencing_key = FencingKey::Random();
};

class Coordinator {
 public:
  // Loads the stored state. Workers found there get a fresh lease (a grace
  // period to re-attach); jobs keep their states, except that a job whose
  // stored spec the validator or options.limits now refuse is FAILED with
  // the message (if not already terminal). Errors: the store's.
  static absl::StatusOr<std::unique_ptr<Coordinator>> Create(CoordinatorOptions options,
                                                             std::unique_ptr<StateStore> store,
                                                             SpecValidator validator,
                                                             const Clock* clock);
  ~Coordinator();

  // ---- membership (membership.cc)
  // The answer carries the secret bound to the id. PERMISSION_DENIED when
  // previous_worker_id names a live worker and worker_secret is not its.
  absl::StatusOr<v1::RegisterWorkerResponse> RegisterWorker(const v1::RegisterWorkerRequest& req);
  // NOT_FOUND for an unknown or DEAD worker (it must register again);
  // PERMISSION_DENIED without the worker's secret (nothing renewed). A run
  // command carries the assignment's lease token.
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& req);
  v1::ListWorkersResponse ListWorkers() const;
  // Marks workers whose lease ran out DEAD and fails their jobs; then
  // schedules. Call periodically (the service does, every ~lease/10).
  void Tick();

  // ---- jobs
  // Checks the request against options.limits (INVALID_ARGUMENT naming the
  // field and the limit) and the spec; FAILED_PRECONDITION when the cluster
  // has workers and none that ever registered can run the job's device and
  // precision (with no worker registered yet, the job waits PENDING). A
  // request repeating an idempotency_key returns the job that key created.
  // `owner`: the name of the caller's token, recorded as job.owner.
  absl::StatusOr<v1::Job> SubmitJob(const v1::SubmitJobRequest& req, const std::string& owner = "");
  absl::StatusOr<v1::Job> GetJob(const std::string& job_id) const;
  // Each rank of the job's current generation as last seen (diagnostics.cc):
  // its worker, that worker's state and heartbeat age, and the collectives
  // its last heartbeat for this generation carried. NOT_FOUND for an
  // unknown job.
  absl::StatusOr<v1::JobDiagnostics> GetJobDiagnostics(const std::string& job_id) const;
  // One page of job summaries (listing.cc). INVALID_ARGUMENT for a
  // page_token this coordinator did not hand out.
  absl::StatusOr<v1::ListJobsResponse> ListJobs(const v1::ListJobsRequest& req) const;
  // FAILED_PRECONDITION when the job already ended.
  absl::StatusOr<v1::Job> CancelJob(const std::string& job_id, const std::string& reason);
  // Events of the job with seq > after_seq; waits up to wait_ms for one when
  // there is none yet. *ended is set when the job is terminal and the
  // returned events include its last one.
  absl::StatusOr<std::vector<v1::JobEvent>> WaitEvents(const std::string& job_id, int64_t after_seq,
                                                       int64_t wait_ms, bool* ended);
  absl::StatusOr<v1::GetHistoryResponse> GetHistory(const std::string& job_id) const;
  // FAILED_PRECONDITION while the job has no plan (PENDING).
  absl::StatusOr<v1::Plan> GetPlan(const std::string& job_id) const;

  // ---- reports from ranks. ABORTED for a stale generation or a rank that
  // is not the caller's; PERMISSION_DENIED without the generation's lease
  // token; FAILED_PRECONDITION when the job is not active. A refused report
  // changes nothing.
  // A step's reports are held in memory until every rank's is in, then
  // aggregated into the history (durably). The answer carries instance(),
  // the oldest step still incomplete and the newest committed checkpoint:
  // what a rank keeps to re-send after a restart. A report of a step this
  // generation already recorded (a re-send) changes nothing.
  absl::StatusOr<v1::ReportStepResponse> ReportStep(const v1::ReportStepRequest& req);
  absl::Status ReportDone(const v1::ReportDoneRequest& req);
  // Checkpoints (checkpoints.cc). The coordinator keeps the record of
  // commits; rank 0 writes manifests and deletes pruned steps on the volume
  // the ranks share. Besides the codes above, ABORTED when the job is
  // RECOVERING: a failed generation commits nothing.
  //
  // Records a rank's shard of checkpoint `step` (in memory only: a restart
  // loses it until the rank re-sends it, seeing the new instance()). A shard
  // of a step this generation committed already is a re-send: nothing is
  // held. Returns whether every rank of the generation has now reported
  // the step.
  absl::StatusOr<bool> ReportCheckpoint(const v1::ReportCheckpointRequest& req);
  // Waits up to wait_ms for every rank's report of the step, its shard or
  // its failure, then returns them in rank order. DEADLINE_EXCEEDED naming
  // how many reported; ALREADY_EXISTS at once for a step committed already
  // whose reports are gone (a commit re-sent after a restart).
  absl::StatusOr<v1::WaitCheckpointShardsResponse> WaitCheckpointShards(
      const v1::WaitCheckpointShardsRequest& req);
  // Rank 0's commit of a step whose manifest it wrote: recorded durably
  // (with its event) before OK, which is the commit point; the answer says
  // which commits fell beyond the spec's `keep` (RecordCommit). INVALID_ARGUMENT
  // for another rank or a missing dir; FAILED_PRECONDITION when not every
  // rank's shard of the step is held, or some rank reported a failure of it.
  // A commit resets the job's progress.checkpoint_failures_in_a_row. A step this generation already
  // committed answers OK again (a retry whose first answer was lost).
  absl::StatusOr<v1::CommitCheckpointResponse> CommitCheckpoint(
      const v1::CommitCheckpointRequest& req);
  // A rank could not write its shard of a step, or rank 0 could not commit
  // it (ReportCheckpointFailure in coordinator.proto): the first failure of
  // a step records a warning event and counts it, and fails the job
  // (without a restart, answering abort) under checkpoint.on_failure: fail
  // or at checkpoint.max_consecutive_failures in a row. Every failure counts
  // towards WaitCheckpointShards. The report's reason is kept when it is a
  // known label (CheckpointFailure.reason), else "other". Besides the
  // ReportCheckpoint codes, INVALID_ARGUMENT for a step below 1.
  absl::StatusOr<v1::ReportCheckpointFailureResponse> ReportCheckpointFailure(
      const v1::ReportCheckpointFailureRequest& req);
  absl::StatusOr<v1::ListCheckpointsResponse> ListCheckpoints(const std::string& job_id) const;
  absl::Status ReportFailure(const v1::ReportFailureRequest& req);
  absl::Status ReportEvent(const v1::ReportEventRequest& req);

  // ---- rendezvous
  RendezvousKv& kv() { return kv_; }
  // Whether (job_id, generation) may use the KV now (listing.cc): NOT_FOUND
  // for an unknown job, FAILED_PRECONDITION for one not SCHEDULED or
  // RUNNING, ABORTED for another generation than the current one.
  absl::Status CheckKvAccess(const std::string& job_id, int64_t generation) const;
  // CheckKvAccess, then PERMISSION_DENIED unless `lease_token` is the one of
  // `generation` of `job_id` (KV writes).
  absl::Status CheckLease(const std::string& job_id, int64_t generation,
                          const std::string& lease_token) const;

  // Ends every blocking call (WaitEvents, WaitCheckpointShards, KvGet) with
  // UNAVAILABLE.
  void Shutdown();
  // An id chosen when this coordinator started (16 hex digits), different
  // for every process: the ranks' reports answer with it, and a rank that
  // sees it change re-sends what the previous process held only in memory
  // (worker/report_outbox.h).
  const std::string& instance() const { return instance_; }

  // Counts for /metrics.
  std::map<std::string, int> WorkerCountsByState() const;
  std::map<std::string, int> JobCountsByState() const;
  // Per active (not terminal) job: the steps whose optimizer update every
  // rank reported skipped (fp16 overflow) since this coordinator started,
  // a step re-run after a recovery counted each time. Only grows.
  std::map<std::string, int64_t> SkippedStepsOfActiveJobs() const;
  // Per job: checkpoints not committed since this coordinator started, by
  // CheckpointFailure.reason, for active jobs and for jobs that ended less
  // than kEndedJobMetricsMs ago (so a scrape sees the failures that ended a
  // job). Counts only grow.
  std::map<std::string, std::map<std::string, int64_t>> CheckpointFailuresByJob() const;
  static constexpr int64_t kEndedJobMetricsMs = 3'600'000;

 private:
  struct WorkerEntry {
    v1::WorkerInfo info;      // job_id/rank derived from jobs
    int64_t lease_until = 0;  // ms
    // Set when a generation it ran failed (it may be the rank that died);
    // cleared by its next heartbeat or registration. Not schedulable while
    // set, so a dead worker whose lease has not run out yet is never ganged.
    bool awaiting_heartbeat = false;
    // The newest flight-recorder records its last heartbeat carried for
    // (recent_job, recent_generation); memory only, at most
    // kMaxHeartbeatCollectives (diagnostics.cc).
    std::string recent_job;
    int64_t recent_generation = 0;
    std::vector<v1::CollectiveRecord> recent_collectives;
    // What the scheduler reads of it (id, device kind, precisions), kept
    // beside `info` so a pass copies nothing (SetInfo).
    FreeWorker schedulable;
    void SetInfo(v1::WorkerInfo i);
  };
  // Keeps the bounded tail of a heartbeat's flight-recorder records in `w`.
  static void RecordCollectives(const v1::HeartbeatRequest& req, WorkerEntry& w);
  struct StepAgg {  // reports of one step from the ranks so far
    std::map<int, v1::StepReport> by_rank;
  };
  // A spec the validator accepted, and its mesh.
  struct ValidSpec {
    JobSpec spec;
    ParallelDims dims;
  };
  struct JobEntry {
    v1::Job job;
    // job.spec_yaml() validated once: at SubmitJob, at Load, and again by an
    // elastic shrink (which replaces both). Absent only for a terminal job
    // whose stored spec no longer validates.
    std::optional<ValidSpec> valid;
    std::vector<v1::JobEvent> events;
    std::map<int64_t, v1::StepReport> history;  // step -> aggregated report
    std::map<int64_t, StepAgg> partial;         // steps not yet reported by every rank
    std::set<int> started;                      // ranks that acknowledged the generation
    // This generation's checkpoint shard reports not yet committed:
    // step -> rank -> shard. Cleared when the generation ends.
    std::map<int64_t, std::map<int, v1::CheckpointShard>> shards;
    // This generation's checkpoint failures, step -> rank -> failure; a step
    // here is never committed. Cleared with `shards`.
    std::map<int64_t, std::map<int, v1::CheckpointFailure>> shard_failures;
    // Checkpoint failures by reason since this process started (not stored).
    std::map<std::string, int64_t> checkpoint_failures;
    bool has_plan = false;
    v1::Plan plan;
    int passed_over = 0;  // scheduling passes later jobs overtook it (not stored)
    // Steps that every rank reported skipped (fp16 overflow) since this
    // process started, re-runs after a recovery included (not stored).
    int64_t skipped_steps = 0;
  };

  Coordinator(CoordinatorOptions options, std::unique_ptr<StateStore> store,
              SpecValidator validator, const Clock* clock);
  absl::Status Load();
  // validator_ on (yaml, overrides), with the spec's mesh. The validator's
  // errors; INVALID_ARGUMENT when the spec it returns has no valid mesh.
  absl::StatusOr<ValidSpec> Validate(const std::string& yaml,
                                     const std::vector<std::string>& overrides) const;

  // All below require mu_ held.
  JobEntry* FindJob(const std::string& job_id);
  const JobEntry* FindJob(const std::string& job_id) const;
  // Moves the job to `to` (checked by the state machine), records an event,
  // persists both, frees the workers when `to` is terminal.
  absl::Status Transition(JobEntry& e, v1::JobState to, const std::string& message);
  absl::Status AppendEvent(JobEntry& e, v1::EventKind kind, const std::string& message,
                           const v1::StepReport* step);
  void ReleaseWorkers(JobEntry& e);
  // One scheduling pass (scheduling.cc): starts the jobs that fit, records
  // why the others wait (job.pending_reason), fails jobs that cannot be
  // planned. Skipped, unless `force`, when nothing a pass reads changed
  // since the last one that placed nothing: it would decide the same.
  void ScheduleLocked(bool force = false);
  // After a submit: when the queue is as the last pass left it, the new job
  // alone is considered (every earlier one would wait again for the same
  // reason), so a submit costs O(workers), not O(jobs); else a whole pass.
  void ScheduleSubmittedLocked(JobEntry& e);
  // The pending job of e as the scheduler sees it (scheduler.h).
  PendingJob AsPending(const JobEntry& e, int64_t now) const;
  // The alive and the schedulable workers, in registration order.
  void CollectWorkers(int64_t now, std::vector<const FreeWorker*>* free,
                      std::vector<const FreeWorker*>* alive) const;
  // Starts a pass's placements and records why the others wait.
  void ApplyPass(const SchedulePass& pass);
  // Something a scheduling pass reads changed: a job's state, a worker's
  // state, job or schedulability. The next pass runs.
  void SchedulingInputsChanged() { ++schedule_inputs_; }
  // OK when some registered worker can run the spec or none registered yet;
  // FAILED_PRECONDITION naming the field otherwise (scheduling.cc).
  absl::Status CheckRunnable(const JobSpec& spec) const;
  absl::Status CheckRank(const JobEntry& e, int64_t generation, int rank,
                         const std::string& worker_id, const std::string& lease_token) const;
  // PERMISSION_DENIED unless `lease_token` is that of e's current generation.
  absl::Status CheckLeaseToken(const JobEntry& e, const std::string& lease_token) const;
  // CheckRank, and ABORTED while the job is RECOVERING: checkpoints of a
  // generation that failed are never committed.
  absl::Status CheckCheckpointRank(const JobEntry& e, int64_t generation, int rank,
                                   const std::string& worker_id,
                                   const std::string& lease_token) const;
  // Every rank reported `step`: aggregates the reports by the plan's mesh
  // (rules in reports.cc) into the job's history, progress and events. The
  // store's error when the history could not be written: the reports stay
  // held (the step incomplete), so the ranks keep theirs and send them again.
  absl::Status FinishStep(JobEntry& e, int64_t step);
  // A rank of `e` failed: RECOVERING (re-gang from the last committed
  // checkpoint) while restarts remain, FAILED otherwise, and FAILED at once
  // when the failure is `permanent` (a retry cannot fix it). Either way the
  // generation's workers wait for their next heartbeat (HoldForHeartbeat).
  void FailOrRecover(JobEntry& e, const std::string& reason, bool permanent = false);
  // Recovery rules (recovery.cc). Marks every worker of e's current
  // generation awaiting_heartbeat.
  void HoldForHeartbeat(const JobEntry& e);
  // Alive, free, heard from within half a lease and since any failure of a
  // generation it ran: the scheduler may gang it.
  bool Schedulable(const WorkerEntry& w, int64_t now) const;
  // Whether a worker of e's last generation may still come back (it awaits
  // its heartbeat and its lease has not run out): an elastic job does not
  // shrink meanwhile.
  bool AwaitingFormerRanks(const JobEntry& e, int64_t now) const;

  const CoordinatorOptions options_;
  const std::unique_ptr<StateStore> store_;
  const SpecValidator validator_;
  const Clock* const clock_;
  const std::string instance_;
  RendezvousKv kv_;

  mutable std::mutex mu_;
  std::condition_variable events_cv_;
  // Notified when a submit's commit ends (its job is known, or it failed).
  std::condition_variable submits_cv_;
  // Notified on every checkpoint report and job state change (a generation
  // ending), for WaitCheckpointShards.
  std::condition_variable shards_cv_;
  struct ByRegistration {  // "w-2" before "w-10": a pass walks workers_ in order
    bool operator()(const std::string& a, const std::string& b) const { return WorkerIdLess(a, b); }
  };
  std::map<std::string, WorkerEntry, ByRegistration> workers_;  // GUARDED_BY(mu_)
  std::map<std::string, JobEntry> jobs_;                        // GUARDED_BY(mu_)
  std::vector<std::string> job_order_;                          // GUARDED_BY(mu_), submission order
  int64_t next_worker_ = 1;                                     // GUARDED_BY(mu_)
  int64_t next_job_ = 1;                                        // GUARDED_BY(mu_)
  bool shutdown_ = false;                                       // GUARDED_BY(mu_)
  // Scheduling: the inputs' version, that of the last pass that placed
  // nothing (the queue is settled while they are equal), when the last
  // whole pass ran, and the reservations it left (device -> job).
  uint64_t schedule_inputs_ = 1;                 // GUARDED_BY(mu_)
  uint64_t settled_inputs_ = 0;                  // GUARDED_BY(mu_)
  int64_t last_pass_ms_ = 0;                     // GUARDED_BY(mu_)
  std::map<std::string, std::string> reserved_;  // GUARDED_BY(mu_)
  // (device kind, precision) pairs some registered worker offers: a submit
  // checks its job against them without walking every worker.
  std::set<std::pair<std::string, std::string>> capabilities_;  // GUARDED_BY(mu_)
  void AddCapabilities(const FreeWorker& w);
  // SubmitJobRequest.idempotency_key -> job id (from before the job's
  // commit: a retry meanwhile waits on submits_cv_); rebuilt on load from
  // the stored jobs' keys.
  std::map<std::string, std::string> submit_keys_;  // GUARDED_BY(mu_)
};

// "JOB_STATE_RUNNING" -> "RUNNING".
std::string JobStateLabel(v1::JobState s);
std::string WorkerStateLabel(v1::WorkerState s);
bool IsTerminal(v1::JobState s);
// PENDING or RECOVERING: the job waits for the scheduler to gang workers.
bool WaitsForWorkers(v1::JobState s);

}  // namespace shardtrain::coordinator

#endif  // SHARDTRAIN_COORDINATOR_COORDINATOR_H_
