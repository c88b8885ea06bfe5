// The time a job has left, as progress lines show it. Step times are noisy
// (a shared machine, a checkpoint, a slow batch), and remaining steps × the
// last step's time made the ETA jump (19 s, then 49 s). The estimate uses a
// smoothed step time instead: the mean of the steps seen, then, from the
// 1/alpha-th step on, an exponential moving average, so one slow step moves
// the ETA by alpha of its excess. The first steps after a start or a restart
// (allocation, first touch of the data: several times a normal step) are
// left out.
//
// Not thread-safe; one per stream of events.
#ifndef SHARDTRAIN_CLIENT_ETA_H_
#define SHARDTRAIN_CLIENT_ETA_H_

#include <cstdint>

namespace shardtrain::client {

class EtaEstimator {
 public:
  struct Options {
    int warmup_steps = 2;  // reports left out after a start or a restart, >= 0
    double alpha = 0.1;    // weight of the newest step in the average, in (0, 1]
  };

  EtaEstimator() : EtaEstimator(Options()) {}
  explicit EtaEstimator(Options options) : options_(options) {}

  // Adds the report of `step`, which took `step_ms`. A step at or before the
  // last one added (the job resumed from a checkpoint, perhaps on another
  // number of workers) starts over: a new warm-up, a new average.
  void Add(int64_t step, double step_ms);

  // The smoothed time of one step in ms; NaN until a step after the warm-up
  // has been added.
  double StepMs() const;

  // Seconds until `total_steps` is done after `step`, at StepMs(); NaN while
  // warming up (FormatDuration prints it as "?"), 0 once step >= total_steps.
  double RemainingSeconds(int64_t step, int64_t total_steps) const;

 private:
  Options options_;
  int64_t last_step_ = -1;
  int seen_ = 0;     // reports since the start or the last restart
  int counted_ = 0;  // of those, in the average
  double average_ms_ = 0;
};

}  // namespace shardtrain::client

#endif  // SHARDTRAIN_CLIENT_ETA_H_
