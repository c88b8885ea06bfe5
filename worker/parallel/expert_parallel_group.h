// ExpertParallelGroup: the engine's ExpertParallel (engine/expert_parallel.h)
// over a Communicator — the ep group of a rank's mesh (Mesh::ep). The first
// failure is kept for status() and later calls do nothing. Counts the bytes
// it sent (every block but its own).
//
// Two kinds of group, after the communicator's device_memory(), as
// TensorParallelGroup's:
//   host memory (Gloo)    AllToAllV waits for its exchange: the engine
//                         needs the rows to go on;
//   device memory (NCCL)  AllToAllVDevice returns at once: the exchange
//                         waits on the device for the work queued so far on
//                         the compute stream of set_device()'s device, and
//                         that stream's later work waits for it. Errors
//                         arrive later: Finish() waits for what is in
//                         flight and returns the first.
// Not thread-safe: the engine's one caller.
#ifndef SHARDTRAIN_WORKER_PARALLEL_EXPERT_PARALLEL_GROUP_H_
#define SHARDTRAIN_WORKER_PARALLEL_EXPERT_PARALLEL_GROUP_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "worker/comm/communicator.h"
#include "worker/engine/device.h"
#include "worker/engine/expert_parallel.h"
#include "worker/parallel/data_parallel.h"

namespace shardtrain::parallel {

class ExpertParallelGroup final : public engine::ExpertParallel {
 public:
  // comm: not owned, must outlive this.
  explicit ExpertParallelGroup(comm::Communicator* comm) : comm_(comm) {}
  ~ExpertParallelGroup() override { Finish().IgnoreError(); }

  // The device whose compute stream orders a device-memory group's
  // exchanges (the engine's; not owned). Required before the first
  // AllToAllVDevice (FAILED_PRECONDITION through status() otherwise).
  void set_device(engine::Device* device) { device_ = device; }

  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }
  // Host memory: a host-memory group only (FAILED_PRECONDITION through
  // status() otherwise).
  void AllToAllV(const float* send, const std::vector<size_t>& send_counts, float* recv,
                 const std::vector<size_t>& recv_counts) override;
  void AllToAllVDevice(const void* send, const std::vector<size_t>& send_counts, void* recv,
                       const std::vector<size_t>& recv_counts, DataType dtype) override;
  absl::Status status() const override { return status_; }
  bool device_memory() const override { return comm_->device_memory(); }

  // Waits for the exchanges in flight (a device-memory group's) and
  // returns status(), now including their errors.
  absl::Status Finish();

  // Bytes sent since the last call.
  int64_t TakeBytes() {
    const int64_t b = bytes_;
    bytes_ = 0;
    return b;
  }

 private:
  void CountBytes(const std::vector<size_t>& send_counts, size_t element_bytes);

  comm::Communicator* const comm_;
  engine::Device* device_ = nullptr;
  absl::Status status_;
  int64_t bytes_ = 0;
  StreamOrderedOps ordered_;  // a device-memory group's exchanges in flight
};

}  // namespace shardtrain::parallel

#endif  // SHARDTRAIN_WORKER_PARALLEL_EXPERT_PARALLEL_GROUP_H_
