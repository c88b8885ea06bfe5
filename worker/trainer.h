// Trains one rank of a job: the model built from the spec's seed (the same
// on every rank), data windows sampled so that the union over ranks of one
// step's batch is the 1-rank batch, gradient accumulation over micro-batches,
// and DDP: gradients averaged over the data-parallel group in buckets (sum
// then scale, so N ranks give the 1-rank gradient), then clipping and AdamW
// on every rank identically. Bucket all-reduces are launched during the last
// micro-batch's backward as soon as a bucket's gradients are final
// (Gpt::set_grads_ready_hook), so communication overlaps with computation.
//
// Supported layouts today: dp >= 1 with tp = pp = 1 and ZeRO stage 0 (DDP)
// or 1-3 (parallel/zero.h: AdamW state, gradients and parameters sharded
// over dp per unit, with or without reshard_after_forward and optimizer
// offload); others are refused with FAILED_PRECONDITION naming the field.
//
// Not thread-safe: one caller.
#ifndef SHARDTRAIN_WORKER_TRAINER_H_
#define SHARDTRAIN_WORKER_TRAINER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/job_spec.h"
#include "worker/checkpoint/shard_file.h"
#include "worker/checkpoint/storage.h"
#include "worker/comm/communicator.h"
#include "worker/data/sampler.h"
#include "worker/engine/cpu/gpt.h"
#include "worker/optim/adamw.h"
#include "worker/parallel/zero.h"

namespace shardtrain::worker {

// What one optimizer step did on this rank.
struct StepResult {
  int64_t step = 0;      // 1-based
  double loss = 0;       // this rank's mean loss over its micro-batches
  double grad_norm = 0;  // global norm before clipping (identical on every rank)
  double lr = 0;
  double step_ms = 0;
  double comm_ms = 0;       // time blocked waiting for gradient all-reduces (exposed)
  double allreduce_ms = 0;  // time the all-reduces ran (flight recorder); 1 - comm/allreduce
                            // is the fraction hidden behind backward
  int64_t comm_bytes = 0;   // bytes this rank sent (ring all-reduce: 2(n-1)/n of the payload)
  int64_t tokens = 0;       // tokens this rank processed
};

// Bytes one rank holds, by kind (see Trainer::memory()).
struct MemoryUse {
  int64_t params = 0;        // parameters kept between steps (ZeRO-3: the shard)
  int64_t grads = 0;         // gradients kept (ZeRO-2/3: the shard)
  int64_t optimizer = 0;     // AdamW m and v (offload: in host memory)
  int64_t activations = 0;   // activations and backward scratch of one micro-batch
  int64_t comm_buffers = 0;  // buffers only communication needs
  int64_t working = 0;       // ZeRO-2/3 peak of whole units alive at once: gathered
                             // params (3) and full-unit gradients in backward
  bool optimizer_on_host = false;
  int64_t Total() const {
    return params + grads + optimizer + activations + comm_buffers + working;
  }
};

class Trainer {
 public:
  // `comm` is the data-parallel group (size dp); null when dp == 1. It must
  // outlive the trainer. Loads the data (errors name the file).
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(const JobSpec& spec, int rank, int threads,
                                                         comm::Communicator* comm);

  // Runs optimizer step `step` (1-based). Collective when dp > 1.
  absl::StatusOr<StepResult> Step(int64_t step);

  // Writes this rank's shard of the state after `step` (params, AdamW m and
  // v of the rank's even split of the flat buffer, and the scalars) to
  // <checkpoint.dir>/step-<step>/rank-<rank>.shard, atomically. Returns what
  // the coordinator's manifest needs; *path gets the file.
  absl::StatusOr<checkpoint::ShardFileInfo> SaveShard(checkpoint::CheckpointStorage& storage,
                                                      int64_t step, std::string* path);
  // Loads the committed checkpoint in `step_dir` (any world size that wrote
  // it) into the model and optimizer; returns its step, the last one done.
  absl::StatusOr<int64_t> Restore(checkpoint::CheckpointStorage& storage,
                                  const std::string& step_dir);

  // The whole model's current parameters, in model().params() on every rank
  // (ZeRO-3 all-gathers them; otherwise they are there already). Collective
  // under ZeRO-3: every rank calls it, e.g. before rank 0 saves the weights.
  absl::Status GatherWholeModel() { return zero_ ? zero_->GatherWholeModel() : absl::OkStatus(); }

  // Memory this rank holds: sizes of its buffers, and for ZeRO-2/3 the
  // measured peak of the working set (with set_measure_memory(true): resident
  // pages of the model's buffers, sampled at every unit use).
  MemoryUse memory() const;
  void set_measure_memory(bool on) {
    if (zero_) zero_->set_measure(on);
  }
  // ZeRO, or null for stage 0.
  const parallel::Zero* zero() const { return zero_.get(); }

  engine::cpu::Gpt& model() { return *model_; }
  const JobSpec& spec() const { return spec_; }

 private:
  Trainer(JobSpec spec, int rank, comm::Communicator* comm)
      : spec_(std::move(spec)), rank_(rank), comm_(comm) {}
  // Launches all-reduces of whole buckets of [offset, unlaunched_end_)
  // (from the end of the buffer); with `flush`, also the remainder.
  void LaunchBuckets(size_t offset, bool flush);
  // Waits for the launched buckets, then averages over dp.
  absl::Status FinishAllReduce(StepResult* r);

  const JobSpec spec_;
  const int rank_;
  comm::Communicator* const comm_;
  BatchSplit split_;  // of spec_.batch over dp
  int dp_rank_ = 0;   // this rank's dp coordinate
  std::vector<uint16_t> tokens_;
  std::unique_ptr<data::BatchSampler> sampler_;
  std::unique_ptr<engine::cpu::Gpt> model_;
  std::unique_ptr<optim::AdamW> adamw_;   // ZeRO 0: the whole buffer
  std::unique_ptr<parallel::Zero> zero_;  // ZeRO 1-3 (declared after model_: destroyed first)
  std::vector<int> inputs_, targets_;
  size_t bucket_elems_ = 0;
  size_t unlaunched_end_ = 0;  // gradients [unlaunched_end_, end) are in flight
  std::vector<std::shared_ptr<comm::Work>> inflight_;
};

// Where rank 0 saves the final weights: <checkpoint.dir>/final.weights, or
// empty when the spec has no checkpoint dir.
std::string FinalWeightsPath(const JobSpec& spec);

}  // namespace shardtrain::worker

#endif  // SHARDTRAIN_WORKER_TRAINER_H_
