// Diagnostics: what each rank of a job was last seen doing, from the
// flight-recorder records its worker's heartbeats carry. Memory only.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "coordinator/coordinator.h"

namespace shardtrain::coordinator {
namespace {

// Records kept per worker: enough to see the collective a rank is stuck in
// and the few before it, bounded whatever a heartbeat carries.
constexpr int kMaxHeartbeatCollectives = 16;
// Longest op / group / dtype / state string kept from a heartbeat.
constexpr size_t kMaxRecordField = 64;

void Clip(std::string* s) {
  if (s->size() > kMaxRecordField) s->resize(kMaxRecordField);
}

}  // namespace

void Coordinator::RecordCollectives(const v1::HeartbeatRequest& req, WorkerEntry& w) {
  if (req.job_id().empty()) return;  // idle: keep the last job's records for `why`
  w.recent_job = req.job_id();
  w.recent_generation = req.generation();
  w.recent_collectives.clear();
  const int n = req.recent_collectives_size();
  for (int i = std::max(0, n - kMaxHeartbeatCollectives); i < n; ++i) {
    v1::CollectiveRecord r = req.recent_collectives(i);
    Clip(r.mutable_op());
    Clip(r.mutable_group());
    Clip(r.mutable_dtype());
    Clip(r.mutable_state());
    w.recent_collectives.push_back(std::move(r));
  }
}

absl::StatusOr<v1::JobDiagnostics> Coordinator::GetJobDiagnostics(const std::string& job_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  const JobEntry* e = FindJob(job_id);
  if (!e) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
  const int64_t now = clock_->NowMs();
  v1::JobDiagnostics d;
  d.set_job_id(job_id);
  d.set_state(e->job.state());
  d.set_generation(e->job.generation());
  d.set_failure_reason(e->job.failure_reason());
  d.set_pending_reason(e->job.pending_reason());
  d.set_now_ms(now);
  for (const v1::RankAssignment& ra : e->job.ranks()) {
    v1::RankDiagnostics* r = d.add_ranks();
    r->set_rank(ra.rank());
    r->set_worker_id(ra.worker_id());
    r->set_since_heartbeat_ms(-1);
    auto it = workers_.find(ra.worker_id());
    if (it == workers_.end()) continue;
    const WorkerEntry& w = it->second;
    r->set_worker_state(w.info.state());
    if (w.info.last_heartbeat_ms() > 0) {
      r->set_since_heartbeat_ms(std::max<int64_t>(0, now - w.info.last_heartbeat_ms()));
    }
    if (w.recent_job == job_id && w.recent_generation == e->job.generation()) {
      for (const v1::CollectiveRecord& c : w.recent_collectives) *r->add_recent_collectives() = c;
    }
  }
  return d;
}

}  // namespace shardtrain::coordinator
