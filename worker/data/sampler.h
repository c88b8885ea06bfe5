// Deterministic batch sampling, independent of the world size.
//
// Sample index i (a global counter) names one window of T + 1 consecutive
// tokens starting at Start(i) = uniform in [0, n - T - 1], a pure function
// of (seed, i) (splitmix64; windows are drawn with replacement).
// The global batch of step s is the G samples [s*G, (s+1)*G); rank r of W
// takes the contiguous slice of G/W samples starting at s*G + r*G/W, and its
// micro-batch m (of B samples) the B samples starting at that slice + m*B.
// So the union over ranks and micro-batches of a step's windows is the same
// set whatever W is: N-rank training sees exactly the 1-rank batch.
#ifndef SHARDTRAIN_WORKER_DATA_SAMPLER_H_
#define SHARDTRAIN_WORKER_DATA_SAMPLER_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/data/tokens.h"

namespace shardtrain::data {

class BatchSampler {
 public:
  // tokens must outlive the sampler and hold >= T + 1 tokens; global_batch
  // G >= 1. InvalidArgument otherwise.
  static absl::StatusOr<BatchSampler> Create(const TokenIds* tokens, uint64_t seed,
                                             int global_batch, int T);

  // Start offset of global sample `index`.
  int64_t Start(int64_t index) const;

  // Fills inputs and targets (B, T) with micro-batch `micro` of rank `rank`
  // in a world of `world` ranks at `step`: inputs = window[0..T),
  // targets = window[1..T]. Requires G % (world * B) == 0 and
  // 0 <= micro < G / (world * B) (InvalidArgument naming the numbers).
  absl::Status Fill(int64_t step, int micro, int rank, int world, int B, int* inputs,
                    int* targets) const;

  int global_batch() const { return G_; }
  int seq_len() const { return T_; }

 private:
  BatchSampler(const TokenIds* tokens, uint64_t seed, int G, int T)
      : tokens_(tokens), seed_(seed), G_(G), T_(T) {}
  const TokenIds* tokens_;
  uint64_t seed_;
  int G_, T_;
};

// Deterministic validation windows, independent of the world size and the
// step.
//
// An evaluation covers `count` windows of T + 1 consecutive tokens spread
// evenly over the tokens: window j starts at Start(j) = j · (n − T − 1) /
// (count − 1) (integer division; 0 when count = 1), so the first starts at
// the first token and the last ends at the last one (windows overlap when
// count · T exceeds n). Every evaluation uses the same windows, so the
// validation losses of a run are comparable step to step. Replica r of W
// takes the contiguous slice Share(count, r, W) of the window indices, so
// the union over replicas is the 1-rank set whatever W is.
class EvalSampler {
 public:
  // tokens must outlive the sampler and hold >= T + 1 tokens; count >= 1.
  // InvalidArgument otherwise.
  static absl::StatusOr<EvalSampler> Create(const TokenIds* tokens, int64_t count, int T);

  // Replica `rank` of `world`'s window indices [first, second):
  // [count·rank/W, count·(rank+1)/W), so shares differ by at most one window.
  static std::pair<int64_t, int64_t> Share(int64_t count, int rank, int world);

  // Start offset of window `index` (0 <= index < count).
  int64_t Start(int64_t index) const;

  // Fills inputs and targets (b, T) with windows [first, first + b):
  // inputs = window[0..T), targets = window[1..T]. InvalidArgument when the
  // range leaves [0, count) or b < 1.
  absl::Status Fill(int64_t first, int b, int* inputs, int* targets) const;

  int64_t count() const { return count_; }
  int seq_len() const { return T_; }

 private:
  EvalSampler(const TokenIds* tokens, int64_t count, int T)
      : tokens_(tokens), count_(count), T_(T) {}
  const TokenIds* tokens_;
  int64_t count_;
  int T_;
};

}  // namespace shardtrain::data

#endif  // SHARDTRAIN_WORKER_DATA_SAMPLER_H_
