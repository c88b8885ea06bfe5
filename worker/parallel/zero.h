// Zero: ZeRO stages 1-3 (FSDP) of data parallelism over one dp group, per
// shard unit (ParamLayout::units(): embeddings, one per block, final).
//
// Every unit is split over the dp ranks by UnitShardRange (shard_range.h);
// rank r's shard is the concatenation, in unit order, of its range of every
// unit, and it owns AdamW state (m, v) for exactly that.
//
//   stage 1  params and grads whole on every rank. During the last
//            micro-batch's backward each unit's gradient is all-reduced as
//            soon as it is final (overlapped); then every rank steps its
//            shard and the updated shards are all-gathered per unit.
//   stage 2  gradients sharded: after EVERY micro-batch's backward pass of a
//            unit, the unit's gradient is reduce-scattered (overlapped with
//            the rest of the backward), the rank adds its block into its
//            gradient shard and the unit's gradient pages are released
//            (PageBuffer::Release, which also zeroes them for the next
//            backward). Step and all-gather as stage 1.
//   stage 3  parameters sharded too: the rank keeps its parameter shard
//            separately; a unit's parameters are all-gathered into the
//            engine's buffer right before it is used (Engine::set_param_hook)
//            and the next use's unit is prefetched (its all-gather is issued
//            while this one computes); a unit is released after its use
//            unless the next use is the same unit. With
//            reshard_after_forward = false, forward releases nothing: units
//            stay gathered until their backward (ZeRO-2's parameter memory,
//            one all-gather per micro-batch instead of two). Gradients as
//            stage 2. Step updates the shards only.
//   eval     (BeginEval/EndEval: forward-only passes between steps) stage 3
//            gathers each unit for its uses in the forward part of the use
//            order, pass after pass (prefetching the next as in training),
//            and releases it after, keeping it only when the next use is the
//            same unit (the LM head's embeddings stay for the next pass's
//            encoder); EndEval releases the rest. No gradient is reduced.
//            Stages 1-2 hold the whole parameters: nothing to gather.
//   offload  (offload_optimizer) the optimizer state and step live in host
//            memory. On a CPU worker that is where they are anyway: the
//            option changes only the accounting (memory().host_bytes), the
//            numbers are identical.
//   staged   (an engine whose buffers are off the host — a GPU rank — or
//            stage_through_host) ZeRO runs on host mirrors of the engine's
//            parameter and gradient buffers, through a host communicator
//            (Gloo), the way several ranks share one GPU: a unit's gradient
//            is copied to the host when the engine reports it final, then
//            reduced there; a gathered unit (stage 3) or the all-gathered
//            parameters after a step (1-2) are copied to the engine before
//            use. Shards and AdamW state live on the host (the optimizer is
//            offloaded by construction). The numbers equal the unstaged run
//            bit for bit (the same collectives on the same values). Device
//            memory follows Buffer's Release/Acquire protocol: stage 3 takes
//            a unit's parameters when it is gathered and gives them back
//            after use; stages 2-3 take a unit's gradients just before the
//            backward writes them and give them back once copied out. On a
//            GPU whose buffers give memory back (ModelEngineOptions::
//            release_state) the device then holds only the units in use.
//   on the device (a communicator of device memory: NCCL) the gradient
//            reductions and the all-gathers (of the updated shards, stages
//            1-2; of each unit before its use, stage 3) run in the engine's
//            (GPU) buffers, each ordered after the kernels that wrote or
//            freed what it touches by an event on the compute stream; the
//            parameter shard (3), the gradient shard (2-3, with its
//            accumulation scratch), m, v and the AdamW step live on the
//            device too; a unit's memory is taken (Buffer::Acquire) just
//            before it is gathered or its gradients written, and given back
//            after use / once reduced.
//
// Collective: every rank must run the same micro-batches and steps (the
// hooks then issue the same ops in the same order). Communication errors
// inside a Forward/Backward (where hooks cannot return them) are kept: the
// pass finishes on stale data and EndMicroBatch() returns the first error;
// the communicator is poisoned by then, so nothing waits.
//
// A DataParallel strategy (data_parallel.h). Not thread-safe: one caller;
// the engine's hooks run on the caller's thread.
#ifndef SHARDTRAIN_WORKER_PARALLEL_ZERO_H_
#define SHARDTRAIN_WORKER_PARALLEL_ZERO_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/shard_range.h"
#include "worker/comm/communicator.h"
#include "worker/optim/adamw.h"
#include "worker/parallel/data_parallel.h"

