#include "common/model/config.h"

#include <cmath>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace shardtrain::model {

const char* ArchName(Arch arch) { return arch == Arch::kLlama ? "llama" : "gpt2"; }

int PaddedVocab(int vocab) {
  const int m = vocab > 256 ? 128 : 64;
  return (vocab + m - 1) / m * m;
}

namespace {

struct GptPresetRow {
  const char* name;
  int layers, heads, dim, context, vocab;
};
constexpr GptPresetRow kGptPresets[] = {
    {"gpt2-124m", 12, 12, 768, 1024, 50257},
    {"gpt2-350m", 24, 16, 1024, 1024, 50257},
    {"gpt2-774m", 36, 20, 1280, 1024, 50257},
    {"gpt2-1558m", 48, 25, 1600, 1024, 50257},
};

struct LlamaPresetRow {
  const char* name;
  LlamaShape shape;
};
// Llama 3's context is 8192 here (its pre-training length); the 3.1/3.2
// checkpoints' rope_scaling (their config.json's) lets a spec set up to
// their 131072.
const LlamaPresetRow kLlamaPresets[] = {
    {"llama-tiny", {4, 4, 2, 128, 384, 128, 256, 500000, 1e-5, false}},
    {"llama3-1b", {16, 32, 8, 2048, 8192, 8192, 128256, 500000, 1e-5, true, {32, 1, 4, 8192}}},
    {"llama3-8b", {32, 32, 8, 4096, 14336, 8192, 128256, 500000, 1e-5, false, {8, 1, 4, 8192}}},
    {"qwen3-0.6b", {28, 16, 8, 1024, 3072, 40960, 151936, 1000000, 1e-6, true, {}, 128, true}},
    {"mixtral-8x7b",
     {32, 32, 8, 4096, 14336, 32768, 32000, 1000000, 1e-5, false, {}, 0, false, {8, 2, 14336}}},
    {"qwen3-30b-a3b",
     {48, 32, 4, 2048, 6144, 40960, 151936, 1000000, 1e-6, false, {}, 128, true, {128, 8, 768}}},
    {"moe-tiny", {4, 4, 2, 128, 384, 128, 256, 500000, 1e-5, false, {}, 0, false, {4, 2, 128}}},
};

absl::Status Positive(const char* field, int v) {
  if (v < 1) {
    return absl::InvalidArgumentError(absl::StrCat("model.", field, ": must be >= 1, got ", v));
  }
  return absl::OkStatus();
}

// The widest dim or ffn_dim: every derived width (qkv_dim(), fc_dim(), 4·dim)
// stays within int.
constexpr int kMaxWidth = 1 << 28;

absl::Status TooLarge(const char* field, int v) {
  return absl::InvalidArgumentError(
      absl::StrCat("model.", field, ": ", v, " is too large (at most ", kMaxWidth, ")"));
}

// Off (factor 0 and nothing else set), or complete and in range.
absl::Status ValidateRopeScaling(const RopeScaling& r) {
  if (r == RopeScaling{}) return absl::OkStatus();
  auto bad = [](const char* field, const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("model.rope_scaling.", field, ": ", why));
  };
  auto finite_positive = [](double v) { return v > 0 && std::isfinite(v); };
  if (!finite_positive(r.factor)) {
    return bad("factor", absl::StrCat("must be a finite number > 0, got ", r.factor));
  }
  if (!finite_positive(r.low_freq_factor)) {
    return bad("low_freq_factor",
               absl::StrCat("must be a finite number > 0, got ", r.low_freq_factor));
  }
  if (!std::isfinite(r.high_freq_factor) || !(r.high_freq_factor > r.low_freq_factor)) {
    return bad("high_freq_factor",
               absl::StrCat(r.high_freq_factor, " must be greater than low_freq_factor ",
                            r.low_freq_factor));
  }
  if (r.original_context < 1) {
    return bad("original_max_position_embeddings",
               absl::StrCat("must be >= 1, got ", r.original_context));
  }
  return absl::OkStatus();
}

