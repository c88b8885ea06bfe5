// ShardedOptimizer: the ZeRO-1/2 optimizer step of data parallelism.
//
//   ZeRO stage 1: every rank keeps the full params and grads but AdamW state
//                 (m, v) only for its shard; gradients are all-reduced.
//   ZeRO stage 2: as stage 1, but gradients are reduce-scattered: a rank
//                 receives (and uses) only its shard's gradient sum.
//   Both:         each rank steps AdamW on its shard, then the updated params
//                 are all-gathered so every rank again holds the full params.
//
// Sharding of the flat buffer [0, N) over dp ranks (N = layout.num_params()):
//   S = floor(N / dp), R = N % dp (R < dp).
//   Rank r < dp - 1 owns [r*S, (r+1)*S); rank dp - 1 owns [(dp-1)*S, N), i.e.
//   S + R elements. The collectives that need equal per-rank counts
//   (ReduceScatter, AllGather) run on the body [0, dp*S) with count S; the
//   R-element tail [dp*S, N), owned by the last rank, travels by an AllReduce
//   (stage 2) and a Broadcast from the last rank (after the step). This is
//   the "pad to a multiple of dp" split without the padding: padding would
//   need a contiguous copy of the whole gradient (and parameter) buffer with
//   zeros appended, since the model's buffers have no spare capacity; the
//   tail costs two tiny extra ops instead (none when N % dp == 0).
//   The only scratch is one buffer of shard_size() floats, allocated in
//   Create(): stage 2's reduced gradient shard, and (both stages) the input of
//   the all-gather (the own block of params, copied so that input and output
//   never alias).
//
// Collective: Step() issues the same ops in the same order on every rank of
// the dp group. Thread-compatible (one thread at a time; the communicator's
// own contract applies).
#ifndef SHARDTRAIN_WORKER_PARALLEL_SHARDED_OPTIMIZER_H_
#define SHARDTRAIN_WORKER_PARALLEL_SHARDED_OPTIMIZER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/comm/communicator.h"
#include "worker/model/param_layout.h"
#include "worker/model/thread_pool.h"
#include "worker/optim/adamw.h"

namespace shardtrain::parallel {

// The range of the flat buffer rank `rank` of `dp` owns under the split above.
// Precondition: dp >= 1, 0 <= rank < dp.
struct ShardRange {
  size_t begin = 0, end = 0;
  size_t size() const { return end - begin; }
};
ShardRange ZeroShardRange(size_t num_params, int dp, int rank);

class ShardedOptimizer {
 public:
  // stage: 1 or 2 (InvalidArgument otherwise). comm: the dp group (any size
  // >= 1); nullptr means dp = 1 (no collectives). layout, comm and pool must
  // outlive the optimizer; pool may be null (serial).
  static absl::StatusOr<std::unique_ptr<ShardedOptimizer>> Create(
      int stage, const model::ParamLayout& layout, const optim::AdamWOptions& options,
      comm::Communicator* comm, model::ThreadPool* pool);

  // One optimizer step. Collective over the dp group.
  // Preconditions: params and grads hold the whole flat buffer (N elements);
  // params are identical on every rank; grads hold this rank's gradient
  // (already scaled for gradient accumulation, NOT averaged over dp).
  // Averages the gradient over dp (stage 1: all-reduce of the whole buffer;
  // stage 2: reduce-scatter), clips it by its global L2 norm when
  // max_norm > 0 and norm > max_norm (scale max_norm / (norm + 1e-6), as
  // optim::ClipGradNorm), steps AdamW with `lr` on this rank's shard and
  // all-gathers the params. Returns the global gradient norm before clipping,
  // identical on every rank (each rank's shard sum of squares in double is
  // all-gathered and summed in rank order).
  // Afterwards params are identical on every rank; grads' contents are
  // unspecified (the caller zeroes them before the next backward).
  // Errors: InvalidArgument (buffer sizes); any communicator error
  // (DEADLINE_EXCEEDED, ABORTED, FAILED_PRECONDITION), after which params and
  // the optimizer state are unspecified and training must restore a checkpoint.
  absl::StatusOr<double> Step(absl::Span<float> params, absl::Span<float> grads, float lr,
                              float max_norm);

  int stage() const { return stage_; }
  int dp() const { return dp_; }
  int rank() const { return rank_; }
  // This rank's shard [shard_begin(), shard_end()) of the flat buffer; the
  // range a checkpoint shard of this rank holds (params, m, v).
  size_t shard_begin() const { return range_.begin; }
  size_t shard_end() const { return range_.end; }
  size_t shard_size() const { return range_.size(); }
  // AdamW over exactly the shard: m()/v() index i is flat shard_begin() + i;
  // step() / set_step() is the optimizer step counter (same on every rank).
  optim::AdamW& adamw() { return adamw_; }
  const optim::AdamW& adamw() const { return adamw_; }
  // Bytes of optimizer state (m and v, fp32) this rank holds: 8 * shard_size().
  int64_t optimizer_bytes() const { return int64_t(8) * int64_t(range_.size()); }
  // Bytes this rank sends per Step() in the ring algorithms' model, for
  // accounting (stage 1: all-reduce 2 (dp-1)/dp of N; stage 2: reduce-scatter
  // (dp-1)/dp of N; both: all-gather (dp-1)/dp of N; the tail ops are ignored).
  int64_t comm_bytes_per_step() const;

 private:
  ShardedOptimizer(int stage, size_t num_params, int dp, int rank, comm::Communicator* comm,
                   model::ThreadPool* pool, optim::AdamW adamw);
  // Sum over ranks of `local` (squared norms), in rank order; identical on
  // every rank.
  absl::StatusOr<double> SumOverRanks(double local);

  const int stage_;
  const size_t num_params_;
  const int dp_, rank_;
  const size_t body_count_;  // S: elements per rank in the equal-count collectives
  const ShardRange range_;
  comm::Communicator* const comm_;  // null when dp == 1
  model::ThreadPool* const pool_;
  optim::AdamW adamw_;
  std::vector<float> shard_scratch_;  // shard_size() floats
  std::vector<float> norm_scratch_;   // 2 * dp floats: each rank's double, bitwise
};

}  // namespace shardtrain::parallel

#endif  // SHARDTRAIN_WORKER_PARALLEL_SHARDED_OPTIMIZER_H_
