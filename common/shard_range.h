// The ZeRO split of one shard unit over a data-parallel group, and the order
// in which a micro-batch uses the units: the single definitions the workers
// (worker/parallel/zero.h) and the planner (common/planner.cc: the ranges a
// plan records, the ZeRO-3 gathered peak it predicts) share.
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
// Pure and header-only: common/ is below both users.
#ifndef SHARDTRAIN_COMMON_SHARD_RANGE_H_
#define SHARDTRAIN_COMMON_SHARD_RANGE_H_

#include <cstddef>
#include <vector>

namespace shardtrain::parallel {

struct ShardRange {
  size_t begin = 0, end = 0;  // within the unit
  size_t size() const { return end - begin; }
};

// With align > 1, S is rounded down to a multiple of align (8-bit AdamW
// state: every shard but the last holds whole blocks), the last rank taking
// the rest. Precondition: dp >= 1, 0 <= rank < dp, align >= 1.
inline ShardRange UnitShardRange(size_t numel, int dp, int rank, size_t align = 1) {
  const size_t s = numel / static_cast<size_t>(dp) / align * align;
  ShardRange r;
  r.begin = s * static_cast<size_t>(rank);
  r.end = rank == dp - 1 ? numel : r.begin + s;
  return r;
}

// The units whose parameters one micro-batch reads, in the order
// ModelEngine::set_param_hook reports them: forward embeddings (encoder), the
// blocks in order, final (the final norm; with an untied LM head also the
// head), embeddings (a tied LM head, which reads wte); backward embeddings
// (a tied LM head), final, the blocks in reverse (the encoder's backward
// reads no parameter). Units < 0 are absent (a pipeline stage holding no
// embeddings or final norm) and skipped. *forward_uses (if not null) gets
// the number of forward uses.
inline std::vector<int> UnitUseOrder(int embeddings, const std::vector<int>& blocks, int final_unit,
                                     bool tied_head, size_t* forward_uses) {
  std::vector<int> uses;
  auto add = [&uses](int u) {
    if (u >= 0) uses.push_back(u);
  };
  add(embeddings);
  for (int b : blocks) add(b);
  add(final_unit);
  if (tied_head) add(embeddings);
  if (forward_uses != nullptr) *forward_uses = uses.size();
  if (tied_head) add(embeddings);
  add(final_unit);
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) add(*it);
  return uses;
}

}  // namespace shardtrain::parallel

#endif  // SHARDTRAIN_COMMON_SHARD_RANGE_H_
