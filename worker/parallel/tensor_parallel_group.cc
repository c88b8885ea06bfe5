#include "worker/parallel/tensor_parallel_group.h"

#include "worker/parallel/data_parallel.h"

namespace shardtrain::parallel {

void TensorParallelGroup::AllReduce(float* data, size_t count, comm::ReduceOp op) {
  const int n = comm_->size();
  Run(static_cast<int64_t>(2.0 * (n - 1) / n * count * sizeof(float)),
      [&](const engine::Event* after) {
        return comm_->AllReduceAsync(data, count, comm::DataType::kFloat32, op, after);
      });
}

void TensorParallelGroup::AllGather(const float* local, float* full, size_t count) {
  Run(static_cast<int64_t>((comm_->size() - 1) * count * sizeof(float)),
      [&](const engine::Event* after) {
        return comm_->AllGatherAsync(local, full, count, comm::DataType::kFloat32, after);
      });
}

void TensorParallelGroup::ReduceScatterSum(const float* full, float* local, size_t count) {
  Run(static_cast<int64_t>((comm_->size() - 1) * count * sizeof(float)),
      [&](const engine::Event* after) {
        return comm_->ReduceScatterAsync(full, local, count, comm::DataType::kFloat32,
                                         comm::ReduceOp::kSum, after);
      });
}

void TensorParallelGroup::Run(
    int64_t bytes, const std::function<std::shared_ptr<comm::Work>(const engine::Event*)>& submit) {
  if (!status_.ok()) return;
  ++calls_;
  bytes_ += bytes;
  if (!comm_->device_memory()) {
    status_ = submit(nullptr)->Wait();
    return;
  }
  if (device_ == nullptr) {
    status_ = absl::FailedPreconditionError(
        "TensorParallelGroup: a device-memory group without the engine's device (set_device)");
    return;
  }
  status_ = ordered_.Run(*device_, submit);
}

absl::Status TensorParallelGroup::Finish() {
  status_ = ordered_.Finish(status_);
  return status_;
}

}  // namespace shardtrain::parallel
