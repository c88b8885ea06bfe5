// Weights in and out of shardtrain in Hugging Face's Llama layout
// (transformers' LlamaForCausalLM): config.json, and model.safetensors or
// model-0000K-of-0000N.safetensors with model.safetensors.index.json.
//
// Names (LlamaForCausalLM.state_dict()), from ours (common/model/param_layout.h):
//   model.embed_tokens.weight (V, C)                  wte, its first V of Vp rows
//   model.layers.L.input_layernorm.weight (C)         block.L.ln1.weight
//   model.layers.L.self_attn.q_proj.weight (C, C)     block.L.attn.qkv.weight rows [0, C)
//   model.layers.L.self_attn.k_proj.weight (KV, C)      rows [C, C + KV)
//   model.layers.L.self_attn.v_proj.weight (KV, C)      rows [C + KV, C + 2KV)
//   model.layers.L.self_attn.o_proj.weight (C, C)     block.L.attn.proj.weight
//   model.layers.L.post_attention_layernorm.weight (C) block.L.ln2.weight
//   model.layers.L.mlp.gate_proj.weight (F, C)        block.L.mlp.fc.weight rows [0, F)
//   model.layers.L.mlp.up_proj.weight (F, C)            rows [F, 2F)
//   model.layers.L.mlp.down_proj.weight (C, F)        block.L.mlp.proj.weight
//   model.norm.weight (C)                             lnf.weight
//   lm_head.weight (V, C)                             lm_head (absent when tied)
// Both are (out, in), like torch.nn.Linear.
//
// The rotary convention. shardtrain rotates channel pairs (2i, 2i+1) of each
// head (Meta's reference); transformers' rotate_half pairs (i, i + hs/2).
// The two compute the same attention when q_proj's and k_proj's rows are
// permuted within each head: our row 2i is Hugging Face's row i, our row
// 2i+1 its row i + hs/2 (the inverse of the permutation in transformers'
// convert_llama_weights_to_hf.py). Reading applies it, writing undoes it;
// nothing else is permuted.
//
// The same block is read from MistralForCausalLM (whose sliding window, when
// set, must cover the spec's context). rope_scaling of type llama3 (Llama
// 3.1, 3.2) must equal the spec's model.rope_scaling. Qwen3ForCausalLM is
// the block with q/k norms (model.qk_norm: self_attn.q_norm.weight and
// k_norm.weight (hs), permuted within the head like q's rows) and a head
// size of its own (q_proj (NH·hs, C), o_proj (C, NH·hs)). Other rope
// types, and Qwen2
// (q/k/v biases), compute something else and are refused naming the field.
#ifndef SHARDTRAIN_WORKER_CHECKPOINT_HF_LLAMA_H_
#define SHARDTRAIN_WORKER_CHECKPOINT_HF_LLAMA_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "common/model/config.h"
#include "worker/checkpoint/model_weights.h"

namespace shardtrain::checkpoint {

// config.json of a LlamaForCausalLM of `config` whose weights are `dtype`.
std::string HfLlamaConfigJson(const model::ModelConfig& config, DataType dtype);

// Checks a config.json's text against the model: INVALID_ARGUMENT naming the
// first field that disagrees with the spec ("config.json: num_key_value_heads
// 8, the spec's model.kv_heads 4") or that describes a block shardtrain does
// not compute (an unknown architecture, a rope_scaling other than llama3's,
// biases, another activation).
absl::Status CheckHfLlamaConfig(const std::string& json_text, const model::ModelConfig& config);

// The whole model's parameters from a Hugging Face Llama checkpoint at
// `path` (a folder holding config.json and the safetensors, or a
// .safetensors file or index with config.json beside it), read range by
// range (tensor by tensor: never the whole file in memory). Open checks
// config.json (CheckHfLlamaConfig) and every tensor's presence and shape
// (INVALID_ARGUMENT naming the tensor, its shape in the file and the model's).
absl::StatusOr<std::unique_ptr<WeightsSource>> OpenHfLlama(const std::string& path,
                                                           const model::ModelConfig& config);

// The Hugging Face architecture a Llama-family config exports as:
// LlamaForCausalLM, Qwen3ForCausalLM (q/k norms), MixtralForCausalLM or
// Qwen3MoeForCausalLM (MoE layers, without and with q/k norms).
const char* HfArchitecture(const model::ModelConfig& config);

struct HfExportOptions {
  DataType dtype = DataType::kFloat32;               // kFloat32 or kBFloat16
  int64_t max_shard_bytes = int64_t{5'000'000'000};  // a file holds at most this (one tensor more)
};

// Writes the whole model `params` (ParamLayout(config) order, a Llama
// config) into `dir` (which must exist): config.json, generation_config.json
// and model.safetensors, or model-0000K-of-0000N.safetensors and
// model.safetensors.index.json when the tensors exceed max_shard_bytes.
// Each file is written atomically. INVALID_ARGUMENT for a config that is not
// Llama's or params of another size.
absl::Status ExportHfLlama(const model::ModelConfig& config, absl::Span<const float> params,
                           const std::string& dir, const HfExportOptions& options);

// Hugging Face's row of our row r of a q or k projection (rows permuted
// within each head of hs, as the header says): 2i -> i, 2i+1 -> i + hs/2.
int64_t HfRotaryRow(int64_t r, int hs);

// "5GB" (10^9), "500MB", "2GiB" (2^30), "1000000" (bytes) -> bytes;
// INVALID_ARGUMENT otherwise (> 0 required).
absl::StatusOr<int64_t> ParseShardSize(const std::string& text);

}  // namespace shardtrain::checkpoint

#endif  // SHARDTRAIN_WORKER_CHECKPOINT_HF_LLAMA_H_
