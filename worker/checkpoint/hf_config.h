// A model's shape and family from a Hugging Face config.json, so that a spec
// whose model section names only `init: DIR` trains the checkpoint's model
// (as from_pretrained reads it), and the config.json fields shared by the
// families' readers.
#ifndef SHARDTRAIN_WORKER_CHECKPOINT_HF_CONFIG_H_
#define SHARDTRAIN_WORKER_CHECKPOINT_HF_CONFIG_H_

#include <optional>
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

// The router.aux_loss_coef (as YAML number text) that trains as the
// config.json's router_aux_loss_coef does in Hugging Face's MixtralForCausalLM and
// Qwen3MoeForCausalLM: nullopt for a dense model or without the field.
// Hugging Face adds one Switch loss over the tokens of every MoE layer
// taken together, K times ours per layer (concepts.md § Balancing), so
// ours is router_aux_loss_coef · num_experts_per_tok / (MoE layers): equal
// per-layer gradients and the same total loss when the layers' loads are
// alike. INVALID_ARGUMENT for a negative or non-numeric coefficient.
absl::StatusOr<std::optional<std::string>> HfRouterAuxLossCoef(const std::string& config_json_text);

// Where the config.json of model.init's `path` lies: path/config.json for a
// folder, else beside the file (a .safetensors file or its index).
std::string HfConfigPathOf(const std::string& init_path);

}  // namespace shardtrain::checkpoint

#endif  // SHARDTRAIN_WORKER_CHECKPOINT_HF_CONFIG_H_
