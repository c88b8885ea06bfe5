#include "worker/job_reporter.h"

#include <chrono>
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
  auto resp = ctx_.client->ReportStep(req);
  if (!resp.ok()) {
    Log("step report failed: " + std::string(resp.status().message()));
    // A stale generation or a job that ended: stop. Transient errors: go on.
    return !(absl::IsAborted(resp.status()) || absl::IsFailedPrecondition(resp.status()) ||
             absl::IsNotFound(resp.status()));
  }
  return !resp->abort();
}

absl::Status Reporter::Checkpoint(const checkpoint::ShardFileInfo& info, const std::string& path,
                                  int64_t step) {
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
  absl::StatusOr<v1::ReportCheckpointResponse> resp;
  for (int attempt = 0; attempt < 20; ++attempt) {
    resp = ctx_.client->ReportCheckpoint(req);
    if (resp.ok() || !absl::IsUnavailable(resp.status())) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  return resp.status();
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

bool Reporter::CheckpointFailure(int64_t step, const std::string& path, const absl::Status& error) {
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
  absl::StatusOr<v1::ReportCheckpointFailureResponse> resp;
  for (int attempt = 0; attempt < 20; ++attempt) {
    resp = ctx_.client->ReportCheckpointFailure(req);
    if (resp.ok() || !absl::IsUnavailable(resp.status())) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  if (!resp.ok()) {
    Log("checkpoint failure not reported: " + resp.status().ToString());
    return !(absl::IsFailedPrecondition(resp.status()) || absl::IsNotFound(resp.status()));
  }
  return !resp->abort();
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
  Retry("ReportDone", [&] { return ctx_.client->ReportDone(req); });
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
  Retry("ReportFailure", [&] { return ctx_.client->ReportFailure(req); });
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
  if (absl::Status s = ctx_.client->ReportEvent(req); !s.ok())
    Log("event not reported: " + s.ToString());
}

void Reporter::Log(const std::string& msg) const {
  std::cerr << "shardtrain-worker[" << ctx_.worker_id << "] " << a_.job_id() << "/" << a_.rank()
            << ": " << msg << std::endl;
}

template <typename Fn>
void Reporter::Retry(const char* what, Fn fn) {
  bool logged = false;
  while (!*ctx_.stop) {
    absl::Status s = fn();
    if (s.ok() || !absl::IsUnavailable(s)) {
      if (!s.ok()) Log(std::string(what) + ": " + std::string(s.message()));
      return;
    }
    if (!logged) Log(std::string(what) + ": coordinator unreachable; retrying");
    logged = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
}

}  // namespace shardtrain::worker
