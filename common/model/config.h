// The model's shape and family: the pure model spec shared by the job spec,
// the planner, every engine, checkpoints and the weights file.
//
// A model family is a recipe — which norm, which positions, which MLP, how
// many key/value heads, biases or not, a tied LM head or not — that the one
// model driver (worker/engine/model_engine.h), the parameter layout, the
// activation table, recomputation and the planner read from this value.
// Only the factories below know the families by name:
//   gpt2   LayerNorm (with bias), learned positions (wpe), a GELU MLP of
//          4·dim, biases on every linear layer, the LM head tied to wte;
//   llama  RMSNorm (no bias), rotary positions (no wpe), a SwiGLU MLP of
//          ffn_dim, grouped-query attention (kv_heads <= heads), no biases,
//          the LM head untied unless tie_embeddings.
//
// Shape letters used throughout the code base (as in llm.c):
//   B  batch (sequences per micro-batch)     T  sequence length (<= context)
//   C  channels (dim)                        NH attention heads, hs = C / NH
//   L  layers                                V  vocab, Vp padded vocab
//   KVH key/value heads (KV = KVH·hs)        F  the MLP's hidden width
//   Q  the attention's width NH·hs (= C unless model.head_dim is set)
//   E  experts, K top_k, He an expert's hidden width (MoE layers)
#ifndef SHARDTRAIN_COMMON_MODEL_CONFIG_H_
#define SHARDTRAIN_COMMON_MODEL_CONFIG_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace shardtrain::model {

enum class Arch { kGpt2, kLlama };              // "gpt2" | "llama"
enum class NormKind { kLayerNorm, kRmsNorm };   // y = (x-mean)·rstd·w + b | x·rstd·w
enum class PositionKind { kLearned, kRotary };  // wpe added to the embeddings | RoPE on q, k
enum class MlpKind { kGelu, kSwiGlu };          // gelu(x W1) W2 | (silu(x Wg) ⊙ x Wu) W2
// How an MoE router turns logits into scores: softmax over the experts
// (Switch, Mixtral, Qwen-MoE) or a sigmoid per expert (DeepSeek-V3).
enum class RouterScoring { kSoftmax, kSigmoid };  // "softmax" | "sigmoid"

const char* ArchName(Arch arch);  // "gpt2", "llama"

// Llama 3's adjustment of rotary frequencies for long contexts (Hugging
// Face's rope_scaling with rope_type "llama3", Llama 3.1 and 3.2): with
// wavelength λ_i = 2π / f_i of frequency f_i = θ^(-2i/hs) and the original
// context O, frequencies whose λ < O / high_freq_factor stay, those with
// λ > O / low_freq_factor are divided by factor, and those between blend the
// two: f' = (1 − s) f / factor + s f with s = (O / λ − low) / (high − low).
// Attention is not rescaled (the llama3 type's attention factor is 1).
// factor 0: none (every other family and Llama 3.0).
struct RopeScaling {
  double factor = 0;            // > 0 when on
  double low_freq_factor = 0;   // > 0
  double high_freq_factor = 0;  // > low_freq_factor
  int original_context = 0;     // O: original_max_position_embeddings, >= 1
  bool on() const { return factor > 0; }
};
bool operator==(const RopeScaling& a, const RopeScaling& b);
inline bool operator!=(const RopeScaling& a, const RopeScaling& b) { return !(a == b); }

// A Mixture-of-Experts MLP (model.moe): in layers >= first_dense_layers the
// dense MLP is replaced by a router over `experts` (E) MLPs of
// expert_ffn_dim (He) hidden units each, the recipe's kind (GELU or
// SwiGLU), of which each token uses the top_k (K) by score, its output
// their gate-weighted sum, plus `shared_experts` always-on experts of the
// same shape (DeepSeek / Qwen2-MoE: one dense MLP of shared_experts·He,
// the layer's mlp.fc / mlp.proj). The layers below first_dense_layers keep
// the dense MLP of ffn_dim. experts 0: no MoE (every layer dense).
struct MoeConfig {
  int experts = 0;         // E; 0: off
  int top_k = 0;           // K, 1 <= K <= E
  int expert_ffn_dim = 0;  // He >= 1
  int shared_experts = 0;  // >= 0
  RouterScoring scoring = RouterScoring::kSoftmax;
  bool norm_topk_prob = true;  // the K gates divided by their sum
  int first_dense_layers = 0;  // 0 <= first_dense_layers < layers
  // A per-expert bias added to the scores only to choose the experts (not
  // to weigh them): DeepSeek-V3's aux-loss-free balancing, updated between
  // steps (router.bias_update_rate), never by the optimizer (its tensor,
  // mlp.router.bias, gets no gradient).
  bool router_bias = false;
  bool on() const { return experts > 0; }
};
bool operator==(const MoeConfig& a, const MoeConfig& b);
inline bool operator!=(const MoeConfig& a, const MoeConfig& b) { return !(a == b); }

