// Weights in and out of shardtrain in Hugging Face's GPT-2 layout, as a
// safetensors file.
//
// safetensors: see safetensors.h. We write F32 (the fp32 master); we read
// F32, BF16 and F16.
//
// GPT-2's names (transformers' GPT2LMHeadModel.state_dict()), from ours
// (common/model/param_layout.h):
//   transformer.wte.weight (V, C)       wte, the first V of its Vp rows
//   transformer.wpe.weight (T, C)       wpe
//   transformer.h.L.ln_1.{weight,bias}  block.L.ln1
//   transformer.h.L.attn.c_attn.weight (C, 3C)   block.L.attn.qkv.weight transposed
//   transformer.h.L.attn.c_attn.bias (3C)
//   transformer.h.L.attn.c_proj.weight (C, C)    block.L.attn.proj.weight transposed
//   transformer.h.L.ln_2.{weight,bias}  block.L.ln2
//   transformer.h.L.mlp.c_fc.weight (C, 4C)      block.L.mlp.fc.weight transposed
//   transformer.h.L.mlp.c_proj.weight (4C, C)    block.L.mlp.proj.weight transposed
//   transformer.ln_f.{weight,bias}      lnf
// GPT-2's Conv1D keeps weights as (in, out): ours, like torch.nn.Linear, are
// (out, in). The LM head is tied to wte and not written (transformers ties
// it on load). Reading also accepts the names without "transformer." (the
// original openai-community/gpt2 file) and ignores attn.bias / masked_bias
// buffers and lm_head.weight.
#ifndef SHARDTRAIN_WORKER_CHECKPOINT_HF_GPT2_H_
#define SHARDTRAIN_WORKER_CHECKPOINT_HF_GPT2_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/model/config.h"

namespace shardtrain::checkpoint {

struct NamedTensor {
  std::vector<int64_t> shape;
  std::vector<float> data;  // row-major, product(shape) elements
};

// Writes `tensors` (in name order) and `metadata` as a safetensors file,
// atomically (WriteFileAtomically). INVALID_ARGUMENT when a tensor's data
// does not match its shape.
absl::Status WriteSafetensors(const std::string& path,
                              const std::map<std::string, NamedTensor>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

// Every tensor of a safetensors file, as fp32. NOT_FOUND (missing);
// DATA_LOSS naming the file and the tensor for a malformed header, offsets
// outside the file or not matching the shape; UNIMPLEMENTED for a dtype
// other than F32, BF16 and F16.
absl::StatusOr<std::map<std::string, NamedTensor>> ReadSafetensors(const std::string& path);

// The whole model's flat parameters (ParamLayout(config) order) as GPT-2's
// named tensors.
std::map<std::string, NamedTensor> ToHfGpt2(const model::ModelConfig& config,
                                            absl::Span<const float> params);

// GPT-2's named tensors -> the flat parameters of `config` (the padded wte
// rows zero). INVALID_ARGUMENT naming the first tensor that is missing or
// whose shape differs ("transformer.h.0.attn.c_attn.weight: shape [768, 2304]
// in the file, [64, 192] for the model").
absl::StatusOr<std::vector<float>> FromHfGpt2(const model::ModelConfig& config,
                                              const std::map<std::string, NamedTensor>& tensors);

// transformers' config.json of a GPT2LMHeadModel of `config`.
std::string HfGpt2ConfigJson(const model::ModelConfig& config);

// True when `path` starts like a safetensors file (a plausible header
// length followed by '{').
bool LooksLikeSafetensors(const std::string& path);

}  // namespace shardtrain::checkpoint

#endif  // SHARDTRAIN_WORKER_CHECKPOINT_HF_GPT2_H_
