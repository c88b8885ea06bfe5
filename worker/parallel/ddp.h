// Ddp: plain data parallelism (ZeRO stage 0). Every rank holds the whole
// model, gradients and AdamW state. Gradients accumulate locally over the
// micro-batches; during the last micro-batch's backward they are all-reduced
// in buckets of `bucket_bytes` from the end of the buffer, each launched as
// soon as the engine reports its gradients final (the grads-ready hook), so
// communication overlaps with the rest of the backward. Step() waits for the
// buckets, averages (sum then scale by 1/dp, so N ranks give the 1-rank
// gradient), clips by the global norm and steps AdamW — identically on
// every rank.
//
// Ranks on GPUs all-reduce through the host (Gloo with host staging, the
// way several ranks share one GPU): each bucket, once final, is copied to a
// host buffer and all-reduced there while backward goes on (the copy waits
// for the work queued before it); the sums are copied back after.
//
// offload_optimizer (parallel.offload: optimizer): on an engine off the
// host, AdamW's m and v and its update live in host memory over a host copy
// of the fp32 master — the gradients come out once per step (as staged), the
// clipped update runs on the host and the parameters go back. With one rank
// and nothing for tp or pp to add to the gradient, it comes out during the
// last micro-batch's backward instead: each unit, once final, is copied to
// the host on a copy stream beside the compute stream (ordered after the
// backward's kernels by an event), so Step only waits for the last one and
// applies the clip factor on the host. On a host engine nothing moves (they
// are there anyway); memory() says where the optimizer state is either way.
//
// Evaluation needs nothing of it: every rank holds the whole model, so a
// forward-only pass just runs; EndEval sums the losses over dp.
//
// Checkpoints: a rank writes the dp-th even split of the flat buffer
// (checkpoint::EvenSplit) and reads everything back (it holds all).
//
// Not thread-safe: one caller (see data_parallel.h).
#ifndef SHARDTRAIN_WORKER_PARALLEL_DDP_H_
#define SHARDTRAIN_WORKER_PARALLEL_DDP_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "worker/engine/flat_math.h"
#include "worker/optim/adamw.h"
#include "worker/parallel/data_parallel.h"

namespace shardtrain::parallel {

class Ddp final : public DataParallel {
 public:
  // engine and comm must outlive the Ddp; comm null (or of size 1) means
  // dp = 1. The engine's parameters must be its fp32 master; across ranks,
  // gradients off the host are staged through it. `stage_through_host`
  // stages host gradients too, and offloads a host engine's optimizer as
  // one off the host (the GPU paths' logic, testable on a CPU).
  // bucket_bytes > 0. `reduce_bf16` (parallel.reduce_dtype bf16): each
  // bucket is converted to bf16 in the engine's memory and all-reduced so,
  // the sum converted back into the fp32 gradient; a device-memory
  // communicator only (INVALID_ARGUMENT otherwise, when dp > 1).
  static absl::StatusOr<std::unique_ptr<Ddp>> Create(engine::Engine* engine,
                                                     const optim::AdamWOptions& adamw,
                                                     comm::Communicator* comm, size_t bucket_bytes,
                                                     bool stage_through_host = false,
                                                     bool offload_optimizer = false,
                                                     bool reduce_bf16 = false);
  ~Ddp() override;

  void InitParams(uint64_t seed) override;
  void BeginMicroBatch(int micro, int accum) override;
  absl::Status EndMicroBatch() override;
  absl::StatusOr<StepStats> Step(float lr, float max_norm, float loss_scale = 1.0f) override;
  void BeginEval() override {}
  absl::StatusOr<double> EndEval(double loss_sum) override {
    return SumOverGroup(comm_, loss_sum, &engine_->math());
  }
  absl::Status GatherWholeModel() override { return absl::OkStatus(); }

  FlatRanges SaveRanges() const override;
  std::vector<float> SaveParams() const override;
  std::vector<float> SaveM() const override;
  std::vector<float> SaveV() const override;
  int64_t optimizer_step() const override { return adamw_.step(); }
  FlatRanges LoadRanges() const override;
  absl::Status Restore(absl::Span<const float> params, absl::Span<const float> m,
                       absl::Span<const float> v, int64_t optimizer_step) override;