// LoRA adapters (Hu et al. 2021; the job's finetune.lora): on each target
// linear layer W (out, in) of every block, a trained pair A (rank, in) and
// B (out, rank) whose product times alpha / rank adds to W's output, while
// every tensor of the model itself is frozen (common/model/lora.h: the
// targets' shapes; param_layout.h: where the adapters live). The targets
// are Llama's projections: q, k, v (the rows of attn.qkv), o (attn.proj),
// gate and up (the halves of SwiGLU's mlp.fc; GPT-2's fc is `up`), down
// (mlp.proj). rank 0: off.
enum LoraTarget : int { kLoraQ = 0, kLoraK, kLoraV, kLoraO, kLoraGate, kLoraUp, kLoraDown };
inline constexpr int kNumLoraTargets = 7;
struct LoraConfig {
  int rank = 0;          // r >= 1 when on
  double alpha = 0;      // > 0; the adapters' scale is alpha / rank
  uint32_t targets = 0;  // bit t: LoraTarget t adapted
  bool on() const { return rank > 0; }
  bool has(LoraTarget t) const { return (targets >> t) & 1u; }
  double scale() const { return alpha / rank; }
};
bool operator==(const LoraConfig& a, const LoraConfig& b);
inline bool operator!=(const LoraConfig& a, const LoraConfig& b) { return !(a == b); }

struct ModelConfig {
  int layers = 0;        // L
  int heads = 0;         // NH
  int dim = 0;           // C
  int context = 0;       // maximum sequence length (rows of wpe; rotary's table)
  int vocab = 0;         // V: real tokens
  int padded_vocab = 0;  // Vp: rows of wte; see PaddedVocab()
  // ---- the family's recipe (filled by MakeGptConfig / MakeLlamaConfig)
  Arch arch = Arch::kGpt2;
  int kv_heads = 0;  // KVH: heads of keys and values; divides heads (== heads: multi-head)
  int ffn_dim = 0;   // F: the MLP's hidden width (4·dim for GPT-2)
  NormKind norm = NormKind::kLayerNorm;
  PositionKind positions = PositionKind::kLearned;
  MlpKind mlp = MlpKind::kGelu;
  bool bias = true;            // linear layers and norms have biases
  bool tie_embeddings = true;  // the LM head reads wte (else its own lm_head weight)
  double norm_eps = 1e-5;      // the norms' epsilon
  double rope_theta = 0;       // rotary's base (rotary positions only)
  RopeScaling rope_scaling;    // rotary positions only; off by default
  // hs when it is not dim / heads (Qwen3: dim 1024, 16 heads of 128); 0:
  // dim / heads. The attention's width Q = heads · hs may then differ from C.
  int head_size = 0;
  // RMSNorm over each head of q and of k (weights hs each, shared by the
  // heads), after the projection and before rotary (Qwen3's q_norm/k_norm).
  bool qk_norm = false;
  MoeConfig moe;  // off by default
  // Adapters on a frozen model (fine-tuning); off by default. Not part of
  // the model's weights: BaseConfig() drops it.
  LoraConfig lora;

  int head_dim() const { return head_size > 0 ? head_size : dim / heads; }  // hs
  int q_dim() const { return heads * head_dim(); }                          // Q
  int kv_dim() const { return kv_heads * head_dim(); }                      // KV
  int qkv_dim() const { return q_dim() + 2 * kv_dim(); }  // rows of attn.qkv.weight
  int fc_dim() const { return mlp == MlpKind::kSwiGlu ? 2 * ffn_dim : ffn_dim; }  // fc's rows
  // Whether layer l's MLP is the MoE one.
  bool moe_layer(int l) const { return moe.on() && l >= moe.first_dense_layers; }
  // The hidden width of layer l's dense MLP: ffn_dim, or in an MoE layer the
  // shared experts' shared_experts·He (0: none).
  int mlp_dim(int l) const {
    return moe_layer(l) ? moe.shared_experts * moe.expert_ffn_dim : ffn_dim;
  }
  // Rows of an MLP's fc weight of hidden width h: h, or SwiGLU's 2h.
  int fc_rows(int h) const { return mlp == MlpKind::kSwiGlu ? 2 * h : h; }
};

// Vp for a vocabulary of `vocab` tokens (llm.c style): rounded up to a
// multiple of 128 when vocab > 256, else to a multiple of 64. Padded logits
// are never computed into the softmax or the loss, and padded wte rows stay 0.
int PaddedVocab(int vocab);

// A GPT-2 model. Validated: every field >= 1, dim % heads == 0. Returns
// InvalidArgument naming the offending field the way a job spec does
// ("model.heads: must be >= 1, got 0", "model.dim: 10 is not divisible by
// model.heads: 4").
absl::StatusOr<ModelConfig> MakeGptConfig(int layers, int heads, int dim, int context, int vocab);