absl::Status ValidateMoe(const MoeConfig& m, int layers) {
  if (m == MoeConfig{}) return absl::OkStatus();
  auto bad = [](const char* field, const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("model.moe.", field, ": ", why));
  };
  if (m.experts < 1) return bad("experts", absl::StrCat("must be >= 1, got ", m.experts));
  if (m.experts > (1 << 16)) {
    return bad("experts", absl::StrCat(m.experts, " is too many (at most 65536)"));
  }
  if (m.top_k < 1 || m.top_k > m.experts) {
    return bad("top_k",
               absl::StrCat("must be in [1, model.moe.experts: ", m.experts, "], got ", m.top_k));
  }
  // experts · expert_ffn_dim within kMaxWidth: a block's count stays in int64.
  if (m.expert_ffn_dim < 1 || int64_t{m.experts} * m.expert_ffn_dim > kMaxWidth) {
    return bad("expert_ffn_dim", absl::StrCat("must be >= 1 with experts · expert_ffn_dim <= ",
                                              kMaxWidth, ", got ", m.expert_ffn_dim));
  }
  if (m.shared_experts < 0 || int64_t{m.shared_experts} * m.expert_ffn_dim > kMaxWidth) {
    return bad("shared_experts",
               absl::StrCat("must be >= 0 with shared_experts · expert_ffn_dim <= ", kMaxWidth,
                            ", got ", m.shared_experts));
  }
  if (m.first_dense_layers < 0 || m.first_dense_layers >= layers) {
    return bad("first_dense_layers", absl::StrCat("must be in [0, model.layers: ", layers,
                                                  "), got ", m.first_dense_layers));
  }
  return absl::OkStatus();
}

}  // namespace

bool operator==(const MoeConfig& a, const MoeConfig& b) {
  return a.experts == b.experts && a.top_k == b.top_k && a.expert_ffn_dim == b.expert_ffn_dim &&
         a.shared_experts == b.shared_experts && a.scoring == b.scoring &&
         a.norm_topk_prob == b.norm_topk_prob && a.first_dense_layers == b.first_dense_layers &&
         a.router_bias == b.router_bias;
}

bool operator==(const RopeScaling& a, const RopeScaling& b) {
  return a.factor == b.factor && a.low_freq_factor == b.low_freq_factor &&
         a.high_freq_factor == b.high_freq_factor && a.original_context == b.original_context;
}

