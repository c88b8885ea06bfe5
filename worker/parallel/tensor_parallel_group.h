// TensorParallelGroup: the engine's TensorParallel (engine/tensor_parallel.h)
// over a Communicator — the tp group of a rank's mesh. All-reduces are
// synchronous (the engine needs their result to go on); the first failure
// is kept for status() and later calls do nothing (the communicator is
// poisoned then anyway), so a pass finishes on stale numbers and the
// trainer reports the error after the step. Counts the bytes it sent (ring
// model: 2·(tp−1)/tp of each all-reduce's bytes, (tp−1)/tp of an
// all-gather's or reduce-scatter's whole buffer).
// Not thread-safe: the engine's one caller.
#ifndef SHARDTRAIN_WORKER_PARALLEL_TENSOR_PARALLEL_GROUP_H_
#define SHARDTRAIN_WORKER_PARALLEL_TENSOR_PARALLEL_GROUP_H_

#include <cstdint>

#include "worker/comm/communicator.h"
#include "worker/engine/tensor_parallel.h"

namespace shardtrain::parallel {

class TensorParallelGroup final : public engine::TensorParallel {
 public:
  // comm: not owned, must outlive this.
  explicit TensorParallelGroup(comm::Communicator* comm) : comm_(comm) {}

  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }
  void AllReduceSum(float* data, size_t count) override {
    AllReduce(data, count, comm::ReduceOp::kSum);
  }
  void AllReduceMax(float* data, size_t count) override {
    AllReduce(data, count, comm::ReduceOp::kMax);
  }
  void AllGather(const float* local, float* full, size_t count) override {
    if (!status_.ok()) return;
    ++calls_;
    bytes_ += static_cast<int64_t>((comm_->size() - 1) * count * sizeof(float));
    status_ = comm_->AllGather(local, full, count, comm::DataType::kFloat32);
  }
  void ReduceScatterSum(const float* full, float* local, size_t count) override {
    if (!status_.ok()) return;
    ++calls_;
    bytes_ += static_cast<int64_t>((comm_->size() - 1) * count * sizeof(float));
    status_ =
        comm_->ReduceScatter(full, local, count, comm::DataType::kFloat32, comm::ReduceOp::kSum);
  }
  absl::Status status() const override { return status_; }

  // Bytes sent since the last call, and the all-reduces issued.
  int64_t TakeBytes() {
    const int64_t b = bytes_;
    bytes_ = 0;
    return b;
  }
  int64_t calls() const { return calls_; }

 private:
  void AllReduce(float* data, size_t count, comm::ReduceOp op) {
    if (!status_.ok()) return;
    ++calls_;
    const int n = comm_->size();
    bytes_ += static_cast<int64_t>(2.0 * (n - 1) / n * count * sizeof(float));
    status_ = comm_->AllReduce(data, count, comm::DataType::kFloat32, op);
  }

  comm::Communicator* const comm_;
  absl::Status status_;
  int64_t bytes_ = 0, calls_ = 0;
};

}  // namespace shardtrain::parallel

#endif  // SHARDTRAIN_WORKER_PARALLEL_TENSOR_PARALLEL_GROUP_H_
