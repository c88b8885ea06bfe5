// LossScaler: fp16's dynamic loss scaling, PyTorch's GradScaler rule. The
// backward passes multiply the loss by scale() so that small gradients do
// not flush to zero in fp16; the optimizer divides them by it again. After
// each step the caller says whether the gradients it produced were finite:
//
//   not finite (found_inf)  the step is skipped (parameters and optimizer
//                           state unchanged), the scale is multiplied by
//                           backoff_factor (halved), but never below
//                           min_scale, and the count of clean steps restarts;
//   finite                  one more clean step; after growth_interval
//                           clean steps in a row the scale is multiplied by
//                           growth_factor (doubled) and the count restarts.
//                           A growth that would overflow float is not made.
//
// With the defaults: 2^16 at first, halved on every overflow, doubled after
// 2000 clean steps. Pure: no device, no I/O. Thread-compatible.
#ifndef SHARDTRAIN_WORKER_OPTIM_LOSS_SCALER_H_
#define SHARDTRAIN_WORKER_OPTIM_LOSS_SCALER_H_

#include <cstdint>

#include "absl/status/status.h"

namespace shardtrain::optim {

struct LossScalerOptions {
  float initial_scale = 65536.0f;  // 2^16, torch.cuda.amp.GradScaler's init_scale
  float growth_factor = 2.0f;      // > 1: the scale's growth after growth_interval clean steps
  float backoff_factor = 0.5f;     // in (0, 1): the scale's change on an overflow
  int64_t growth_interval = 2000;  // >= 1: clean steps in a row before the scale grows
  float min_scale = 1.0f;          // > 0: the scale never falls below this
};

// OK when `o` meets the bounds listed in LossScalerOptions and
// min_scale <= initial_scale (all finite); INVALID_ARGUMENT naming the field
// otherwise.
absl::Status CheckLossScalerOptions(const LossScalerOptions& o);

class LossScaler {
 public:
  // `options` must pass CheckLossScalerOptions.
  explicit LossScaler(const LossScalerOptions& options = {})
      : options_(options), scale_(options.initial_scale) {}

  // The factor the next step's backward multiplies the loss by.
  float scale() const { return scale_; }
  // Clean steps in a row since the scale last changed (or since Restore).
  int64_t growth_tracker() const { return tracker_; }
  const LossScalerOptions& options() const { return options_; }

  // After a step whose gradients were not finite (found_inf: an inf or NaN
  // anywhere, on any rank) or were: true when that step must be skipped
  // (exactly when found_inf). Updates scale() for the next step as the
  // header comment says.
  bool Update(bool found_inf);

  // The state a checkpoint carries (scale() and growth_tracker()), restored
  // on resume so that the run continues as if uninterrupted. INVALID_ARGUMENT
  // (and no change) for a scale that is not finite or not > 0, or a negative
  // tracker; a scale below min_scale is raised to it.
  absl::Status Restore(float scale, int64_t growth_tracker);

 private:
  LossScalerOptions options_;
  float scale_;
  int64_t tracker_ = 0;
};

}  // namespace shardtrain::optim

#endif  // SHARDTRAIN_WORKER_OPTIM_LOSS_SCALER_H_
