// A model's shape and family from a Hugging Face config.json, so that a spec
// whose model section names only `init: DIR` trains the checkpoint's model
// (as from_pretrained reads it), and the config.json fields shared by the
// families' readers.
#ifndef SHARDTRAIN_WORKER_CHECKPOINT_HF_CONFIG_H_
#define SHARDTRAIN_WORKER_CHECKPOINT_HF_CONFIG_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/config.h"

namespace shardtrain::checkpoint {

// The rope_scaling of a config.json's text: off when absent, null or of
// type "default"; INVALID_ARGUMENT ("rope_scaling {...}: ...") for another
// type than llama3 or a missing field.
absl::StatusOr<model::RopeScaling> HfRopeScaling(const std::string& config_json_text);

// The spec's model.* fields a config.json describes, as (key, YAML value)
// pairs in the spec's names: arch, layers, heads, dim, context, vocab, and
// for Llama-style models kv_heads, ffn_dim, head_dim (when it is not
// hidden_size / num_attention_heads), qk_norm, rope_theta, norm_eps,
// tie_embeddings, rope_scaling and moe (a flow map, or none). Reads
// GPT2LMHeadModel (n_layer, n_head, n_embd, n_positions, vocab_size) and
// LlamaForCausalLM / MistralForCausalLM / Qwen3ForCausalLM /
// MixtralForCausalLM / Qwen3MoeForCausalLM (num_hidden_layers, ...,
// max_position_embeddings as the context; Qwen3: q/k norms; Mixtral:
// num_local_experts, num_experts_per_tok, intermediate_size as the
// experts'; Qwen3-MoE: num_experts, num_experts_per_tok,
// moe_intermediate_size, norm_topk_prob, mlp_only_layers as the leading
// dense layers).
// INVALID_ARGUMENT "config.json: ..." naming the field for another
// architecture, or a missing or non-integer field.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ModelFieldsFromHfConfig(
    const std::string& config_json_text);

// Where the config.json of model.init's `path` lies: path/config.json for a
// folder, else beside the file (a .safetensors file or its index).
std::string HfConfigPathOf(const std::string& init_path);

}  // namespace shardtrain::checkpoint

#endif  // SHARDTRAIN_WORKER_CHECKPOINT_HF_CONFIG_H_
