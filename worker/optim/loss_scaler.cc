#include "worker/optim/loss_scaler.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace shardtrain::optim {

absl::Status CheckLossScalerOptions(const LossScalerOptions& o) {
  auto bad = [](absl::string_view field, double v, absl::string_view want) {
    return absl::InvalidArgumentError(absl::StrCat("loss scaler ", field, ": ", v, " ", want));
  };
  if (!std::isfinite(o.min_scale) || !(o.min_scale > 0)) {
    return bad("min_scale", o.min_scale, "is not > 0");
  }
  if (!std::isfinite(o.initial_scale) || !(o.initial_scale >= o.min_scale)) {
    return bad("initial_scale", o.initial_scale,
               absl::StrCat("is not finite and >= min_scale ", o.min_scale));
  }
  if (!std::isfinite(o.growth_factor) || !(o.growth_factor > 1)) {
    return bad("growth_factor", o.growth_factor, "is not > 1");
  }
  if (!(o.backoff_factor > 0 && o.backoff_factor < 1)) {
    return bad("backoff_factor", o.backoff_factor, "is not in (0, 1)");
  }
  if (o.growth_interval < 1) {
    return bad("growth_interval", static_cast<double>(o.growth_interval), "is not >= 1");
  }
  return absl::OkStatus();
}

bool LossScaler::Update(bool found_inf) {
  if (found_inf) {
    scale_ = std::max(options_.min_scale, scale_ * options_.backoff_factor);
    tracker_ = 0;
    return true;
  }
  if (++tracker_ >= options_.growth_interval) {
    // As GradScaler: a growth to inf is not made (the count restarts anyway).
    if (const float grown = scale_ * options_.growth_factor; std::isfinite(grown)) scale_ = grown;
    tracker_ = 0;
  }
  return false;
}

absl::Status LossScaler::Restore(float scale, int64_t growth_tracker) {
  if (!std::isfinite(scale) || !(scale > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("loss scale ", scale, " is not a finite number > 0"));
  }
  if (growth_tracker < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("loss scaler growth tracker ", growth_tracker, " is negative"));
  }
  scale_ = std::max(options_.min_scale, scale);
  tracker_ = growth_tracker;
  return absl::OkStatus();
}

}  // namespace shardtrain::optim