// A Llama-style model (see the header comment), validated like
// MakeGptConfig and: kv_heads >= 1 dividing heads, ffn_dim >= 1, an even
// head size (rotary rotates pairs; with head_dim set, dim need not divide by
// heads), norm_eps and rope_theta > 0, and a
// rope_scaling that is off or complete (factor, low_freq_factor > 0,
// high_freq_factor > low_freq_factor, original_context >= 1).
struct LlamaShape {
  int layers = 0, heads = 0, kv_heads = 0, dim = 0, ffn_dim = 0, context = 0, vocab = 0;
  double rope_theta = 500000, norm_eps = 1e-5;
  bool tie_embeddings = false;
  RopeScaling rope_scaling = {};  // off unless set
  int head_dim = 0;               // 0: dim / heads (ModelConfig::head_size)
  bool qk_norm = false;           // Qwen3's per-head q and k RMSNorm
  MoeConfig moe = {};             // off unless set
};
absl::StatusOr<ModelConfig> MakeLlamaConfig(const LlamaShape& shape);

// Validates an already filled config (including padded_vocab ==
// PaddedVocab(vocab), a recipe one of the families has, and a moe that is
// off or has 1 <= top_k <= experts, expert_ffn_dim >= 1, shared_experts >=
// 0 and first_dense_layers in [0, layers)).
absl::Status ValidateModelConfig(const ModelConfig& config);

// Named presets, the one table of them: "gpt2-124m" (12/12/768/1024/50257),
// "gpt2-350m", "gpt2-774m", "gpt2-1558m"; "llama-tiny" (4 layers, dim 128, 4
// heads, 2 kv heads, ffn 384, context 256, vocab 256: a byte model for CPU
// tests), "llama3-1b" (Llama 3.2 1B), "llama3-8b" (Llama 3.1 8B) — these
// two with their checkpoints' rope_scaling (factor 32 and 8, low 1, high 4,
// original context 8192) and context 8192 — and "qwen3-0.6b" (Qwen3-0.6B:
// 28 layers, dim 1024, 16 heads of 128, 8 kv heads, ffn 3072, q/k norms,
// context 40960, vocab 151936, tied), "mixtral-8x7b" (Mixtral 8x7B: 32
// layers, dim 4096, 32 heads, 8 kv heads, 8 SwiGLU experts of 14336, top 2,
// context 32768, vocab 32000, θ 1e6; 46.7B parameters, 12.9B active),
// "qwen3-30b-a3b" (Qwen3-30B-A3B: 48 layers, dim 2048, 32 heads of 128, 4
// kv heads, q/k norms, 128 experts of 768, top 8 renormalised, context
// 40960, vocab 151936, untied; 30.5B parameters, 3.3B active) and
// "moe-tiny" (llama-tiny's shape with 4 experts of 128, top 2: CPU tests). NotFound
// otherwise, listing the known names.
absl::StatusOr<ModelConfig> ModelPreset(const std::string& name);
// Their names, in the table's order.
std::vector<std::string> ModelPresetNames();

// Parameters of transformer block `layer`, of the embeddings (wte, and wpe
// with learned positions) and of the last stage's end (the final norm, and
// the LM head when untied), in the whole model. The stage split and the
// planner count with these; ParamLayout lays out the same tensors.
// BlockParams without a layer: the dense block's (every block without MoE).
int64_t BlockParams(const ModelConfig& config, int layer);
int64_t BlockParams(const ModelConfig& config);
// A block's parameters one token uses: an MoE block's top_k of its experts
// (and the router, the shared experts); a dense block's all.
int64_t ActiveBlockParams(const ModelConfig& config, int layer);
// The whole model's parameters, and those one token uses (the tied wte
// counted once): the FLOPs per token follow the active ones.
int64_t ModelParams(const ModelConfig& config);
int64_t ActiveModelParams(const ModelConfig& config);
int64_t EmbeddingParams(const ModelConfig& config);
int64_t FinalParams(const ModelConfig& config);

// Rotary's table: (context, hs/2) pairs (cos, sin) of the angle p·f_i for
// position p and frequency f_i = θ^(-2i/hs) (adjusted by rope_scaling when
// on: RotaryFrequencies), computed in double and rounded to float,
// so every engine rotates by the same numbers. Pair i of a head rotates
// channels (2i, 2i+1) (Meta's interleaved convention; Hugging Face's
// rotate_half checkpoints are permuted on load). Empty without rotary
// positions.
std::vector<float> RotaryTable(const ModelConfig& config);
// The hs/2 frequencies f_i that table rotates by, in double; empty without
// rotary positions. The one place rope_scaling is applied.
std::vector<double> RotaryFrequencies(const ModelConfig& config);

bool operator==(const ModelConfig& a, const ModelConfig& b);
inline bool operator!=(const ModelConfig& a, const ModelConfig& b) { return !(a == b); }
// The model the adapters sit on: config without lora.
ModelConfig BaseConfig(const ModelConfig& config);
std::string ToString(const ModelConfig& config);

}  // namespace shardtrain::model

#endif  // SHARDTRAIN_COMMON_MODEL_CONFIG_H_
