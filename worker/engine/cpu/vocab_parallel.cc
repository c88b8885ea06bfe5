#include "worker/engine/cpu/vocab_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace shardtrain::engine::cpu {

void VocabParallelEncoderForward(float* out, const int* tokens, const float* wte_shard,
                                 const float* wpe, int B, int T, int C, const VocabShard& v,
                                 TensorParallel* tp, ThreadPool* pool, float* local,
                                 const int* pos) {
  const int64_t N = int64_t{B} * T;
  ParallelFor(pool, N, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int row = tokens[r] - v.v0;
      float* o = out + r * C;
      if (row >= 0 && row < v.real) {
        std::memcpy(o, wte_shard + int64_t{row} * C, sizeof(float) * C);
      } else {
        std::memset(o, 0, sizeof(float) * C);
      }
    }
  });
  // One rank holds each token's row: the sum is that row, exactly.
  int64_t first = 0, rows = N;  // the rows of the result this rank holds
  if (local == nullptr) {
    ReduceFromTpRegion::Forward(tp, out, static_cast<size_t>(N) * C);
  } else {
    rows = N / tp->size();
    first = rows * tp->rank();
    ReduceScatterToSequenceRegion::Forward(tp, out, local, static_cast<size_t>(rows) * C);
    out = local;
  }
  if (wpe == nullptr) return;  // no learned positions
  ParallelFor(pool, rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t t = (first + r) % T;
      const float* p = wpe + (pos == nullptr ? t : pos[t]) * C;
      float* o = out + r * C;
      for (int c = 0; c < C; ++c) o[c] += p[c];
    }
  });
}

void VocabParallelEncoderBackward(float* dwte_shard, float* dwpe, const float* dout,
                                  const int* tokens, int B, int T, int C, const VocabShard& v,
                                  const int* pos) {
  for (int64_t r = 0; r < int64_t{B} * T; ++r) {
    const float* d = dout + r * C;
    if (dwpe != nullptr) {
      const int64_t t = r % T;
      float* dp = dwpe + (pos == nullptr ? t : pos[t]) * C;
      for (int c = 0; c < C; ++c) dp[c] += d[c];
    }
    const int row = tokens[r] - v.v0;
    if (row < 0 || row >= v.real) continue;
    float* de = dwte_shard + int64_t{row} * C;
    for (int c = 0; c < C; ++c) de[c] += d[c];
  }
}

void VocabParallelCrossEntropyForward(float* losses, float* lse, const float* logits,
                                      const int* targets, int N, const VocabShard& v,
                                      TensorParallel* tp, ThreadPool* pool) {
  // lse: the row maxima, then the log-sum-exp; losses: the sums of
  // exponentials, then the target logits, then the losses.
  ParallelFor(pool, N, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* l = logits + r * v.Vpt;
      float m = -std::numeric_limits<float>::infinity();
      for (int j = 0; j < v.real; ++j) m = std::max(m, l[j]);
      lse[r] = m;
    }
  });
  if (tp != nullptr && tp->size() > 1) tp->AllReduceMax(lse, N);
  ParallelFor(pool, N, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* l = logits + r * v.Vpt;
      float sum = 0;
      for (int j = 0; j < v.real; ++j) sum += std::exp(l[j] - lse[r]);
      losses[r] = sum;
    }
  });
  if (tp != nullptr && tp->size() > 1) tp->AllReduceSum(losses, N);
  for (int r = 0; r < N; ++r) lse[r] += std::log(losses[r]);
  if (targets == nullptr) return;
  for (int r = 0; r < N; ++r) {
    const int j = targets[r] - v.v0;
    losses[r] = j >= 0 && j < v.real ? logits[int64_t{r} * v.Vpt + j] : 0.0f;
  }
  if (tp != nullptr && tp->size() > 1) tp->AllReduceSum(losses, N);
  for (int r = 0; r < N; ++r) losses[r] = lse[r] - losses[r];
}

void VocabParallelCrossEntropyBackward(float* logits, const float* lse, const int* targets,
                                       float dloss, int N, const VocabShard& v, ThreadPool* pool) {
  ParallelFor(pool, N, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* l = logits + r * v.Vpt;
      for (int j = 0; j < v.real; ++j) l[j] = std::exp(l[j] - lse[r]) * dloss;
      const int t = targets[r] - v.v0;
      if (t >= 0 && t < v.real) l[t] -= dloss;
    }
  });
}

}  // namespace shardtrain::engine::cpu
