// `shardtrain sample`: generate text from trained weights, with the byte
// tokenizer (vocab 256), GPT-2's (vocab >= 50257), Llama 3's (vocab >=
// 128256) or any tokenizer.json (common/tokenizers.h).
#ifndef SHARDTRAIN_CLIENT_SAMPLE_H_
#define SHARDTRAIN_CLIENT_SAMPLE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "client/commands.h"
#include "worker/checkpoint/weights_file.h"

namespace shardtrain::client {

struct SampleOptions {
  std::string checkpoint;  // a weights file, or a directory holding final.weights
  std::string prompt = "\n";
  int tokens = 200;          // new tokens to generate
  double temperature = 0.8;  // 0 = greedy
  uint64_t seed = 1;
  int threads = 1;
  std::string vocab;  // the named tokenizer's files (LoadTokenizer's path; searched when empty)
  std::string tokenizer = "auto";  // auto (by the vocabulary) | byte | gpt2 | llama3
  std::string tokenizer_json;      // any tokenizer.json (instead of --tokenizer)
};

int Sample(const GlobalFlags& g, const SampleOptions& o);

// Weights from a final.weights file, or from a sharded checkpoint: a step-N
// directory, or a checkpoint directory (final.weights if present, else its
// newest commit whose shards verify). *from gets the file or step directory
// read. NOT_FOUND when there is none; INVALID_ARGUMENT (a bad argument, exit
// 2) when what is there cannot be read as weights.
absl::StatusOr<checkpoint::LoadedWeights> LoadWeightsFrom(const std::string& path,
                                                          std::string* from);

struct ExportOptions {
  std::string source;  // as LoadWeightsFrom
  std::string format = "safetensors";
  std::string out;    // directory (created; must be empty or absent)
  std::string vocab;  // GPT-2's vocabulary folder, for the tokenizer files
  // Llama models only:
  std::string dtype = "fp32";          // fp32 | bf16
  std::string max_shard_size = "5GB";  // the largest safetensors file (ParseShardSize)
  std::string tokenizer_json;          // DIR/tokenizer.json (default: Llama 3's for vocab 128256)
  // A LoRA job's checkpoint (its adapters): PEFT's adapter_config.json and
  // adapter_model.safetensors (worker/checkpoint/hf_peft.h) instead.
  bool adapter = false;
  // A LoRA job's checkpoint merged into this base model (a weights file or
  // a Hugging Face folder: the job's model.init), then exported as any model.
  std::string merged_base;
};

// `shardtrain export`: for GPT-2, DIR/model.safetensors and DIR/config.json
// in Hugging Face's GPT-2 layout (worker/checkpoint/hf_gpt2.h) and, for
// GPT-2 vocabularies, the tokenizer's vocab.json and merges.txt beside them;
// for Llama, Hugging Face's LlamaForCausalLM layout
// (worker/checkpoint/hf_llama.h) in fp32 or bf16, sharded above
// max_shard_size, with generation_config.json and the tokenizer.json given;
// with o.adapter, a LoRA checkpoint's adapters in PEFT's format; with
// o.merged_base, the model that base and a LoRA checkpoint's adapters make.
int Export(const GlobalFlags& g, const ExportOptions& o);

}  // namespace shardtrain::client

#endif  // SHARDTRAIN_CLIENT_SAMPLE_H_
