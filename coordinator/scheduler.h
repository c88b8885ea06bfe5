// Gang scheduling, as a pure function: which pending jobs start now and on
// which workers. No I/O, no clock, no threads.
//
// Policy: strict FIFO per device kind. Jobs are considered in submission
// order; a job is placed only when `world` free workers of its device kind
// exist, all at once (gang: all or none). A job that cannot be placed blocks
// the later jobs of the same device kind (no backfill, so a large job is
// never starved by a stream of small ones); jobs of other kinds go on.
// Ranks are given in worker order (registration order), so the same inputs
// always give the same placement. An elastic job takes the first of its
// fallback sizes that fits when its full world does not.
#ifndef SHARDTRAIN_COORDINATOR_SCHEDULER_H_
#define SHARDTRAIN_COORDINATOR_SCHEDULER_H_

#include <string>
#include <vector>

namespace shardtrain::coordinator {

struct PendingJob {
  std::string job_id;
  int world = 0;
  std::string device;  // "cpu" or "cuda"
  // Smaller gang sizes the job also accepts, most preferred first (elastic
  // recovery); tried in order when `world` does not fit.
  std::vector<int> fallback_worlds;
};

struct FreeWorker {
  std::string worker_id;
  std::string device;  // its device kind
};

struct Placement {
  std::string job_id;
  std::vector<std::string> workers;  // workers[r] holds rank r
};

// `fifo` in submission order; `free` in registration order.
std::vector<Placement> ScheduleGangs(const std::vector<PendingJob>& fifo,
                                     const std::vector<FreeWorker>& free);

// Orders worker ids "w-2" < "w-10" (registration order).
bool WorkerIdLess(const std::string& a, const std::string& b);

}  // namespace shardtrain::coordinator

#endif  // SHARDTRAIN_COORDINATOR_SCHEDULER_H_
