// Who may be ganged after a failure: a generation's workers wait for their
// next heartbeat (the rank that died never sends one), and an elastic job
// does not shrink while a former rank may still come back.
#include "coordinator/coordinator.h"

namespace shardtrain::coordinator {

void Coordinator::HoldForHeartbeat(const JobEntry& e) {
  for (const v1::RankAssignment& r : e.job.ranks()) {
    auto it = workers_.find(r.worker_id());
    if (it != workers_.end()) it->second.awaiting_heartbeat = true;
    SchedulingInputsChanged();
  }
}

bool Coordinator::Schedulable(const WorkerEntry& w, int64_t now) const {
  // Workers beat at least every lease/3: one silent for half a lease is
  // probably gone, even before its lease runs out.
  return w.info.state() == v1::WORKER_STATE_ALIVE && w.info.job_id().empty() &&
         !w.awaiting_heartbeat && now - w.info.last_heartbeat_ms() <= options_.lease_ms / 2;
}

bool Coordinator::AwaitingFormerRanks(const JobEntry& e, int64_t now) const {
  for (const v1::RankAssignment& r : e.job.ranks()) {
    auto it = workers_.find(r.worker_id());
    if (it != workers_.end() && it->second.awaiting_heartbeat &&
        it->second.info.state() != v1::WORKER_STATE_DEAD && now <= it->second.lease_until) {
      return true;
    }
  }
  return false;
}

}  // namespace shardtrain::coordinator
