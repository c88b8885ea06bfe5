// ContextParallel: what an engine needs inside a forward or backward pass
// under context parallelism — each sequence split over the cp ranks of a
// group (common/model/slice.h: ContextChunkPositions), attention computed
// as a ring (Liu et al., "Ring Attention"; Megatron-LM's context
// parallelism): each rank's key/value block travels around the group while
// every rank attends its own queries to the block it holds, and the partial
// results merge by their logsumexp (engine/model_engine.h). Backward passes
// the blocks around again with their gradients, which arrive back at their
// owner after a full turn.
//
// One pass of the ring: every rank sends a buffer to the next rank, (rank +
// 1) % size, and receives the previous rank's, at once (no rank sends
// before receiving: a ring of blocking sends would wait in a cycle). A pass
// is started before the block in hand is computed and finished after it,
// so the transfer overlaps the arithmetic.
//
// Errors follow TensorParallel's rule (engine/tensor_parallel.h): the first
// is kept for status(), the pass finishes on stale numbers, the trainer
// reports the error after the step, and the communicator is poisoned by
// then so nothing waits. parallel/context_parallel_group.h implements it
// over a Communicator of host memory.
#ifndef SHARDTRAIN_WORKER_ENGINE_CONTEXT_PARALLEL_H_
#define SHARDTRAIN_WORKER_ENGINE_CONTEXT_PARALLEL_H_

#include <cstddef>

#include "absl/status/status.h"
#include "common/dtype.h"

namespace shardtrain::engine {

class ContextParallel {
 public:
  virtual ~ContextParallel() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Whether the passes move device memory (NCCL) — else host memory, which
  // a GPU engine stages its buffers through.
  virtual bool device_memory() const { return false; }
  // Starts one pass: send[count] to the next rank, recv[count] from the
  // previous one, elements of `dtype` (the engine's compute type). The
  // buffers stay untouched by the caller until FinishRingPass. One pass at
  // a time.
  virtual void StartRingPass(const void* send, void* recv, size_t count, DataType dtype) = 0;
  // Waits for the pass in flight (none: returns at once).
  virtual void FinishRingPass() = 0;
  // OK, or the first error of a pass.
  virtual absl::Status status() const = 0;
};

}  // namespace shardtrain::engine

#endif  // SHARDTRAIN_WORKER_ENGINE_CONTEXT_PARALLEL_H_
