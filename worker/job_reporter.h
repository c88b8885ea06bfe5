// The job runner's messages to the coordinator for one assignment (steps,
// checkpoints, events, the end or a failure) and its log lines. They go
// through a ReportOutbox (report_outbox.h): in order, held while the
// coordinator is unreachable and delivered once it answers, and re-sent to
// a restarted coordinator where the old one held them only in memory.
#ifndef SHARDTRAIN_WORKER_JOB_REPORTER_H_
#define SHARDTRAIN_WORKER_JOB_REPORTER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/checkpoint/shard_file.h"
#include "worker/checkpoint_commit.h"
#include "worker/comm/communicator.h"
#include "worker/job_runner.h"
#include "worker/report_outbox.h"
#include "worker/trainer.h"

namespace shardtrain::worker {

// `s` as "CODE: message", without the payloads a StorageError carries (its
// fault and cause, which the message already says).
std::string Text(const absl::Status& s);

// Reports to the coordinator and tells the runner when to stop.
class Reporter {
 public:
  explicit Reporter(const RunContext& ctx);

  // False when the coordinator says the job is over (cancelled, failed),
  // now or in the answer to an earlier report delivered since.
  // mfu: the step's model FLOPs utilisation, 0 when unknown.
  bool Step(const StepResult& r, double mfu);

  // Rank 0's commit of a checkpoint step once every rank reported it
  // (CheckpointCommit below). Returns UNAVAILABLE when the coordinator could
  // not be reached (the report and the commit are tried again, in order),
  // OK otherwise: it says what went wrong itself (Commit, CommitFailure).
  using CommitFn = std::function<absl::Status()>;

  // This rank's shard of checkpoint `step`, then on rank 0 (`commit` set)
  // the commit. Sent at once, or held and sent in order while the
  // coordinator is unreachable: an outage leaves the step uncommitted only
  // until the coordinator answers again. Errors: the coordinator's refusal
  // of the shard report (not UNAVAILABLE).
  absl::Status Checkpoint(const checkpoint::ShardFileInfo& info, const std::string& path,
                          int64_t step, CommitFn commit);

  // Rank 0: the commit of `step` came to an end (committed, or given up):
  // the shard reports kept for a coordinator restart go.
  void Settled(int64_t step) { outbox_->ForgetKept(ReportOutbox::Kind::kShard, step + 1); }

  // Logs rank 0's commit of `step` (CommitCheckpoint); a cleanup cut short
  // is a job event. A step it could not commit is the caller's to report
  // (CommitFailure). Training goes on either way: an uncommitted step is
  // never resumed from.
  void Commit(const absl::StatusOr<CommitResult>& r, int64_t step) const;

  // Tells the coordinator that this rank could not write its shard of
  // `step` because of `error`, about `path` (then, on rank 0, runs `commit`,
  // which removes the step's directory): the coordinator warns the user and
  // applies checkpoint.on_failure. False when the job is over (stop now).
  bool CheckpointFailure(int64_t step, const std::string& path, const absl::Status& error,
                         CommitFn commit);
  // Rank 0, from within a commit: the step could not be committed because
  // of `error`. Sent at once (the commit runs in the report's turn);
  // UNAVAILABLE when the coordinator could not be reached.
  absl::Status CommitFailure(int64_t step, const std::string& path, const absl::Status& error);

  // Sent after every report before it; waits until delivered (or the stop).
  void Done(int64_t steps, const std::string& output);

  // `permanent`: a retry cannot help (see ReportFailureRequest.permanent).
  // Sent after every report before it; waits until delivered (or the stop).
  void Failure(const absl::Status& error, int64_t step, comm::Communicator* comm,
               bool permanent = false);

  // Logs `msg` and records it among the job's events (only rank 0 reports,
  // since every rank sees the same checkpoint files); as a warning
  // (EVENT_KIND_WARNING) when the user should act on it.
  void Event(const std::string& msg, bool warning = false) const;

  void Log(const std::string& msg) const;

  // Whether the coordinator said the job is over.
  bool ended() const { return ended_; }
  // Whether the calling thread runs a report the caller sent just now (not
  // one held through an outage, which runs on the reporter's thread).
  bool sending_now() const { return outbox_->sending_now(); }
  // Set while the reporter is being destroyed (long waits give up).
  const std::atomic<bool>& closing() const { return outbox_->closing(); }

 private:
  ReportOutbox::Item StepItem(const v1::ReportStepRequest& req);
  ReportOutbox::Item ShardItem(const v1::ReportCheckpointRequest& req, CommitFn commit);
  // The outcome of `s` for the job: a refusal that says the generation or
  // the job is over sets ended_.
  void Answered(const absl::Status& s);
  // Sends a run's last report (done, failure) after every one before it and
  // waits until it is delivered, or the stop flag is set.
  void Final(const char* what, std::function<absl::Status()> send);
  v1::ReportCheckpointFailureRequest FailureRequest(int64_t step, const std::string& path,
                                                    const absl::Status& error) const;
  // Sends a checkpoint failure now and takes in its answer (abort: ended_).
  absl::Status SendFailure(const v1::ReportCheckpointFailureRequest& req);

  const RunContext& ctx_;
  const v1::RunAssignment& a_;
  std::atomic<bool> ended_{false};
  std::unique_ptr<ReportOutbox> outbox_;  // last: its sender thread calls into the above
};

}  // namespace shardtrain::worker

#endif  // SHARDTRAIN_WORKER_JOB_REPORTER_H_
