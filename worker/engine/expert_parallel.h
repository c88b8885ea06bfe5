// ExpertParallel: what the engine needs of its expert-parallel group
// (ModelEngineOptions::ep; parallel.ep): the ep ranks that split each MoE
// layer's experts, E / ep each (rank r holding experts [r·E/ep,
// (r+1)·E/ep)), exchanging the (token, slot) pairs routed to them: in host
// memory (Gloo; a GPU engine stages its rows through it), or, where
// device_memory() says so (NCCL), in the engine's device buffers, ordered
// on its compute stream (CudaModel::EpAllToAll).
// The first failure is kept for status() and later calls do nothing (the
// group is poisoned then), so a pass finishes on stale numbers and the
// trainer reports the error after the step.
// Not thread-safe: the engine's one caller.
#ifndef SHARDTRAIN_WORKER_ENGINE_EXPERT_PARALLEL_H_
#define SHARDTRAIN_WORKER_ENGINE_EXPERT_PARALLEL_H_

#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "common/dtype.h"

namespace shardtrain::engine {

class ExpertParallel {
 public:
  virtual ~ExpertParallel() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // send holds send_counts[p] floats for each rank p in rank order; recv
  // receives recv_counts[p] from each p in rank order (recv_counts[p] is
  // rank p's send_counts[this rank]). Zero counts are fine.
  virtual void AllToAllV(const float* send, const std::vector<size_t>& send_counts, float* recv,
                         const std::vector<size_t>& recv_counts) = 0;
  // The same of `dtype` elements in device memory, for a group whose
  // device_memory() is true; queued after the compute stream's work so
  // far, and that stream's later work waits for it (no host wait). Default:
  // a precondition failure through status() (a host-memory group).
  virtual void AllToAllVDevice(const void* send, const std::vector<size_t>& send_counts, void* recv,
                               const std::vector<size_t>& recv_counts, DataType dtype) = 0;
  virtual absl::Status status() const = 0;
  // Whether the group takes device memory (NCCL); host memory by default.
  virtual bool device_memory() const { return false; }
};

}  // namespace shardtrain::engine

#endif  // SHARDTRAIN_WORKER_ENGINE_EXPERT_PARALLEL_H_
