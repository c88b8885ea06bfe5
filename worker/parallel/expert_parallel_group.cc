#include "worker/parallel/expert_parallel_group.h"

namespace shardtrain::parallel {

void ExpertParallelGroup::AllToAllV(const float* send, const std::vector<size_t>& send_counts,
                                    float* recv, const std::vector<size_t>& recv_counts) {
  if (!status_.ok()) return;
  for (int p = 0; p < static_cast<int>(send_counts.size()); ++p) {
    if (p != comm_->rank()) bytes_ += static_cast<int64_t>(send_counts[p] * sizeof(float));
  }
  status_ = comm_->AllToAllV(send, send_counts, recv, recv_counts, comm::DataType::kFloat32);
}

}  // namespace shardtrain::parallel
