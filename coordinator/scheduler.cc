#include "coordinator/scheduler.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"

namespace shardtrain::coordinator {

bool WorkerIdLess(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return a.size() < b.size();
  return a < b;
}

bool CanRun(const FreeWorker& w, const std::string& device, const std::string& precision) {
  if (w.device != device) return false;
  if (w.precisions.empty()) return precision == "fp32";
  return std::find(w.precisions.begin(), w.precisions.end(), precision) != w.precisions.end();
}

SchedulePass RunSchedulePass(const std::vector<PendingJob>& fifo,
                             const std::vector<FreeWorker>& free,
                             const std::vector<FreeWorker>& alive, int reserve_after) {
  SchedulePass out;
  std::set<std::string> taken;                  // workers placed in this pass
  std::map<std::string, std::string> reserved;  // kind -> job holding it
  std::vector<size_t> unplaced;                 // fifo indices not placed, not reserving
  for (size_t i = 0; i < fifo.size(); ++i) {
    const PendingJob& job = fifo[i];
    if (job.world <= 0) continue;
    const std::string what =
        job.precision == "fp32" ? job.device : absl::StrCat(job.device, " (", job.precision, ")");
    if (auto r = reserved.find(job.device); r != reserved.end()) {
      out.waiting[job.job_id] =
          absl::StrCat("queued behind ", r->second, ", which reserves the free ", job.device,
                       " workers until it starts");
      continue;
    }
    std::vector<std::string> eligible;
    for (const FreeWorker& w : free) {
      if (!taken.count(w.worker_id) && CanRun(w, job.device, job.precision)) {
        eligible.push_back(w.worker_id);
      }
    }
    int capacity = 0;
    for (const FreeWorker& w : alive) capacity += CanRun(w, job.device, job.precision) ? 1 : 0;
    const size_t available = eligible.size();
    int size = available >= static_cast<size_t>(job.world) ? job.world : 0;
    int smallest = job.world;
    for (int w : job.fallback_worlds) {
      if (w <= 0) continue;
      smallest = std::min(smallest, w);
      if (size == 0 && static_cast<size_t>(w) <= available) size = w;
    }
    if (size > 0) {
      Placement p{job.job_id, {eligible.begin(), eligible.begin() + size}};
      taken.insert(p.workers.begin(), p.workers.end());
      out.placements.push_back(std::move(p));
      for (size_t u : unplaced) {
        if (fifo[u].device == job.device) out.passed_over.push_back(fifo[u].job_id);
      }
      unplaced.erase(std::remove_if(unplaced.begin(), unplaced.end(),
                                    [&](size_t u) { return fifo[u].device == job.device; }),
                     unplaced.end());
      continue;
    }
    std::string why =
        absl::StrCat("waiting for ", job.world, " ", what, " workers, ", available, " free");
    if (smallest < job.world) absl::StrAppend(&why, " (or ", smallest, " to resume elastically)");
    if (capacity == 0) {
      absl::StrAppend(&why, "; no alive worker can run ", what);
      unplaced.push_back(i);
    } else if (smallest > capacity) {
      absl::StrAppend(&why, "; only ", capacity, " alive can run it");
      unplaced.push_back(i);
    } else if (job.passed_over >= reserve_after) {
      absl::StrAppend(&why, "; reserving the free ", job.device, " workers (passed over ",
                      job.passed_over, " times)");
      reserved[job.device] = job.job_id;
    } else {
      unplaced.push_back(i);
    }
    out.waiting[job.job_id] = std::move(why);
  }
  std::sort(out.passed_over.begin(), out.passed_over.end());
  out.passed_over.erase(std::unique(out.passed_over.begin(), out.passed_over.end()),
                        out.passed_over.end());
  return out;
}

}  // namespace shardtrain::coordinator
