// The ZeRO split of one shard unit over a data-parallel group: the single
// definition the workers (worker/parallel/zero.h) and the planner
// (common/planner.cc, the ranges a plan records) share.
//
// A unit of n elements over dp ranks: S = floor(n / dp), R = n mod dp.
// Rank r < dp - 1 owns [r·S, (r+1)·S); rank dp - 1 owns [(dp-1)·S, n), i.e.
// S + R elements. The equal-count collectives (all-gather, reduce-scatter)
// run on the body [0, dp·S) with count S, straight on the model's buffers;
// the R-element tail (R < dp), owned by the last rank, travels by a broadcast
// from it (parameters) or an all-reduce (gradients). This is the usual
// "pad to a multiple of dp" split without the padding, which would need a
// padded copy of every unit for each collective; it costs at most dp - 1
// extra elements on the last rank, and two tiny ops only when R > 0.
//
// Header-only so that the planner library needs no worker code.
#ifndef SHARDTRAIN_WORKER_PARALLEL_SHARD_RANGE_H_
#define SHARDTRAIN_WORKER_PARALLEL_SHARD_RANGE_H_

#include <cstddef>

namespace shardtrain::parallel {

struct ShardRange {
  size_t begin = 0, end = 0;  // within the unit
  size_t size() const { return end - begin; }
};

// Precondition: dp >= 1, 0 <= rank < dp.
inline ShardRange UnitShardRange(size_t numel, int dp, int rank) {
  const size_t s = numel / static_cast<size_t>(dp);
  ShardRange r;
  r.begin = s * static_cast<size_t>(rank);
  r.end = rank == dp - 1 ? numel : r.begin + s;
  return r;
}

}  // namespace shardtrain::parallel

#endif  // SHARDTRAIN_WORKER_PARALLEL_SHARD_RANGE_H_