absl::Status ValidateModelConfig(const ModelConfig& c) {
  for (auto [field, v] : {std::pair<const char*, int>{"layers", c.layers},
                          {"heads", c.heads},
                          {"dim", c.dim},
                          {"context", c.context},
                          {"vocab", c.vocab},
                          {"kv_heads", c.kv_heads},
                          {"ffn_dim", c.ffn_dim}}) {
    if (auto s = Positive(field, v); !s.ok()) return s;
  }
  if (c.dim > kMaxWidth) return TooLarge("dim", c.dim);
  if (int64_t{c.heads} * c.head_dim() > kMaxWidth) return TooLarge("heads · head_dim", c.q_dim());
  if (c.ffn_dim > kMaxWidth) return TooLarge("ffn_dim", c.ffn_dim);
  if (c.head_size < 0 || c.head_size > kMaxWidth / 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.head_dim: must be >= 1 when set, got ", c.head_size));
  }
  if (c.head_size == 0 && c.dim % c.heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.dim: ", c.dim, " is not divisible by model.heads: ", c.heads));
  }
  if (c.heads % c.kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.kv_heads: ", c.kv_heads, " does not divide model.heads: ", c.heads));
  }
  if (c.padded_vocab != PaddedVocab(c.vocab)) {
    return absl::InvalidArgumentError(absl::StrCat("model.padded_vocab must be ",
                                                   PaddedVocab(c.vocab), " for vocab ", c.vocab,
                                                   ", got ", c.padded_vocab));
  }
  if (!(c.norm_eps > 0) || !std::isfinite(c.norm_eps)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.norm_eps: must be a finite number > 0, got ", c.norm_eps));
  }
  if (c.positions == PositionKind::kRotary) {
    if (c.head_dim() % 2 != 0) {
      return absl::InvalidArgumentError(
          c.head_size > 0
              ? absl::StrCat("model.head_dim: rotary positions need an even head size, got ",
                             c.head_size)
              : absl::StrCat("model.dim: rotary positions need an even head size, dim / heads = ",
                             c.dim, " / ", c.heads, " = ", c.head_dim()));
    }
    if (!(c.rope_theta > 0) || !std::isfinite(c.rope_theta)) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.rope_theta: must be a finite number > 0, got ", c.rope_theta));
    }
    if (absl::Status s = ValidateRopeScaling(c.rope_scaling); !s.ok()) return s;
  } else if (c.rope_scaling.on()) {
    return absl::InvalidArgumentError(
        "model.rope_scaling: only for rotary positions (model.arch: llama)");
  }
  if (absl::Status s = ValidateMoe(c.moe, c.layers); !s.ok()) return s;
  // The recipes the families have (the engines implement these two).
  const bool gpt2 = c.arch == Arch::kGpt2 && c.norm == NormKind::kLayerNorm &&
                    c.positions == PositionKind::kLearned && c.mlp == MlpKind::kGelu && c.bias &&
                    c.tie_embeddings && c.kv_heads == c.heads && c.head_size == 0 && !c.qk_norm &&
                    int64_t{c.ffn_dim} == int64_t{4} * c.dim && c.norm_eps == 1e-5;
  const bool llama = c.arch == Arch::kLlama && c.norm == NormKind::kRmsNorm &&
                     c.positions == PositionKind::kRotary && c.mlp == MlpKind::kSwiGlu && !c.bias;
  if (!gpt2 && !llama) {
    return absl::InvalidArgumentError(absl::StrCat("model.arch: the recipe of ", ToString(c),
                                                   " is not that of ", ArchName(c.arch)));
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> MakeGptConfig(int layers, int heads, int dim, int context, int vocab) {
  ModelConfig c;
  c.layers = layers;
  c.heads = heads;
  c.dim = dim;
  c.context = context;
  c.vocab = vocab;
  c.padded_vocab = PaddedVocab(vocab);
  c.kv_heads = heads;
  // Checked before the recipe, whose fields derive from them.
  for (auto [field, v] : {std::pair<const char*, int>{"layers", layers},
                          {"heads", heads},
                          {"dim", dim},
                          {"context", context},
                          {"vocab", vocab}}) {
    if (auto s = Positive(field, v); !s.ok()) return s;
  }
  if (dim > kMaxWidth) return TooLarge("dim", dim);
  c.ffn_dim = 4 * dim;
  if (auto s = ValidateModelConfig(c); !s.ok()) return s;
  return c;
}

absl::StatusOr<ModelConfig> MakeLlamaConfig(const LlamaShape& s) {
  ModelConfig c;
  c.arch = Arch::kLlama;
  c.layers = s.layers;
  c.heads = s.heads;
  c.kv_heads = s.kv_heads;
  c.dim = s.dim;
  c.ffn_dim = s.ffn_dim;
  c.context = s.context;
  c.vocab = s.vocab;
  c.padded_vocab = PaddedVocab(s.vocab);
  c.norm = NormKind::kRmsNorm;
  c.positions = PositionKind::kRotary;
  c.mlp = MlpKind::kSwiGlu;
  c.bias = false;
  c.tie_embeddings = s.tie_embeddings;
  c.norm_eps = s.norm_eps;
  c.rope_theta = s.rope_theta;
  c.rope_scaling = s.rope_scaling;
  c.head_size = s.head_dim;
  c.qk_norm = s.qk_norm;
  c.moe = s.moe;
  if (auto st = ValidateModelConfig(c); !st.ok()) return st;
  return c;
}

absl::StatusOr<ModelConfig> ModelPreset(const std::string& name) {
  for (const GptPresetRow& p : kGptPresets) {
    if (name == p.name) return MakeGptConfig(p.layers, p.heads, p.dim, p.context, p.vocab);
  }
  for (const LlamaPresetRow& p : kLlamaPresets) {
    if (name == p.name) return MakeLlamaConfig(p.shape);
  }
  return absl::NotFoundError(absl::StrCat("unknown preset \"", absl::CEscape(name), "\" (known: ",
                                          absl::StrJoin(ModelPresetNames(), ", "), ")"));
}

std::vector<std::string> ModelPresetNames() {
  std::vector<std::string> names;
  for (const GptPresetRow& p : kGptPresets) names.push_back(p.name);
  for (const LlamaPresetRow& p : kLlamaPresets) names.push_back(p.name);
  return names;
}

namespace {

// An MLP of hidden width h: fc (fc_rows(h), C) and proj (C, h) with their
// biases; 0 when h is 0.
int64_t MlpParams(const ModelConfig& c, int64_t h) {
  if (h == 0) return 0;
  const int64_t C = c.dim, FC = c.fc_rows(static_cast<int>(h));
  return FC * C + C * h + (c.bias ? FC + C : 0);
}

// Block l's parameters with `experts` of its experts counted.
int64_t BlockParamsWith(const ModelConfig& c, int l, int experts) {
  const int64_t C = c.dim, Q = c.q_dim(), QKV = c.qkv_dim();
  const int64_t norms = (c.norm == NormKind::kLayerNorm ? 4 * C : 2 * C) +
                        (c.qk_norm ? 2 * int64_t{c.head_dim()} : 0);
  const int64_t attention = QKV * C + C * Q + (c.bias ? QKV + C : 0);
  int64_t mlp = MlpParams(c, c.mlp_dim(l));
  if (c.moe_layer(l)) {
    mlp += int64_t{c.moe.experts} * (C + (c.moe.router_bias ? 1 : 0)) +
           experts * MlpParams(c, c.moe.expert_ffn_dim);
  }
  return norms + attention + mlp;
}

}  // namespace

int64_t BlockParams(const ModelConfig& c, int l) { return BlockParamsWith(c, l, c.moe.experts); }

int64_t BlockParams(const ModelConfig& c) { return BlockParamsWith(c, -1, 0); }

int64_t ActiveBlockParams(const ModelConfig& c, int l) {
  return BlockParamsWith(c, l, c.moe.top_k);
}

int64_t ModelParams(const ModelConfig& c) {
  int64_t n = EmbeddingParams(c) + FinalParams(c);
  for (int l = 0; l < c.layers; ++l) n += BlockParams(c, l);
  return n;
}

int64_t ActiveModelParams(const ModelConfig& c) {
  int64_t n = EmbeddingParams(c) + FinalParams(c);
  for (int l = 0; l < c.layers; ++l) n += ActiveBlockParams(c, l);
  return n;
}

int64_t EmbeddingParams(const ModelConfig& c) {
  const int64_t wte = int64_t{c.padded_vocab} * c.dim;
  return wte + (c.positions == PositionKind::kLearned ? int64_t{c.context} * c.dim : 0);
}

int64_t FinalParams(const ModelConfig& c) {
  const int64_t norm = c.norm == NormKind::kLayerNorm ? 2 * int64_t{c.dim} : c.dim;
  return norm + (c.tie_embeddings ? 0 : int64_t{c.padded_vocab} * c.dim);
}

std::vector<double> RotaryFrequencies(const ModelConfig& c) {
  if (c.positions != PositionKind::kRotary) return {};
  const int half = c.head_dim() / 2;
  std::vector<double> freq(half);
  const RopeScaling& r = c.rope_scaling;
  constexpr double kPi = 3.14159265358979323846;
  for (int i = 0; i < half; ++i) {
    // In float, as transformers computes inv_freq (1 / θ^(arange(0, hs, 2) / hs)).
    const double f = 1.0f / static_cast<float>(std::pow(c.rope_theta, 2.0 * i / c.head_dim()));
    freq[i] = f;
    if (!r.on()) continue;
    // _compute_llama3_parameters in transformers' modeling_rope_utils.py.
    const double wavelen = 2 * kPi / f;
    const double low_wavelen = r.original_context / r.low_freq_factor;
    const double high_wavelen = r.original_context / r.high_freq_factor;
    if (wavelen > low_wavelen) {
      freq[i] = f / r.factor;
    } else if (!(wavelen < high_wavelen)) {
      const double smooth = (r.original_context / wavelen - r.low_freq_factor) /
                            (r.high_freq_factor - r.low_freq_factor);
      freq[i] = (1 - smooth) * f / r.factor + smooth * f;
    }
  }
  return freq;
}

std::vector<float> RotaryTable(const ModelConfig& c) {
  if (c.positions != PositionKind::kRotary) return {};
  const int half = c.head_dim() / 2;
  const std::vector<double> freq = RotaryFrequencies(c);
  std::vector<float> table(size_t(c.context) * half * 2);
  for (int p = 0; p < c.context; ++p) {
    for (int i = 0; i < half; ++i) {
      const double angle = p * freq[i];
      table[(size_t(p) * half + i) * 2] = static_cast<float>(std::cos(angle));
      table[(size_t(p) * half + i) * 2 + 1] = static_cast<float>(std::sin(angle));
    }
  }
  return table;
}

bool operator==(const ModelConfig& a, const ModelConfig& b) {
  return a.layers == b.layers && a.heads == b.heads && a.dim == b.dim && a.context == b.context &&
         a.vocab == b.vocab && a.padded_vocab == b.padded_vocab && a.arch == b.arch &&
         a.kv_heads == b.kv_heads && a.ffn_dim == b.ffn_dim && a.norm == b.norm &&
         a.positions == b.positions && a.mlp == b.mlp && a.bias == b.bias &&
         a.tie_embeddings == b.tie_embeddings && a.norm_eps == b.norm_eps &&
         a.rope_theta == b.rope_theta && a.rope_scaling == b.rope_scaling &&
         a.head_size == b.head_size && a.qk_norm == b.qk_norm && a.moe == b.moe && a.lora == b.lora;
}

bool operator==(const LoraConfig& a, const LoraConfig& b) {
  return a.rank == b.rank && a.alpha == b.alpha && a.targets == b.targets;
}

ModelConfig BaseConfig(const ModelConfig& config) {
  ModelConfig base = config;
  base.lora = LoraConfig{};
  return base;
}

std::string ToString(const ModelConfig& c) {
  std::string out =
      absl::StrCat("{layers ", c.layers, ", heads ", c.heads, ", dim ", c.dim, ", context ",
                   c.context, ", vocab ", c.vocab, ", padded_vocab ", c.padded_vocab);
  if (c.arch != Arch::kGpt2) {
    absl::StrAppend(&out, ", arch ", ArchName(c.arch), ", kv_heads ", c.kv_heads, ", ffn_dim ",
                    c.ffn_dim, ", tie_embeddings ", c.tie_embeddings ? "true" : "false",
                    ", norm_eps ", c.norm_eps, ", rope_theta ", c.rope_theta);
    if (c.head_size > 0) absl::StrAppend(&out, ", head_dim ", c.head_size);
    if (c.qk_norm) absl::StrAppend(&out, ", qk_norm true");
    const RopeScaling& r = c.rope_scaling;
    if (r.on()) {
      absl::StrAppend(&out, ", rope_scaling llama3 (factor ", r.factor, ", low_freq_factor ",
                      r.low_freq_factor, ", high_freq_factor ", r.high_freq_factor,
                      ", original_max_position_embeddings ", r.original_context, ")");
    }
  }
  const MoeConfig& m = c.moe;
  if (m.on()) {
    absl::StrAppend(&out, ", moe (experts ", m.experts, ", top_k ", m.top_k, ", expert_ffn_dim ",
                    m.expert_ffn_dim);
    if (m.shared_experts > 0) absl::StrAppend(&out, ", shared_experts ", m.shared_experts);
    if (m.scoring == RouterScoring::kSigmoid) absl::StrAppend(&out, ", scoring sigmoid");
    if (!m.norm_topk_prob) absl::StrAppend(&out, ", norm_topk_prob false");
    if (m.first_dense_layers > 0) {
      absl::StrAppend(&out, ", first_dense_layers ", m.first_dense_layers);
    }
    if (m.router_bias) absl::StrAppend(&out, ", router_bias true");
    absl::StrAppend(&out, ")");
  }
  return out + "}";
}

}  // namespace shardtrain::model
