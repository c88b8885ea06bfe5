// The learning rate of every optimizer step: the one schedule the trainer
// uses and the tests check (llm.c / nanoGPT), from the job spec's optimizer
// section. Step s is 0-based; W = warmup_steps, N = total steps:
//   s < W                 lr · (s + 1) / W                 (linear warmup)
//   constant              lr
//   s >= N or N <= W      min_lr
//   cosine                min_lr + ½(1 + cos(π r))(lr − min_lr), r = (s − W) / (N − W)
//   linear                min_lr + (1 − r)(lr − min_lr)
// Pure; thread-compatible.
#ifndef SHARDTRAIN_WORKER_OPTIM_LR_SCHEDULE_H_
#define SHARDTRAIN_WORKER_OPTIM_LR_SCHEDULE_H_

#include <cstdint>

#include "common/job_spec.h"

namespace shardtrain::optim {

double LearningRate(const OptimizerSpec& optimizer, int64_t step, int64_t total_steps);

}  // namespace shardtrain::optim

#endif  // SHARDTRAIN_WORKER_OPTIM_LR_SCHEDULE_H_
