// The vocabulary-parallel ends of the model (Megatron-LM): each tp rank
// holds rows [v0, v0 + Vpt) of wte (Vpt = Vp / tp), so
//   - the embedding looks up the tokens in its rows (zero for the others)
//     and the partial embeddings are summed over tp (ReduceFromTpRegion);
//   - the LM head's logits are split by columns, and the softmax
//     cross-entropy never gathers them: the row maxima (all-reduce max), the
//     sums of exponentials and the target logits (all-reduce sums) are the
//     only values exchanged, BT floats each.
// With one rank (tp null) the results equal layers.h's EncoderForward and
// CrossEntropyForward.
#ifndef SHARDTRAIN_WORKER_ENGINE_CPU_VOCAB_PARALLEL_H_
#define SHARDTRAIN_WORKER_ENGINE_CPU_VOCAB_PARALLEL_H_

#include "worker/engine/tensor_parallel.h"
#include "worker/engine/thread_pool.h"

namespace shardtrain::engine::cpu {

using engine::VocabShard;  // tensor_parallel.h
using engine::VocabShardOf;

// out (N·C) = wte[tok] (this rank's rows, summed over tp) + wpe[t] (wpe may
// be null: no learned positions).
// Sequence parallelism (`local` given): out holds the partial sums only, and
// local (N/tp · C) this tp rank's rows [rank·N/tp, +N/tp) of the result
// (ReduceScatterToSequenceRegion; tp divides N). pos (T): each column's
// position in its sequence (context parallelism; null: t).
void VocabParallelEncoderForward(float* out, const int* tokens, const float* wte_shard,
                                 const float* wpe, int B, int T, int C, const VocabShard& v,
                                 TensorParallel* tp, ThreadPool* pool, float* local = nullptr,
                                 const int* pos = nullptr);
// dwte_shard[tok - v0] += dout for this rank's tokens; dwpe[t] += dout (dwpe
// may be null).
void VocabParallelEncoderBackward(float* dwte_shard, float* dwpe, const float* dout,
                                  const int* tokens, int B, int T, int C, const VocabShard& v,
                                  const int* pos = nullptr);

// logits: (N, Vpt) this rank's columns (the first v.real computed). Writes
// lse[r] (the log-sum-exp over the whole vocabulary) and, with targets,
// losses[r] = lse[r] - logit[target]: identical on every tp rank.
void VocabParallelCrossEntropyForward(float* losses, float* lse, const float* logits,
                                      const int* targets, int N, const VocabShard& v,
                                      TensorParallel* tp, ThreadPool* pool);
// In place: logits become dloss · (softmax - onehot(target)) on this rank's
// columns.
void VocabParallelCrossEntropyBackward(float* logits, const float* lse, const int* targets,
                                       float dloss, int N, const VocabShard& v, ThreadPool* pool);

}  // namespace shardtrain::engine::cpu

#endif  // SHARDTRAIN_WORKER_ENGINE_CPU_VOCAB_PARALLEL_H_
