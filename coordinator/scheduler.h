// Gang scheduling, as a pure function: which pending jobs start now and on
// which workers, and why each other one waits. No I/O, no clock, no threads.
//
// Policy: FIFO with backfill and reservations, per device kind.
//  - Jobs are considered in submission order; a job is placed only when
//    `world` free workers of its device kind that support its precision
//    exist, all at once (gang: all or none). Ranks are given in worker order
//    (registration order), so the same inputs always give the same placement.
//    An elastic job takes the first of its fallback sizes that fits when its
//    full world does not.
//  - Backfill: a job that does not fit does not stop later jobs of its kind
//    from starting on the free workers it cannot use.
//  - No starvation: a job that does not fit but could (its world, or a
//    fallback size, is at most the number of alive workers able to run it,
//    free or busy) and that later jobs have already passed `reserve_after`
//    times RESERVES its kind: no later job of that kind starts until it has
//    started. Running jobs end, their workers stay free (nothing else may
//    take them), so the reserving job gets its gang once enough are free.
//    With reserve_after = 0 this is strict FIFO for every job that can fit.
//  - A job larger than every alive worker able to run it can never start
//    until workers attach: it reserves nothing, so it cannot block the
//    queue (the coordinator refuses worlds above --max-world at submit).
#ifndef SHARDTRAIN_COORDINATOR_SCHEDULER_H_
#define SHARDTRAIN_COORDINATOR_SCHEDULER_H_

#include <map>
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
  std::string precision = "fp32";  // "fp32", "bf16" or "fp16"
  int passed_over = 0;             // passes in which a later job started instead
};

struct FreeWorker {
  std::string worker_id;
  std::string device;  // its device kind
  // Precisions it supports; empty means fp32 only (older workers).
  std::vector<std::string> precisions;
};

struct Placement {
  std::string job_id;
  std::vector<std::string> workers;  // workers[r] holds rank r
};

struct SchedulePass {
  std::vector<Placement> placements;           // in fifo order
  std::map<std::string, std::string> waiting;  // job_id -> why it was not placed
  // Jobs not placed although a later job of their device kind was: the
  // caller adds one to their passed_over.
  std::vector<std::string> passed_over;
  // Device kind -> the job reserving its free workers, as the pass ends.
  std::map<std::string, std::string> reserved;
};

// Whether worker `w` can run a job on `device` in `precision`.
bool CanRun(const FreeWorker& w, const std::string& device, const std::string& precision);

// `fifo` in submission order; `free` (workers with no job, healthy) and
// `alive` (every alive worker, free or busy: the capacity a job can ever
// count on) in registration order. `reserve_after` as in the policy above.
// `reserved_before`: reservations of jobs ahead of `fifo` (a queue's tail
// considered alone: the coordinator passes the last pass's `reserved`).
SchedulePass RunSchedulePass(const std::vector<PendingJob>& fifo,
                             const std::vector<const FreeWorker*>& free,
                             const std::vector<const FreeWorker*>& alive, int reserve_after,
                             const std::map<std::string, std::string>& reserved_before = {});
// The same over workers held by value.
SchedulePass RunSchedulePass(const std::vector<PendingJob>& fifo,
                             const std::vector<FreeWorker>& free,
                             const std::vector<FreeWorker>& alive, int reserve_after,
                             const std::map<std::string, std::string>& reserved_before = {});

// Orders worker ids "w-2" < "w-10" (registration order).
bool WorkerIdLess(const std::string& a, const std::string& b);

}  // namespace shardtrain::coordinator

#endif  // SHARDTRAIN_COORDINATOR_SCHEDULER_H_
