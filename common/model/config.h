// The GPT model's shape: the pure model spec shared by the job spec, the
// planner, every engine, checkpoints and the weights file.
//
// Shape letters used throughout the code base (as in llm.c):
//   B  batch (sequences per micro-batch)     T  sequence length (<= context)
//   C  channels (dim)                        NH attention heads, hs = C / NH
//   L  layers                                V  vocab, Vp padded vocab
#ifndef SHARDTRAIN_COMMON_MODEL_CONFIG_H_
#define SHARDTRAIN_COMMON_MODEL_CONFIG_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace shardtrain::model {

struct ModelConfig {
  int layers = 0;        // L
  int heads = 0;         // NH
  int dim = 0;           // C
  int context = 0;       // maximum sequence length (rows of wpe)
  int vocab = 0;         // V: real tokens
  int padded_vocab = 0;  // Vp: rows of wte; see PaddedVocab()
};

// Vp for a vocabulary of `vocab` tokens (llm.c style): rounded up to a
// multiple of 128 when vocab > 256, else to a multiple of 64. Padded logits
// are never computed into the softmax or the loss, and padded wte rows stay 0.
int PaddedVocab(int vocab);

// Fills padded_vocab and validates: every field >= 1, dim % heads == 0.
// Returns InvalidArgument naming the offending field the way a job spec
// does ("model.heads: must be >= 1, got 0", "model.dim: 10 is not divisible
// by model.heads: 4").
absl::StatusOr<ModelConfig> MakeGptConfig(int layers, int heads, int dim, int context, int vocab);

// Validates an already filled config (including padded_vocab ==
// PaddedVocab(vocab)).
absl::Status ValidateModelConfig(const ModelConfig& config);

// Named presets, the one table of them: "gpt2-124m" (12/12/768/1024/50257),
// "gpt2-350m", "gpt2-774m", "gpt2-1558m". NotFound otherwise, listing the
// known names.
absl::StatusOr<ModelConfig> ModelPreset(const std::string& name);
// Their names, in the table's order.
std::vector<std::string> ModelPresetNames();

bool operator==(const ModelConfig& a, const ModelConfig& b);
inline bool operator!=(const ModelConfig& a, const ModelConfig& b) { return !(a == b); }
std::string ToString(const ModelConfig& config);

}  // namespace shardtrain::model

#endif  // SHARDTRAIN_COMMON_MODEL_CONFIG_H_
