// Model FLOPs utilisation of a rank's steps: its share of the model's FLOPs
// per token — its stage's blocks, 1/tp of their matmuls (the planner's
// StageFlops, without recomputation, which MFU does not count) — times its
// tokens per second, over its device's dense peak for the job's precision
// (common/device_peaks.h). Unknown (0, saying why) on CPUs and on GPUs the
// peak table does not list.
#ifndef SHARDTRAIN_WORKER_MFU_H_
#define SHARDTRAIN_WORKER_MFU_H_

#include <optional>
#include <string>

#include "common/job_spec.h"
#include "common/model/param_layout.h"
#include "worker/trainer.h"

namespace shardtrain::worker {

class MfuMeter {
 public:
  // `layout`: the rank's slice; device_model: what the worker registered
  // (v1::Device::model, e.g. "NVIDIA H200, compute capability 9.0").
  MfuMeter(const JobSpec& spec, const model::ParamLayout& layout, const std::string& device_model);

  bool known() const { return peak_.has_value(); }
  // "MFU against H200's dense bf16 peak, 989.4 TFLOP/s", or "MFU omitted:
  // <why>": the worker logs it once per run.
  const std::string& description() const { return description_; }
  // The rank's model FLOPs per token.
  double flops_per_token() const { return flops_per_token_; }
  // The step's MFU; 0 when unknown.
  double Of(const StepResult& r) const;

 private:
  double flops_per_token_ = 0;
  std::optional<double> peak_;
  std::string description_;
};

}  // namespace shardtrain::worker

#endif  // SHARDTRAIN_WORKER_MFU_H_
