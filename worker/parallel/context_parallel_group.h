// ContextParallelGroup: the engine's ContextParallel (engine/context_parallel.h)
// over a Communicator — the cp group of a rank's mesh. A ring pass is one
// SendRecv op (send to rank + 1, receive from rank − 1, posted together, so
// a ring of them cannot wait in a cycle), submitted at StartRingPass and
// waited for at FinishRingPass: the transfer runs on the communicator's op
// thread while the engine computes the block in hand. The first failure is
// kept for status() and later calls do nothing (the communicator is
// poisoned then anyway). Counts the bytes it sent.
//
// Host memory (Gloo) only so far: a group of device memory fails its first
// pass with FAILED_PRECONDITION (the trainer refuses cp on a GPU before).
// Not thread-safe: the engine's one caller.
#ifndef SHARDTRAIN_WORKER_PARALLEL_CONTEXT_PARALLEL_GROUP_H_
#define SHARDTRAIN_WORKER_PARALLEL_CONTEXT_PARALLEL_GROUP_H_

#include <cstdint>
#include <memory>

#include "worker/comm/communicator.h"
#include "worker/engine/context_parallel.h"

namespace shardtrain::parallel {

class ContextParallelGroup final : public engine::ContextParallel {
 public:
  // comm: not owned, must outlive this.
  explicit ContextParallelGroup(comm::Communicator* comm) : comm_(comm) {}
  ~ContextParallelGroup() override { FinishRingPass(); }

  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }
  void StartRingPass(const void* send, void* recv, size_t count, DataType dtype) override;
  void FinishRingPass() override;
  absl::Status status() const override { return status_; }

  // Bytes sent since the last call, and the passes made.
  int64_t TakeBytes() {
    const int64_t b = bytes_;
    bytes_ = 0;
    return b;
  }
  int64_t passes() const { return passes_; }

 private:
  comm::Communicator* const comm_;
  std::shared_ptr<comm::Work> in_flight_;
  absl::Status status_;
  int64_t bytes_ = 0, passes_ = 0;
};

}  // namespace shardtrain::parallel

#endif  // SHARDTRAIN_WORKER_PARALLEL_CONTEXT_PARALLEL_GROUP_H_