namespace shardtrain::parallel {

struct ZeroOptions {
  int stage = 1;                      // 1, 2 or 3
  bool reshard_after_forward = true;  // stage 3 only
  bool offload_optimizer = false;
  // Staged even on a host engine (the GPU path's logic, testable on a CPU).
  bool stage_through_host = false;
  // Expert parallelism: the experts' tensors (ParamLayout::ExpertRanges,
  // the tail of each MoE block's unit) are other experts on the other ep
  // ranks of the replica group, so they are sharded, reduced and gathered
  // over expert_comm instead — the ranks holding the same experts (null
  // when this rank alone does). The rest is sharded over the replica group
  // as ever; gradients of both are averaged over the replica group's size.
  bool split_experts = false;
  comm::Communicator* expert_comm = nullptr;
};

// Bytes one rank holds, by kind: the sizes of the shard buffers (resident
// once a step ran) and the peaks over the steps so far of the whole units
// alive — measured as resident pages (mincore on the model's buffers) with
// set_measure(true), else counted (units gathered; unit gradients written and
// not yet reduced).
struct ZeroMemory {
  int64_t params = 0;      // whole params (stages 1-2), the param shard (3)
  int64_t gathered = 0;    // stage 3: peak of gathered units in the model buffer
  int64_t grads = 0;       // whole grads (1), the gradient shard (2-3)
  int64_t unit_grads = 0;  // stages 2-3: peak of full-unit grads alive in backward
  int64_t optimizer = 0;   // AdamW m and v of the shard
  int64_t comm_buffers = 0;
  bool optimizer_on_host = false;
};

class Zero final : public DataParallel {
 public:
  // engine and comm must outlive the Zero; comm null means dp = 1 (the same
  // code path with local copies instead of collectives). InvalidArgument for
  // a stage outside 1..3; UNIMPLEMENTED unless the engine's parameters and
  // gradients are fp32 (on the host, or staged through it). Stage 3 releases the engine's
  // parameters (call InitParams or Restore next); stages 2-3 release its gradients.
  static absl::StatusOr<std::unique_ptr<Zero>> Create(const ZeroOptions& options,
                                                      engine::Engine* engine,
                                                      const optim::AdamWOptions& adamw,
                                                      comm::Communicator* comm);
  ~Zero() override;

  // The engine's initial parameters (Engine::InitParams(seed)): stages 1-2
  // on the whole buffer, stage 3 only over this rank's shard. No
  // communication.
  void InitParams(uint64_t seed) override;

  // Around each micro-batch (0-based `micro` of `accum`): Begin installs the
  // engine's hooks (and, stage 1, zeroes the gradients at micro 0; stages
  // 2-3 keep them zero themselves); End (after the Backward) waits for this
  // micro-batch's gradient reduction, removes the hooks and returns the
  // first communication error of the pass, if any.
  void BeginMicroBatch(int micro, int accum) override;
  absl::Status EndMicroBatch() override;

  // The optimizer step after the last EndMicroBatch of a step: the gradient
  // averaged over dp, global-norm clipping (optim::ClipScale of the norm
  // over all ranks), AdamW with `lr` on the shard, and (stages 1-2) the
  // all-gather of the updated params. The norm before clipping is identical
  // on every rank; comm_ms is the whole step's time when dp > 1.
  absl::StatusOr<StepStats> Step(float lr, float max_norm, float loss_scale = 1.0f) override;

  // Forward-only passes between steps (see the header comment, eval).
  // EndEval returns the sum of loss_sum over dp, or the first communication
  // error of the passes; the passes' traffic is not counted in Step's
  // comm_bytes.
  void BeginEval() override;
  absl::StatusOr<double> EndEval(double loss_sum) override;

  // Makes the engine's parameter buffer hold the whole, current parameters on
  // every rank (stage 3 all-gathers every unit; 1-2 hold them already), for
  // exporting weights. Collective. The next BeginMicroBatch frees them again.
  absl::Status GatherWholeModel() override;

