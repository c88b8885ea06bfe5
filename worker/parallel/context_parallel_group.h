// ContextParallelGroup: the engine's ContextParallel (engine/context_parallel.h)
// over a Communicator — the cp group of a rank's mesh. A ring pass is one
// SendRecv op (send to rank + 1, receive from rank − 1, posted together, so
// a ring of them cannot wait in a cycle), submitted at StartRingPass and
// waited for at FinishRingPass: the transfer runs on the communicator's op
// thread while the engine computes the block in hand. The first failure is
// kept for status() and later calls do nothing (the communicator is
// poisoned then anyway). Counts the bytes it sent.
//
// Two kinds of group, after the communicator's device_memory() (as
// TensorParallelGroup's):
//   host memory (Gloo)    FinishRingPass waits for the pass (a GPU engine
//                         stages its blocks through the host around it);
//   device memory (NCCL)  the pass waits on the device for the work queued
//                         so far on the compute stream of set_device()'s
//                         device (OpArgs::after), and FinishRingPass makes
//                         that stream's later work wait for the pass
//                         (Work::BlockStream): the host never waits.
//                         Errors arrive later: Finish() waits for what is
//                         in flight and returns the first.
// Not thread-safe: the engine's one caller.
#ifndef SHARDTRAIN_WORKER_PARALLEL_CONTEXT_PARALLEL_GROUP_H_
#define SHARDTRAIN_WORKER_PARALLEL_CONTEXT_PARALLEL_GROUP_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "worker/comm/communicator.h"
#include "worker/engine/context_parallel.h"
#include "worker/engine/device.h"

namespace shardtrain::parallel {

class ContextParallelGroup final : public engine::ContextParallel {
 public:
  // comm: not owned, must outlive this.
  explicit ContextParallelGroup(comm::Communicator* comm) : comm_(comm) {}
  ~ContextParallelGroup() override {
    FinishRingPass();
    Finish().IgnoreError();
  }

  // The device whose compute stream orders a device-memory group's passes
  // (the engine's; not owned). Required before the first pass on such a
  // group (FAILED_PRECONDITION through status() otherwise).
  void set_device(engine::Device* device) { device_ = device; }

  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }
  bool device_memory() const override { return comm_->device_memory(); }
  void StartRingPass(const void* send, void* recv, size_t count, DataType dtype) override;
  void FinishRingPass() override;
  absl::Status status() const override { return status_; }
  // Waits for the passes a device-memory group ordered on the device and
  // returns status(), now including their errors.
  absl::Status Finish();

  // Bytes sent since the last call, and the passes made.
  int64_t TakeBytes() {
    const int64_t b = bytes_;
    bytes_ = 0;
    return b;
  }
  int64_t passes() const { return passes_; }

 private:
  comm::Communicator* const comm_;
  engine::Device* device_ = nullptr;
  std::shared_ptr<comm::Work> in_flight_;
  // Device memory: passes ordered on the device, not known to be done, and
  // the events they wait for.
  std::vector<std::shared_ptr<comm::Work>> ordered_;
  std::vector<std::unique_ptr<engine::Event>> events_;
  absl::Status status_;
  int64_t bytes_ = 0, passes_ = 0;
};

}  // namespace shardtrain::parallel

#endif  // SHARDTRAIN_WORKER_PARALLEL_CONTEXT_PARALLEL_GROUP_H_
