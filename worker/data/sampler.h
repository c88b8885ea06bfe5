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
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace shardtrain::data {

class BatchSampler {
 public:
  // tokens must outlive the sampler and hold >= T + 1 tokens; global_batch
  // G >= 1. InvalidArgument otherwise.
  static absl::StatusOr<BatchSampler> Create(const std::vector<uint16_t>* tokens, uint64_t seed,
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
  BatchSampler(const std::vector<uint16_t>* tokens, uint64_t seed, int G, int T)
      : tokens_(tokens), seed_(seed), G_(G), T_(T) {}
  const std::vector<uint16_t>* tokens_;
  uint64_t seed_;
  int G_, T_;
};

}  // namespace shardtrain::data

#endif  // SHARDTRAIN_WORKER_DATA_SAMPLER_H_
