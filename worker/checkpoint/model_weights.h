// The weights a job starts from (`model.init`): a shardtrain weights file,
// or Hugging Face's GPT-2 (hf_gpt2.h) or Llama (hf_llama.h) layout, as a
// source each rank reads its share of.
#ifndef SHARDTRAIN_WORKER_CHECKPOINT_MODEL_WEIGHTS_H_
#define SHARDTRAIN_WORKER_CHECKPOINT_MODEL_WEIGHTS_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/config.h"
#include "worker/checkpoint/safetensors.h"

namespace shardtrain::checkpoint {

// The whole model's parameters (ParamLayout(config) order), read a range at
// a time. Thread-compatible.
class WeightsSource {
 public:
  virtual ~WeightsSource() = default;
  // Elements [global, global + n) into out[0, n). OUT_OF_RANGE past the
  // model's end; the reader's errors (naming the file) otherwise.
  virtual absl::Status Read(size_t global, size_t n, float* out) = 0;
  // What the reads so far took from the files; all zero for a source read
  // whole when opened.
  virtual ReadStats Stats() const { return {}; }
};

// ReadStats as one line: "read 1.20 MiB of the checkpoint's 4.80 MiB of
// tensors (25.0%) from 2 of 3 files".
std::string ReadStatsText(const ReadStats& r);

// The whole model's weights for `config` at `path`: a safetensors file (or
// index) in GPT-2's or Llama's layout, as the config's family has it, a
// folder holding one (and config.json for Llama), or a shardtrain weights
// file of the same config. NOT_FOUND naming the path; INVALID_ARGUMENT
// naming the first mismatching tensor or config field; UNIMPLEMENTED for a
// layout the family has no reader of. GPT-2's safetensors and weights files
// are read whole; Llama's checkpoints range by range.
absl::StatusOr<std::unique_ptr<WeightsSource>> OpenModelWeights(const std::string& path,
                                                                const model::ModelConfig& config);

// All of them, in one vector (OpenModelWeights, then every element).
absl::StatusOr<std::vector<float>> LoadModelWeights(const std::string& path,
                                                    const model::ModelConfig& config);

}  // namespace shardtrain::checkpoint

#endif  // SHARDTRAIN_WORKER_CHECKPOINT_MODEL_WEIGHTS_H_
