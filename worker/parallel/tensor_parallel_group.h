// TensorParallelGroup: the engine's TensorParallel (engine/tensor_parallel.h)
// over a Communicator — the tp group of a rank's mesh. The first failure is
// kept for status() and later calls do nothing (the communicator is
// poisoned then anyway), so a pass finishes on stale numbers and the
// trainer reports the error after the step (Finish). Counts the bytes it
// sent (ring model: 2·(tp−1)/tp of each all-reduce's bytes, (tp−1)/tp of an
// all-gather's or reduce-scatter's whole buffer).
//
// Two kinds of group, after the communicator's device_memory():
//   host memory (Gloo)    each call waits for its collective: the engine
//                         needs the result to go on;
//   device memory (NCCL)  each call returns at once: the collective waits on
//                         the device for the work queued so far on the
//                         compute stream of set_device()'s device (an event,
//                         OpArgs::after) and that stream's later work waits
//                         for the collective (Work::BlockStream). Errors
//                         arrive later: Finish() waits for what is in
//                         flight and returns the first.
// Not thread-safe: the engine's one caller.
#ifndef SHARDTRAIN_WORKER_PARALLEL_TENSOR_PARALLEL_GROUP_H_
#define SHARDTRAIN_WORKER_PARALLEL_TENSOR_PARALLEL_GROUP_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "worker/comm/communicator.h"
#include "worker/engine/device.h"
#include "worker/engine/tensor_parallel.h"
#include "worker/parallel/data_parallel.h"

namespace shardtrain::parallel {

class TensorParallelGroup final : public engine::TensorParallel {
 public:
  // comm: not owned, must outlive this.
  explicit TensorParallelGroup(comm::Communicator* comm) : comm_(comm) {}
  ~TensorParallelGroup() override { Finish().IgnoreError(); }

  // The device whose compute stream orders a device-memory group's
  // collectives (the engine's; not owned). Required before the first call
  // on such a group (FAILED_PRECONDITION through status() otherwise).
  void set_device(engine::Device* device) { device_ = device; }

  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }
  bool device_memory() const override { return comm_->device_memory(); }
  void AllReduceSum(float* data, size_t count) override {
    AllReduce(data, count, comm::ReduceOp::kSum);
  }
  void AllReduceMax(float* data, size_t count) override {
    AllReduce(data, count, comm::ReduceOp::kMax);
  }
  void AllGather(const float* local, float* full, size_t count) override;
  void ReduceScatterSum(const float* full, float* local, size_t count) override;
  absl::Status status() const override { return status_; }

  // Waits for the collectives in flight (a device-memory group's) and
  // returns status(), now including their errors.
  absl::Status Finish();

  // Bytes sent since the last call, and the collectives issued.
  int64_t TakeBytes() {
    const int64_t b = bytes_;
    bytes_ = 0;
    return b;
  }
  int64_t calls() const { return calls_; }

 private:
  void AllReduce(float* data, size_t count, comm::ReduceOp op);
  // Counts `bytes`, submits the op (submit(after)) and orders it as the
  // group's kind says (see the class comment).
  void Run(int64_t bytes,
           const std::function<std::shared_ptr<comm::Work>(const engine::Event*)>& submit);

  comm::Communicator* const comm_;
  engine::Device* device_ = nullptr;
  absl::Status status_;
  int64_t bytes_ = 0, calls_ = 0;
  StreamOrderedOps ordered_;  // a device-memory group's collectives in flight
};

}  // namespace shardtrain::parallel

#endif  // SHARDTRAIN_WORKER_PARALLEL_TENSOR_PARALLEL_GROUP_H_
