#include "client/eta.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace shardtrain::client {

void EtaEstimator::Add(int64_t step, double step_ms) {
  if (step <= last_step_) seen_ = counted_ = 0;
  last_step_ = step;
  if (++seen_ <= options_.warmup_steps || !std::isfinite(step_ms) || step_ms < 0) return;
  ++counted_;
  // 1/n for the first steps (their plain mean), alpha after: no start-up
  // bias towards the first counted step.
  const double weight = std::max(options_.alpha, 1.0 / counted_);
  average_ms_ += weight * (step_ms - average_ms_);
}

double EtaEstimator::StepMs() const {
  return counted_ > 0 ? average_ms_ : std::numeric_limits<double>::quiet_NaN();
}

double EtaEstimator::RemainingSeconds(int64_t step, int64_t total_steps) const {
  if (step >= total_steps) return 0;
  return StepMs() * static_cast<double>(total_steps - step) / 1000.0;
}

}  // namespace shardtrain::client
