#include "worker/optim/lr_schedule.h"

#include <cmath>

namespace shardtrain::optim {

double LearningRate(const OptimizerSpec& o, int64_t step, int64_t total) {
  if (step < o.warmup_steps) return o.lr * double(step + 1) / double(o.warmup_steps);
  if (o.schedule == LrSchedule::kConstant) return o.lr;
  if (step >= total || total <= o.warmup_steps) return o.min_lr;
  const double r = double(step - o.warmup_steps) / double(total - o.warmup_steps);
  const double decay = o.schedule == LrSchedule::kCosine
                           ? 0.5 * (1.0 + std::cos(3.14159265358979323846 * r))
                           : 1.0 - r;
  return o.min_lr + decay * (o.lr - o.min_lr);
}

}  // namespace shardtrain::optim