  // ---- Checkpoints: this rank's shard, which it both writes and reads.
  // Flat ranges [unit.offset + begin, unit.offset + end) of the rank's
  // shard, in unit order (sorted, disjoint; empty ranges left out).
  FlatRanges SaveRanges() const override;
  FlatRanges LoadRanges() const override { return SaveRanges(); }
  // Params, m and v of the shard, concatenated in SaveRanges() order.
  std::vector<float> SaveParams() const override;
  std::vector<float> SaveM() const override;
  std::vector<float> SaveV() const override;
  int64_t optimizer_step() const override;
  // Sets the shard from a checkpoint (each vector holds the ranges'
  // elements in order) and, stages 1-2, all-gathers the params so that every
  // rank holds the whole model again (collective). InvalidArgument for sizes.
  absl::Status Restore(absl::Span<const float> params, absl::Span<const float> m,
                       absl::Span<const float> v, int64_t step) override;

  // ---- Accounting.
  // Elements of the engine's parameter buffer currently gathered (stage 3:
  // the units this rank holds whole right now; otherwise all).
  size_t live_param_elems() const { return live_param_elems_; }
  size_t peak_live_param_elems() const { return peak_live_param_elems_; }
  // Turns on sampling of the engine buffers' resident bytes (mincore) at
  // every unit use and gradient completion, for memory(); off by default
  // (it costs a syscall per use).
  void set_measure(bool on) override { measure_ = on; }
  void set_model_parallel(ModelParallelGrads mp) override { mp_ = std::move(mp); }
  // By kind, ZeRO's own detail, and as every strategy reports it (working =
  // gathered + unit_grads).
  ZeroMemory zero_memory() const;
  ModelStateMemory memory() const override;

  int stage() const { return options_.stage; }
  int dp() const { return dp_; }
  int rank() const { return rank_; }
  size_t shard_size() const { return shard_size_; }

 private:
  // A run of a unit sharded over one group: the whole unit over the
  // replica group, or under expert parallelism an MoE block's dense head
  // over it and its experts (the block's tail) over the expert group.
  struct Part {
    size_t offset = 0, numel = 0;        // in the flat buffer
    size_t body = 0;                     // S: per-rank count of the body collectives
    ShardRange own;                      // this rank's range within the part
    size_t shard_offset = 0;             // where it sits in the concatenated shard
    comm::Communicator* comm = nullptr;  // null: this rank alone holds it
    int dp = 1, rank = 0;                // comm's size and this rank's index
    size_t adamw = 0;                    // its optimizer in adamw_
    size_t begin() const { return offset + own.begin; }  // the shard, flat
  };
  struct Unit {
    size_t offset = 0, numel = 0;  // in the flat buffer
    std::vector<Part> parts;       // in offset order, covering the unit
    enum class State { kReleased, kGathering, kGathered } state = State::kReleased;
    std::vector<std::shared_ptr<comm::Work>> gather;  // in flight while kGathering
  };
  struct Reduction {  // one unit's gradient reduction in flight
    int unit;
    std::vector<std::shared_ptr<comm::Work>> works;
  };

  Zero(const ZeroOptions& options, engine::Engine* engine, comm::Communicator* comm, bool staged);
  // Staged: the engine's [offset, offset + n) of the parameters from the
  // host mirror, and of the gradients to it. No-ops otherwise.
  void PushParams(size_t offset, size_t n);
  void PullGrads(size_t offset, size_t n);
  // Staged, stages 2-3: takes `unit`'s device gradients (Buffer::Acquire)
  // before the engine writes them. No-op otherwise, or for unit -1.
  void AcquireGrads(int unit);
  // Bytes sent in the collectives since the last call (ring model of each
  // op actually issued: all-gather and reduce-scatter (dp-1)·count,
  // all-reduce 2(dp-1)/dp·count, broadcast (dp-1)/dp·count elements).
  int64_t TakeCommBytes();
  absl::StatusOr<double> StepShard(float lr, float max_norm, float loss_scale);

