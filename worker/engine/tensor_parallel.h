// TensorParallel: the collectives an engine needs inside a forward or
// backward pass under tensor parallelism (Megatron-LM), over the ranks that
// share one model slice's tp group; and Megatron's conjugate pairs as named
// functions, so each split layer says which side of the region it is on:
//
//   CopyToTpRegion      forward: identity (every rank has the whole input)
//                       backward: all-reduce of the input's gradient (each
//                       rank's column-parallel weights gave a partial sum)
//   ReduceFromTpRegion  forward: all-reduce of the partial outputs of a
//                       row-parallel layer (or the vocabulary-parallel
//                       embedding)
//                       backward: identity
//
// and, under sequence parallelism (each rank holds rows [r·n, (r+1)·n) of
// the activations outside the tp region), the pair that replaces them:
//
//   GatherFromSequenceRegion      forward: all-gather of every rank's rows
//                                 (the input of a column-parallel layer)
//                                 backward: reduce-scatter of the input's
//                                 gradient (partial sums) to each rank's rows
//   ReduceScatterToSequenceRegion forward: reduce-scatter of a row-parallel
//                                 layer's partial outputs to each rank's rows
//                                 backward: all-gather of the gradient
//
// An all-reduce is a reduce-scatter and an all-gather: the pair sends the
// same bytes as the one it replaces.
//
// The engine cannot return errors from inside a pass (Forward returns the
// loss), so an implementation keeps the first communication error, leaves
// the data as it was on failure (the pass finishes on stale numbers) and
// reports the error through status(); the caller (the trainer) checks it
// after every step, and the communicator is poisoned by then, so nothing
// waits. parallel/tensor_parallel_group.h implements it over a Communicator
// (of host memory, or of device memory: see device_memory()).
#ifndef SHARDTRAIN_WORKER_ENGINE_TENSOR_PARALLEL_H_
#define SHARDTRAIN_WORKER_ENGINE_TENSOR_PARALLEL_H_

#include <algorithm>
#include <cstddef>

#include "absl/status/status.h"

namespace shardtrain::engine {

// The rows of wte one tp rank holds: [v0, v0 + Vpt), of which `real`
// (< vocab) are tokens (the padded rows are never looked up or scored).
// Every engine's vocabulary-parallel ends (the embedding, the LM head, the
// cross-entropy) use it.
struct VocabShard {
  int v0 = 0, Vpt = 0, real = 0;
};
inline VocabShard VocabShardOf(int vocab, int padded_vocab, int tp, int tp_rank) {
  VocabShard v;
  v.Vpt = padded_vocab / tp;
  v.v0 = tp_rank * v.Vpt;
  v.real = std::clamp(vocab - v.v0, 0, v.Vpt);
  return v;
}

class TensorParallel {
 public:
  virtual ~TensorParallel() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place over the group, every rank the same result.
  virtual void AllReduceSum(float* data, size_t count) = 0;
  virtual void AllReduceMax(float* data, size_t count) = 0;
  // full[count · size()] = every rank's local[count], rank r's at r·count.
  virtual void AllGather(const float* local, float* full, size_t count) = 0;
  // local[count] = the sum over ranks of their full[rank·count, +count).
  virtual void ReduceScatterSum(const float* full, float* local, size_t count) = 0;
  // OK, or the first error of an all-reduce.
  virtual absl::Status status() const = 0;
  // Where the buffers of the calls above live: false, host memory (Gloo; a
  // GPU engine stages its data through the host); true, the engine's device
  // memory (NCCL), each collective ordered after the work already queued on
  // the engine's compute stream and that stream's later work after it,
  // without the host waiting.
  virtual bool device_memory() const { return false; }
};

// A null group means tp = 1: every function below is then a no-op.
struct CopyToTpRegion {
  static void Forward(TensorParallel*, float*, size_t) {}
  static void Backward(TensorParallel* tp, float* dinput, size_t count) {
    if (tp != nullptr && tp->size() > 1) tp->AllReduceSum(dinput, count);
  }
};

struct ReduceFromTpRegion {
  static void Forward(TensorParallel* tp, float* output, size_t count) {
    if (tp != nullptr && tp->size() > 1) tp->AllReduceSum(output, count);
  }
  static void Backward(TensorParallel*, float*, size_t) {}
};

struct GatherFromSequenceRegion {
  static void Forward(TensorParallel* tp, const float* local, float* full, size_t count) {
    tp->AllGather(local, full, count);
  }
  static void Backward(TensorParallel* tp, const float* dfull, float* dlocal, size_t count) {
    tp->ReduceScatterSum(dfull, dlocal, count);
  }
};

struct ReduceScatterToSequenceRegion {
  static void Forward(TensorParallel* tp, const float* full, float* local, size_t count) {
    tp->ReduceScatterSum(full, local, count);
  }
  static void Backward(TensorParallel* tp, const float* dlocal, float* dfull, size_t count) {
    tp->AllGather(dlocal, dfull, count);
  }
};

}  // namespace shardtrain::engine

#endif  // SHARDTRAIN_WORKER_ENGINE_TENSOR_PARALLEL_H_
