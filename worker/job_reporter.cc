#include "worker/job_reporter.h"

#include <chrono>
#include <cstdint>
#include <iostream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/process.h"
#include "common/storage_fault.h"
#include "worker/recent_collectives.h"

namespace shardtrain::worker {

// `s` as "CODE: message", without the payloads a StorageError carries (its
// fault and cause, which the message already says).
std::string Text(const absl::Status& s) {
  return s.ToString(absl::StatusToStringMode::kWithNoExtraData);
}

Reporter::Reporter(const RunContext& ctx)
    : ctx_(ctx),
      a_(*ctx.assignment),
      outbox_(std::make_unique<ReportOutbox>([this](const std::string& m) { Log(m); }, ctx.stop)) {}

void Reporter::Answered(const absl::Status& s) {
  // A stale generation or a job that ended: stop. Transient errors: go on.
  if (absl::IsAborted(s) || absl::IsFailedPrecondition(s) || absl::IsNotFound(s)) ended_ = true;
}

ReportOutbox::Item Reporter::StepItem(const v1::ReportStepRequest& req) {
  const int64_t step = req.report().step();
  return {ReportOutbox::Kind::kStep, step, "step " + std::to_string(step), [this, req, step] {
            auto resp = ctx_.client->ReportStep(req);
            if (!resp.ok()) {
              if (!absl::IsUnavailable(resp.status())) {
                Log("step report failed: " + std::string(resp.status().message()));
              }
              Answered(resp.status());
              return resp.status();
            }
            if (resp->abort()) ended_ = true;
            // Held in the coordinator's memory until every rank reported the
            // step, or the step's checkpoint is committed: kept until then.
            outbox_->SawInstance(resp->coordinator_instance());
            const int64_t incomplete = resp->incomplete_from_step();
            outbox_->ForgetKept(ReportOutbox::Kind::kStep,
                                incomplete == 0 ? INT64_MAX : incomplete);
            outbox_->ForgetKept(ReportOutbox::Kind::kShard, resp->committed_step() + 1);
            if (incomplete != 0 && step >= incomplete) outbox_->Keep(StepItem(req));
            return absl::OkStatus();
          }};
}

bool Reporter::Step(const StepResult& r, double mfu) {
  v1::ReportStepRequest req;
  req.set_worker_id(ctx_.worker_id);
  req.set_lease_token(a_.lease_token());
  v1::StepReport* s = req.mutable_report();
  s->set_job_id(a_.job_id());
  s->set_generation(a_.generation());
  s->set_rank(a_.rank());
  s->set_step(r.step);
  s->set_loss(r.loss);
  if (r.val_loss) s->set_val_loss(*r.val_loss);
  s->set_grad_norm(r.grad_norm);
  s->set_lr(r.lr);
  s->set_tokens_per_s(r.step_ms > 0 ? r.tokens * 1000.0 / r.step_ms : 0);
  s->set_step_ms(r.step_ms);
  s->set_comm_ms(r.comm_ms);
  s->set_comm_bytes(r.comm_bytes);
  s->set_loss_scale(r.loss_scale);
  s->set_mfu(mfu);
  s->set_skipped(r.skipped);
  s->set_moe_aux_loss(r.moe_aux_loss);
  s->set_moe_z_loss(r.moe_z_loss);
  s->set_moe_max_load(r.moe_max_load);
  s->set_moe_dropped(r.moe_dropped);
  s->set_peak_rss_bytes(PeakRssBytes());
  s->set_time_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count());
  outbox_->Send(StepItem(req)).IgnoreError();  // the item itself handles the answer
  return !ended_;
}

ReportOutbox::Item Reporter::ShardItem(const v1::ReportCheckpointRequest& req, CommitFn commit) {
  const int64_t step = req.shard().step();
  return {ReportOutbox::Kind::kShard, step, "checkpoint step " + std::to_string(step),
          [this, req, step, commit] {
            auto resp = ctx_.client->ReportCheckpoint(req);
            if (!resp.ok()) {
              Answered(resp.status());
              return resp.status();
            }
            outbox_->SawInstance(resp->coordinator_instance());
            // Held in the coordinator's memory until committed.
            outbox_->Keep(ShardItem(req, commit));
            if (!commit) return absl::OkStatus();
            if (outbox_->sending_now() && outbox_->backlogged()) {
              // The coordinator restarted since the other ranks' reports of
              // this step: they re-send them after their next step, which
              // waits for this rank. The commit waits its turn instead.
              outbox_->Queue({ReportOutbox::Kind::kOther, step,
                              "commit of checkpoint step " + std::to_string(step), commit});
              return absl::OkStatus();
            }
            return commit();
          }};
}

absl::Status Reporter::Checkpoint(const checkpoint::ShardFileInfo& info, const std::string& path,
                                  int64_t step, CommitFn commit) {
  v1::ReportCheckpointRequest req;
  req.set_worker_id(ctx_.worker_id);
  req.set_lease_token(a_.lease_token());
  v1::CheckpointShard* s = req.mutable_shard();
  s->set_job_id(a_.job_id());
  s->set_generation(a_.generation());
  s->set_rank(a_.rank());
  s->set_step(step);
  s->set_path(path);
  s->set_bytes(int64_t(info.bytes));
  s->set_crc64(info.checksum);
  for (const checkpoint::FlatRange& r : info.ranges) {
    v1::FlatRange* fr = s->add_ranges();
    fr->set_begin(int64_t(r.begin));
    fr->set_end(int64_t(r.end));
  }
  bool queued = false;
  absl::Status sent = outbox_->Send(ShardItem(req, std::move(commit)), &queued);
  if (queued)
    Log("checkpoint step " + std::to_string(step) + " held until the coordinator answers");
  return sent;
}