  // Stage 3's InitParams of one part: its shard from the seed.
  void InitShardParams(uint64_t seed, const Part& p);
  void OnParamUse(int unit, bool begin);
  // The engine's hook: every unit from the lowest not yet handled this
  // micro-batch down to the one at `offset` is final (one unit per call in
  // a whole backward; an interleaved stage's last chunk pass reports only
  // its own units, those of the later chunks having finished before).
  void OnGradsReady(size_t offset);
  // One unit's gradient final: pulled, reduced.
  void UnitGradsReady(int unit);
  void Gather(Unit& u);
  void WaitGathered(Unit& u);
  void ReleaseParams(Unit& u);
  void LaunchReduction(int unit);
  void CompleteReduction(Reduction& r);
  // Waits for every op of `works`; keeps the first failure in status_.
  void Wait(std::vector<std::shared_ptr<comm::Work>>& works);
  void Keep(absl::Status s);
  void Sample();
  absl::Span<float> ShardGrad(const Part& p);
  float* ShardParamPtr(const Part& p);
  absl::Status GatherAllParams();  // stages 1-2: every unit, in place; staged, then to the engine
  absl::StatusOr<double> SumOverRanks(double local);
  // On the device: an event after the compute stream's work so far, for an
  // op that reads what that work wrote (kept until the next step); null
  // otherwise.
  const engine::Event* AfterDeviceWork();
  // Where the shard's arithmetic runs: the engine's math on the device,
  // else the host's threads.
  engine::FlatMath& ShardMath();
  std::shared_ptr<comm::Work> Count(std::shared_ptr<comm::Work> w, int64_t bytes);
  // One AdamW state (m or v) of every part, concatenated in shard order.
  template <typename Get>
  std::vector<float> ConcatState(Get get) const {
    std::vector<float> out;
    out.reserve(shard_size_);
    for (const optim::AdamW& a : adamw_) {
      const std::vector<float> s = get(a);  // a copy: m and v may live on a device
      out.insert(out.end(), s.begin(), s.end());
    }
    return out;
  }

  const ZeroOptions options_;
  engine::Engine* const engine_;
  comm::Communicator* const comm_;  // null when dp == 1
  const int dp_, rank_;
  const bool staged_;
  // The collectives take the engine's (device) buffers: stage 1 over NCCL.
  bool on_device_ = false;
  std::vector<std::unique_ptr<engine::Event>> events_;  // see AfterDeviceWork
  engine::HostFlatMath host_math_{nullptr};             // ShardMath off the device
  // Where Zero reads and writes whole-model parameters and gradients: the
  // engine's buffers, or (staged) their host mirrors below.
  std::vector<float> host_params_, host_grads_;
  std::vector<std::unique_ptr<engine::HostPin>> pins_;  // the mirrors, page-locked
  float* params_ = nullptr;
  float* grads_ = nullptr;
  std::vector<Unit> units_;
  size_t shard_size_ = 0;
  std::vector<optim::AdamW> adamw_;    // one per part, over its own range
  std::vector<float> shard_params_;    // stage 3
  std::vector<float> shard_grads_;     // stages 2-3
  std::vector<float> reduce_scratch_;  // stages 2-3 with accumulation > 1
  // On the device, the same three in the engine's memory.
  std::unique_ptr<engine::Buffer> device_shard_params_, device_shard_grads_, device_reduce_scratch_;
  float* ShardParams() {
    return on_device_ ? device_shard_params_->as<float>() : shard_params_.data();
  }
  float* ShardGrads() {
    return on_device_ ? device_shard_grads_->as<float>() : shard_grads_.data();
  }
  bool has_reduce_scratch() const {  // made once accumulation needs it
    return on_device_ ? device_reduce_scratch_ != nullptr : !reduce_scratch_.empty();
  }
  float* ReduceScratch() {
    return on_device_ ? device_reduce_scratch_->as<float>() : reduce_scratch_.data();
  }
  std::unique_ptr<engine::Buffer> device_norm_scratch_;  // SumOverRanks on the device
  std::vector<int> uses_;  // the order of Engine::set_param_hook calls of one micro-batch
  size_t forward_uses_ = 0;
  size_t cursor_ = 0;
  bool eval_ = false;            // between BeginEval and EndEval: forward uses only
  int64_t comm_bytes_eval_ = 0;  // comm_bytes_ at BeginEval
  int micro_ = 0;
  int unhandled_units_ = 0;  // units [0, this) not yet final in this micro-batch
  std::deque<Reduction> reductions_;
  absl::Status status_;
  int64_t comm_bytes_ = 0;
  size_t live_param_elems_ = 0, peak_live_param_elems_ = 0;
  size_t peak_live_grad_elems_ = 0;  // stages 2-3: whole-unit gradients alive (logical)
  int emb_unit_ = 0;                 // the embeddings unit when the LM head is tied to it, else -1
  bool measure_ = false;
  ModelParallelGrads mp_;
  int64_t peak_gathered_bytes_ = 0, peak_unit_grad_bytes_ = 0;
};

}  // namespace shardtrain::parallel

#endif  // SHARDTRAIN_WORKER_PARALLEL_ZERO_H_
