// ExpertParallelGroup: the engine's ExpertParallel (engine/expert_parallel.h)
// over a Communicator — the ep group of a rank's mesh (Mesh::ep). Each call
// waits for its all-to-all (the engine needs the rows to go on); the first
// failure is kept for status() and later calls do nothing. Counts the bytes
// it sent (every block but its own).
// Not thread-safe: the engine's one caller.
#ifndef SHARDTRAIN_WORKER_PARALLEL_EXPERT_PARALLEL_GROUP_H_
#define SHARDTRAIN_WORKER_PARALLEL_EXPERT_PARALLEL_GROUP_H_

#include <cstdint>
#include <vector>

#include "worker/comm/communicator.h"
#include "worker/engine/expert_parallel.h"

namespace shardtrain::parallel {

class ExpertParallelGroup final : public engine::ExpertParallel {
 public:
  // comm: not owned, must outlive this; host memory (Gloo).
  explicit ExpertParallelGroup(comm::Communicator* comm) : comm_(comm) {}

  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }
  void AllToAllV(const float* send, const std::vector<size_t>& send_counts, float* recv,
                 const std::vector<size_t>& recv_counts) override;
  absl::Status status() const override { return status_; }
  bool device_memory() const override { return comm_->device_memory(); }

  // Bytes sent since the last call.
  int64_t TakeBytes() {
    const int64_t b = bytes_;
    bytes_ = 0;
    return b;
  }

 private:
  comm::Communicator* const comm_;
  absl::Status status_;
  int64_t bytes_ = 0;
};

}  // namespace shardtrain::parallel

#endif  // SHARDTRAIN_WORKER_PARALLEL_EXPERT_PARALLEL_GROUP_H_