void Reporter::Commit(const absl::StatusOr<CommitResult>& r, int64_t step) const {
  const std::string what = "checkpoint step " + std::to_string(step);
  if (!r.ok()) return Log(what + " not committed: " + Text(r.status()));
  Log(what + " committed as " + r->commit.checkpoint().dir() + "; " +
      std::to_string(r->removed.size()) + " older step directories removed");
  if (!r->cleanup.ok()) {
    Event(what + " committed, but removing older steps stopped: " + Text(r->cleanup));
  }
}

v1::ReportCheckpointFailureRequest Reporter::FailureRequest(int64_t step, const std::string& path,
                                                            const absl::Status& error) const {
  v1::ReportCheckpointFailureRequest req;
  req.set_job_id(a_.job_id());
  req.set_generation(a_.generation());
  req.set_worker_id(ctx_.worker_id);
  req.set_lease_token(a_.lease_token());
  v1::CheckpointFailure* f = req.mutable_failure();
  f->set_rank(a_.rank());
  f->set_step(step);
  f->set_path(path);
  const StorageFault fault = StorageFaultOf(error);
  if (fault != StorageFault::kNone) {
    f->set_cause(StorageCause(error));
    f->set_reason(std::string(StorageFaultName(fault)));
  } else {
    f->set_cause(std::string(error.message()));
    f->set_reason(absl::IsDeadlineExceeded(error) ? "incomplete"
                  : absl::IsUnavailable(error)    ? "io_error"
                                                  : "other");
  }
  return req;
}

absl::Status Reporter::SendFailure(const v1::ReportCheckpointFailureRequest& req) {
  auto resp = ctx_.client->ReportCheckpointFailure(req);
  if (!resp.ok()) {
    if (!absl::IsUnavailable(resp.status()) && !absl::IsDeadlineExceeded(resp.status())) {
      Log("checkpoint failure not reported: " + resp.status().ToString());
    }
    Answered(resp.status());
    return resp.status();
  }
  if (resp->abort()) ended_ = true;
  return absl::OkStatus();
}

absl::Status Reporter::CommitFailure(int64_t step, const std::string& path,
                                     const absl::Status& error) {
  return SendFailure(FailureRequest(step, path, error));
}

bool Reporter::CheckpointFailure(int64_t step, const std::string& path, const absl::Status& error,
                                 CommitFn commit) {
  const v1::ReportCheckpointFailureRequest req = FailureRequest(step, path, error);
  outbox_
      ->Send({ReportOutbox::Kind::kOther, step,
              "checkpoint step " + std::to_string(step) + "'s failure",
              [this, req, commit] {
                absl::Status s = SendFailure(req);
                if (!s.ok()) return s;
                return commit ? commit() : absl::OkStatus();
              }})
      .IgnoreError();
  return !ended_;
}

void Reporter::Done(int64_t steps, const std::string& output) {
  v1::ReportDoneRequest req;
  req.set_job_id(a_.job_id());
  req.set_generation(a_.generation());
  req.set_rank(a_.rank());
  req.set_worker_id(ctx_.worker_id);
  req.set_lease_token(a_.lease_token());
  req.set_steps(steps);
  req.set_output(output);
  Final("ReportDone", [this, req] { return ctx_.client->ReportDone(req); });
}

void Reporter::Failure(const absl::Status& error, int64_t step, comm::Communicator* comm,
                       bool permanent) {
  Log("rank " + std::to_string(a_.rank()) + (permanent ? " failed for good: " : " failed: ") +
      Text(error));
  v1::ReportFailureRequest req;
  req.set_job_id(a_.job_id());
  req.set_generation(a_.generation());
  req.set_rank(a_.rank());
  req.set_worker_id(ctx_.worker_id);
  req.set_lease_token(a_.lease_token());
  req.set_reason(Text(error));
  req.set_step(step);
  req.set_permanent(permanent);
  if (comm) {
    for (const comm::FlightRecord& f : comm->flight_recorder().Dump()) {
      *req.add_recent_collectives() = ToCollectiveRecord(f);
    }
  }
  Final("ReportFailure", [this, req] { return ctx_.client->ReportFailure(req); });
}

void Reporter::Final(const char* what, std::function<absl::Status()> send) {
  outbox_->Send({ReportOutbox::Kind::kOther, 0, what, std::move(send)}).IgnoreError();
  if (!outbox_->Drain()) Log(std::string(what) + ": stopped before the coordinator answered");
}

void Reporter::Event(const std::string& msg, bool warning) const {
  Log(msg);
  if (a_.rank() != 0) return;
  v1::ReportEventRequest req;
  req.set_warning(warning);
  req.set_job_id(a_.job_id());
  req.set_generation(a_.generation());
  req.set_rank(a_.rank());
  req.set_worker_id(ctx_.worker_id);
  req.set_lease_token(a_.lease_token());
  req.set_message(msg);
  outbox_
      ->Send({ReportOutbox::Kind::kOther, 0, "event",
              [this, req] { return ctx_.client->ReportEvent(req); }})
      .IgnoreError();
}

void Reporter::Log(const std::string& msg) const {
  std::cerr << "shardtrain-worker[" << ctx_.worker_id << "] " << a_.job_id() << "/" << a_.rank()
            << ": " << msg << std::endl;
}

}  // namespace shardtrain::worker
