// Autoregressive text generation with any engine.
#ifndef SHARDTRAIN_WORKER_ENGINE_GENERATE_H_
#define SHARDTRAIN_WORKER_ENGINE_GENERATE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/engine/engine.h"

namespace shardtrain::engine {

struct GenerateOptions {
  int max_new_tokens = 64;
  // 0: greedy (argmax). > 0: sample from softmax(logits / temperature).
  float temperature = 0.0f;
  // Sampling seed; the output is a pure function of (weights, prompt,
  // options).
  uint64_t seed = 0;
  // > 0: only tokens [0, candidates) are generated (a byte-tokenized model
  // with a larger vocabulary, say GPT-2's 50257, samples bytes only).
  int candidates = 0;
};

// Returns prompt + up to max_new_tokens generated tokens. Uses row 0 of the
// model's buffers; when the sequence outgrows model.max_seq_len() only the
// last max_seq_len() tokens are fed (sliding window). InvalidArgument for an
// empty prompt or a token outside [0, vocab). Overwrites the model's
// activations (not its parameters or gradients).
absl::StatusOr<std::vector<int>> Generate(Engine& model, const std::vector<int>& prompt,
                                          const GenerateOptions& options);

}  // namespace shardtrain::engine

#endif  // SHARDTRAIN_WORKER_ENGINE_GENERATE_H_
