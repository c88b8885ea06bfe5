#include "worker/mfu.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/device_peaks.h"
#include "common/planner.h"

namespace shardtrain::worker {

MfuMeter::MfuMeter(const JobSpec& spec, const model::ParamLayout& layout,
                   const std::string& device_model) {
  const int T = spec.batch.seq_len;
  flops_per_token_ = StageFlops(layout.config(), 1, T, layout.slice(), {}).train / T;
  const bool gpu = spec.resources.device == DeviceKind::kCuda;
  if (gpu) peak_ = DensePeakFlops(device_model, spec.Compute());
  if (peak_) {
    description_ = absl::StrFormat("MFU against %s's dense %s peak, %.1f TFLOP/s",
                                   FindDevicePeak(device_model)->label,
                                   std::string(DataTypeName(spec.Compute())), *peak_ / 1e12);
  } else {
    description_ =
        absl::StrCat("MFU omitted: ", WhyNoPeak(gpu ? device_model : "", spec.Compute()));
  }
}

double MfuMeter::Of(const StepResult& r) const {
  if (!peak_ || r.step_ms <= 0) return 0;
  return double(r.tokens) * flops_per_token_ / (r.step_ms / 1000.0) / *peak_;
}

}  // namespace shardtrain::worker
