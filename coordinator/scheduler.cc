#include "coordinator/scheduler.h"

#include <map>
#include <set>

namespace shardtrain::coordinator {

bool WorkerIdLess(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return a.size() < b.size();
  return a < b;
}

std::vector<Placement> ScheduleGangs(const std::vector<PendingJob>& fifo,
                                     const std::vector<FreeWorker>& free) {
  std::map<std::string, std::vector<std::string>> by_device;  // kind -> free ids, in order
  for (const FreeWorker& w : free) by_device[w.device].push_back(w.worker_id);
  std::map<std::string, size_t> used;  // kind -> workers handed out so far
  std::set<std::string> blocked;       // kinds whose head-of-line job did not fit
  std::vector<Placement> out;
  for (const PendingJob& job : fifo) {
    if (job.world <= 0 || blocked.count(job.device)) continue;
    std::vector<std::string>& pool = by_device[job.device];
    size_t& next = used[job.device];
    const size_t available = pool.size() - next;
    int size = available >= static_cast<size_t>(job.world) ? job.world : 0;
    for (int w : job.fallback_worlds) {
      if (size == 0 && w > 0 && static_cast<size_t>(w) <= available) size = w;
    }
    if (size == 0) {
      blocked.insert(job.device);
      continue;
    }
    Placement p{job.job_id, {}};
    p.workers.assign(pool.begin() + next, pool.begin() + next + size);
    next += size;
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace shardtrain::coordinator
