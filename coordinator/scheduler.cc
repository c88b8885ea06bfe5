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

namespace {

// The free workers able to run one (device, precision), and how many alive
// ones could: built once per distinct pair in a pass, so a pass costs
// O(jobs + workers) per pair, not O(jobs x workers).
struct Pool {
  std::string device;
  std::string precision;
  std::vector<const FreeWorker*> free;  // registration order
  size_t next = 0;                      // free[0, next) are all taken
  size_t taken = 0;                     // taken members of `free`
  int capacity = 0;                     // alive workers able to run it
};

}  // namespace

SchedulePass RunSchedulePass(const std::vector<PendingJob>& fifo,
                             const std::vector<FreeWorker>& free,
                             const std::vector<FreeWorker>& alive, int reserve_after,
                             const std::map<std::string, std::string>& reserved_before) {
  auto pointers = [](const std::vector<FreeWorker>& v) {
    std::vector<const FreeWorker*> p;
    p.reserve(v.size());
    for (const FreeWorker& w : v) p.push_back(&w);
    return p;
  };
  return RunSchedulePass(fifo, pointers(free), pointers(alive), reserve_after, reserved_before);
}

SchedulePass RunSchedulePass(const std::vector<PendingJob>& fifo,
                             const std::vector<const FreeWorker*>& free,
                             const std::vector<const FreeWorker*>& alive, int reserve_after,
                             const std::map<std::string, std::string>& reserved_before) {
  SchedulePass out;
  std::set<std::string> taken;                                    // workers placed in this pass
  std::map<std::string, std::string> reserved = reserved_before;  // kind -> job holding it
  std::vector<size_t> unplaced;  // fifo indices not placed, not reserving
  std::map<std::pair<std::string, std::string>, Pool> pools;
  auto pool_for = [&](const PendingJob& job) -> Pool& {
    const auto key = std::make_pair(job.device, job.precision);
    if (auto it = pools.find(key); it != pools.end()) return it->second;
    Pool& p = pools[key];
    p.device = job.device;
    p.precision = job.precision;
    for (const FreeWorker* w : free) {
      if (!taken.count(w->worker_id) && CanRun(*w, job.device, job.precision)) p.free.push_back(w);
    }
    for (const FreeWorker* w : alive) p.capacity += CanRun(*w, job.device, job.precision) ? 1 : 0;
    return p;
  };
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
    Pool& pool = pool_for(job);
    const int capacity = pool.capacity;
    const size_t available = pool.free.size() - pool.taken;
    int size = available >= static_cast<size_t>(job.world) ? job.world : 0;
    int smallest = job.world;
    for (int w : job.fallback_worlds) {
      if (w <= 0) continue;
      smallest = std::min(smallest, w);
      if (size == 0 && static_cast<size_t>(w) <= available) size = w;
    }
    if (size > 0) {
      std::vector<const FreeWorker*> chosen;
      for (size_t k = pool.next; k < pool.free.size() && chosen.size() < size_t(size); ++k) {
        if (!taken.count(pool.free[k]->worker_id)) chosen.push_back(pool.free[k]);
      }
      Placement p{job.job_id, {}};
      for (const FreeWorker* w : chosen) {
        taken.insert(w->worker_id);
        p.workers.push_back(w->worker_id);
      }
      for (auto& [key, other] : pools) {  // every pool the chosen workers were free in
        for (const FreeWorker* w : chosen) other.taken += CanRun(*w, other.device, other.precision);
        while (other.next < other.free.size() && taken.count(other.free[other.next]->worker_id)) {
          ++other.next;
        }
      }
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
  out.reserved = std::move(reserved);
  std::sort(out.passed_over.begin(), out.passed_over.end());
  out.passed_over.erase(std::unique(out.passed_over.begin(), out.passed_over.end()),
                        out.passed_over.end());
  return out;
}

}  // namespace shardtrain::coordinator
