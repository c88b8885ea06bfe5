// The job runner's messages to the coordinator for one assignment (steps,
// checkpoints, events, the end or a failure), retried while the
// coordinator is unreachable, and its log lines.
#ifndef SHARDTRAIN_WORKER_JOB_REPORTER_H_
#define SHARDTRAIN_WORKER_JOB_REPORTER_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/checkpoint/shard_file.h"
#include "worker/checkpoint_commit.h"
#include "worker/comm/communicator.h"
#include "worker/job_runner.h"
#include "worker/trainer.h"

namespace shardtrain::worker {

// `s` as "CODE: message", without the payloads a StorageError carries (its
// fault and cause, which the message already says).
std::string Text(const absl::Status& s);

// Reports to the coordinator and tells the runner when to stop.
class Reporter {
 public:
  explicit Reporter(const RunContext& ctx) : ctx_(ctx), a_(*ctx.assignment) {}

  // False when the coordinator says the job is over (cancelled, failed).
  // mfu: the step's model FLOPs utilisation, 0 when unknown.
  bool Step(const StepResult& r, double mfu);

  absl::Status Checkpoint(const checkpoint::ShardFileInfo& info, const std::string& path,
                          int64_t step);

  // Logs rank 0's commit of `step` (CommitCheckpoint); a cleanup cut short
  // is a job event. A step it could not commit is the caller's to report
  // (CheckpointFailure). Training goes on either way: an uncommitted step is
  // never resumed from.
  void Commit(const absl::StatusOr<CommitResult>& r, int64_t step) const;

  // Tells the coordinator that this rank could not write its shard of
  // `step` (or, rank 0, could not commit it) because of `error`, about
  // `path`: the coordinator warns the user and applies checkpoint.on_failure.
  // False when it answered that the job is over (stop now); true otherwise,
  // also when it could not be told (the commit then times out instead).
  bool CheckpointFailure(int64_t step, const std::string& path, const absl::Status& error);

  void Done(int64_t steps, const std::string& output);

  // `permanent`: a retry cannot help (see ReportFailureRequest.permanent).
  void Failure(const absl::Status& error, int64_t step, comm::Communicator* comm,
               bool permanent = false);

  // Logs `msg` and records it among the job's events (best effort: only
  // rank 0 reports, since every rank sees the same checkpoint files); as a
  // warning (EVENT_KIND_WARNING) when the user should act on it.
  void Event(const std::string& msg, bool warning = false) const;

  void Log(const std::string& msg) const;

 private:
  // Retries while the coordinator is unreachable (e.g. restarting): until it
  // answers, or the job is stopped. The daemon reports the job as running
  // meanwhile, so a finished rank is never handed its work again.
  template <typename Fn>
  void Retry(const char* what, Fn fn);

  const RunContext& ctx_;
  const v1::RunAssignment& a_;
};

}  // namespace shardtrain::worker

#endif  // SHARDTRAIN_WORKER_JOB_REPORTER_H_
