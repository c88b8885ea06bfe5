#include "worker/parallel/expert_parallel_group.h"

#include "worker/parallel/data_parallel.h"

namespace shardtrain::parallel {

void ExpertParallelGroup::CountBytes(const std::vector<size_t>& send_counts, size_t element_bytes) {
  for (int p = 0; p < static_cast<int>(send_counts.size()); ++p) {
    if (p != comm_->rank()) bytes_ += static_cast<int64_t>(send_counts[p] * element_bytes);
  }
}

void ExpertParallelGroup::AllToAllV(const float* send, const std::vector<size_t>& send_counts,
                                    float* recv, const std::vector<size_t>& recv_counts) {
  if (!status_.ok()) return;
  if (comm_->device_memory()) {
    status_ = absl::FailedPreconditionError(
        "ExpertParallelGroup: host memory given to a device-memory group (AllToAllVDevice)");
    return;
  }
  CountBytes(send_counts, sizeof(float));
  status_ = comm_->AllToAllV(send, send_counts, recv, recv_counts, comm::DataType::kFloat32);
}

void ExpertParallelGroup::AllToAllVDevice(const void* send, const std::vector<size_t>& send_counts,
                                          void* recv, const std::vector<size_t>& recv_counts,
                                          DataType dtype) {
  if (!status_.ok()) return;
  if (!comm_->device_memory() || device_ == nullptr) {
    status_ = absl::FailedPreconditionError(
        comm_->device_memory()
            ? "ExpertParallelGroup: a device-memory group without the engine's device "
              "(set_device)"
            : "ExpertParallelGroup: device memory given to a host-memory group (AllToAllV)");
    return;
  }
  CountBytes(send_counts, DataTypeSize(dtype));
  status_ = ordered_.Run(*device_, [&](const engine::Event* after) {
    return comm_->AllToAllVAsync(send, send_counts, recv, recv_counts, dtype, after);
  });
}

absl::Status ExpertParallelGroup::Finish() {
  status_ = ordered_.Finish(status_);
  return status_;
}

}  // namespace shardtrain::parallel