  ModelStateMemory memory() const override;
  void set_measure(bool on) override { measure_ = on; }
  void set_model_parallel(ModelParallelGrads mp) override { mp_ = std::move(mp); }

 private:
  Ddp(engine::Engine* engine, optim::AdamW adamw, comm::Communicator* comm, size_t bucket_elems,
      bool staged, bool offload, bool host_master, bool reduce_bf16);
  // The buffer the buckets are all-reduced in: the gradients, or their
  // host copy when staged.
  float* BucketBase();
  // Launches all-reduces of whole buckets of [offset, unlaunched_end_)
  // (from the end of the buffer); with `flush`, also the remainder.
  void LaunchBuckets(size_t offset, bool flush);
  // Waits for the launched buckets, then averages over dp.
  absl::Status FinishAllReduce(StepStats* stats);
  // The offloaded optimizer's step: AdamW on the host's threads over the
  // host copy of the master, the result copied to the engine. The gradient
  // is copied out of `device_grads` first, or already in host_grads_ (null).
  absl::Status StepOnHost(const float* device_grads, float lr);
  // AdamW (advanced already) over host elements [begin, end), the result
  // queued back to the engine's parameters.
  void StepPieceOnHost(size_t begin, size_t end, float lr);
  // Whether this step's gradient leaves during the backward (see the class
  // comment).
  bool CopiesEarly() const;
  // Queues the copy of gradients [offset, uncopied_end_) to host_grads_ on
  // copy_stream_, after the compute stream's work so far.
  void LaunchCopy(size_t offset);
  // The offloaded step over the copies LaunchCopy made: each range, once
  // arrived, scaled by `scale` (clipping, loss scale) and stepped on the
  // host, its parameters queued back.
  absl::Status StepCopiedOut(float lr, float scale);
  // Waits for the copies in flight and forgets them.
  void DrainCopies();

  engine::Engine* const engine_;
  optim::AdamW adamw_;              // the whole buffer
  comm::Communicator* const comm_;  // null when dp == 1
  const size_t bucket_elems_;
  size_t unlaunched_end_ = 0;  // gradients [unlaunched_end_, end) are in flight
  std::vector<std::shared_ptr<comm::Work>> inflight_;
  // A device communicator's buckets wait for these (on the compute stream).
  std::vector<std::unique_ptr<engine::Event>> bucket_events_;
  bool measure_ = false;
  ModelParallelGrads mp_;
  const bool staged_;              // the gradients through host_grads_
  std::vector<float> host_grads_;  // staged: the gradients' host copy
  const bool offload_;             // parallel.offload: optimizer (accounting)
  // The optimizer steps host_params_ (the master's host copy) with
  // host_grads_ and copies the result to the engine: offload off the host.
  const bool host_master_;
  std::vector<float> host_params_;
  engine::HostFlatMath host_math_;
  // host_grads_ and host_params_ page-locked for the engine's device
  // (declared after them: unpinned before they are freed).
  std::vector<std::unique_ptr<engine::HostPin>> pins_;
  // The gradient's copies during the backward (CopiesEarly): the stream
  // (null where the device gives none), the events they wait for, each
  // range queued with the event marking its arrival (in the order queued:
  // from the end of the buffer), and the part not queued yet.
  std::unique_ptr<engine::Stream> copy_stream_;
  std::vector<std::unique_ptr<engine::Event>> copy_after_;
  struct Arrival {
    size_t begin = 0, end = 0;
    std::unique_ptr<engine::Event> done;
  };
  std::vector<Arrival> arrivals_;
  size_t uncopied_end_ = 0;
  bool copying_ = false;  // this step's gradient is being copied out early
  // parallel.reduce_dtype bf16: the gradient's bf16 copy the buckets are
  // all-reduced in (the engine's memory), as 16-bit values.
  std::unique_ptr<engine::Buffer> bf16_grads_;
  uint16_t* Bf16Grads() { return static_cast<uint16_t*>(bf16_grads_->data()); }
};

}  // namespace shardtrain::parallel

#endif  // SHARDTRAIN_WORKER_PARALLEL_DDP_H_
