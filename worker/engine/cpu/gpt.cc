#include "worker/engine/cpu/gpt.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/rng.h"
#include "worker/engine/cpu/layers.h"

namespace shardtrain::engine::cpu {

using model::BlockTensor;
using model::GptConfig;
using model::kAttnProjB, model::kAttnProjW, model::kFcB, model::kFcProjB, model::kFcProjW,
    model::kFcW, model::kLn1B, model::kLn1W, model::kLn2B, model::kLn2W, model::kQkvB, model::kQkvW;
using model::TensorInfo;
using model::ValidateGptConfig;

namespace {

// Standard normal from a 64-bit counter-based key (Box-Muller, one output).
inline float NormalFromKey(uint64_t key) {
  const uint64_t bits = SplitMix64(key);
  const double u1 = (static_cast<double>(bits >> 40) + 0.5) / 16777216.0;
  const double u2 = static_cast<double>(bits & 0xFFFFFF) / 16777216.0;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

// Times a phase into `slot` when profiling.
class PhaseTimer {
 public:
  PhaseTimer(bool on, double* slot) : on_(on), slot_(slot) {
    if (on_) t0_ = std::chrono::steady_clock::now();
  }
  ~PhaseTimer() {
    if (on_) {
      *slot_ +=
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count();
    }
  }

 private:
  bool on_;
  double* slot_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace

class Gpt::UnitScope {
 public:
  UnitScope(const Gpt& gpt, int tensor)
      : hook_(gpt.param_hook_), unit_(gpt.layout_.tensors()[tensor].unit) {
    if (hook_) hook_(unit_, true);
  }
  ~UnitScope() {
    if (hook_) hook_(unit_, false);
  }
  UnitScope(const UnitScope&) = delete;
  UnitScope& operator=(const UnitScope&) = delete;

 private:
  const std::function<void(int, bool)>& hook_;
  const int unit_;
};

absl::StatusOr<std::unique_ptr<Gpt>> Gpt::Create(const GptConfig& config, int B, int T,
                                                 int threads) {
  if (auto s = ValidateGptConfig(config); !s.ok()) return s;
  if (B < 1) return absl::InvalidArgumentError(absl::StrCat("batch size must be >= 1, got ", B));
  if (T < 1 || T > config.context) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sequence length must be in [1, model.context=", config.context, "], got ", T));
  }
  if (threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat("threads must be >= 1, got ", threads));
  }
  return std::unique_ptr<Gpt>(new Gpt(config, B, T, threads));
}

Gpt::Gpt(const GptConfig& config, int B, int T, int threads)
    : layout_(config), B_(B), T_(T), pool_(threads), table_(config, B, T) {
  // The pool drives OpenBLAS: one BLAS thread per pool thread (process-wide).
  openblas_set_num_threads(1);
  const size_t n = layout_.num_params();
  // The CPU device holds fp32: allocating fp32 cannot fail but by aborting.
  params_ = *device_.Allocate(n, DataType::kFloat32);
  grads_ = *device_.Allocate(n, DataType::kFloat32);
  param_data_ = params_->as<float>();
  grad_data_ = grads_->as<float>();

  // Every activation and scratch tensor where the model's table puts it:
  // the saved tensors, then the scratch ones, in one buffer.
  acts_ = *device_.Allocate(static_cast<size_t>(table_.total_numel()), DataType::kFloat32);
  float* const saved = acts_->as<float>();
  float* const scratch = saved + table_.saved_numel();
  auto take = [&](const std::string& name) {
    const model::ActivationTensor& t = table_.at(name);
    return (t.kind == model::ActivationKind::kSaved ? saved : scratch) + t.offset;
  };
  // Per block: the table's "block.<l>.<name>" tensors; then the model's ends
  // and the scratch tensors, by name.
  // clang-format off
  static constexpr std::pair<const char*, float* LayerActs::*> kLayer[] = {
      {"ln1", &LayerActs::ln1}, {"ln1_mean", &LayerActs::ln1_mean},
      {"ln1_rstd", &LayerActs::ln1_rstd}, {"qkv", &LayerActs::qkv}, {"atty", &LayerActs::atty},
      {"att", &LayerActs::att}, {"residual2", &LayerActs::residual2}, {"ln2", &LayerActs::ln2},
      {"ln2_mean", &LayerActs::ln2_mean}, {"ln2_rstd", &LayerActs::ln2_rstd},
      {"fch", &LayerActs::fch}, {"fch_gelu", &LayerActs::fch_gelu},
      {"residual3", &LayerActs::residual3}};
  const std::pair<const char*, float**> kModel[] = {
      {"encoded", &encoded_}, {"lnf", &lnf_}, {"lnf_mean", &lnf_mean_}, {"lnf_rstd", &lnf_rstd_},
      {"logits", &logits_}, {"losses", &losses_}, {"lse", &lse_}, {"proj_out", &proj_out_},
      {"dresidual", &dresidual_}, {"dln", &dln_}, {"datty", &datty_}, {"dqkv", &dqkv_},
      {"dfch", &dfch_}, {"dfch_gelu", &dfch_gelu_}, {"att_scratch", &att_scratch_}};
  // clang-format on
  layer_acts_.resize(config.layers);
  for (int l = 0; l < config.layers; ++l) {
    for (const auto& [name, member] : kLayer) {
      layer_acts_[l].*member = take(absl::StrCat("block.", l, ".", name));
    }
  }
  for (const auto& [name, ptr] : kModel) *ptr = take(name);
  const int64_t BT = int64_t{B} * T;
  tokens_.assign(BT, 0);
  targets_.assign(BT, 0);
}

void Gpt::InitParamsInto(uint64_t seed, size_t begin, size_t end, float* out) {
  const GptConfig& cfg = config();
  const float residual_std = 0.02f / std::sqrt(2.0f * cfg.layers);
  const auto& tensors = layout_.tensors();
  for (size_t k = 0; k < tensors.size(); ++k) {
    const TensorInfo& t = tensors[k];
    // The part [i0, i1) of this tensor inside [begin, end).
    const size_t i0 = std::max(begin, t.offset) - t.offset;
    const size_t i1 = std::min(end, t.offset + t.numel);
    if (t.offset + i0 >= i1) continue;
    const size_t stop = i1 - t.offset;
    float* w = out + (t.offset + i0 - begin);  // w[i - i0]: element i of the tensor
    const bool is_ln_weight = t.name.find("ln") != std::string::npos && t.name.size() >= 6 &&
                              t.name.compare(t.name.size() - 6, 6, "weight") == 0;
    if (t.shape.size() == 1) {  // biases 0, LayerNorm weights 1
      std::fill(w, w + (stop - i0), is_ln_weight ? 1.0f : 0.0f);
      continue;
    }
    const bool residual_proj = t.name.find("attn.proj.weight") != std::string::npos ||
                               t.name.find("mlp.proj.weight") != std::string::npos;
    const float std_dev = residual_proj ? residual_std : 0.02f;
    // wte: only the first vocab rows are real; padded rows stay 0.
    const size_t n =
        static_cast<int>(k) == layout_.wte() ? static_cast<size_t>(cfg.vocab) * cfg.dim : t.numel;
    const uint64_t key = SplitMix64(seed ^ SplitMix64(k + 1));
    const size_t real_end = std::min(n, stop);
    if (i0 < real_end) {
      pool_.ParallelFor(
          static_cast<int64_t>(real_end - i0),
          [&](int64_t j0, int64_t j1) {
            for (int64_t j = j0; j < j1; ++j) {
              const uint64_t i = i0 + static_cast<uint64_t>(j);
              w[j] = std_dev * NormalFromKey(key + i * 0x9E3779B97F4A7C15ull);
            }
          },
          4096);
    }
    if (std::max(n, i0) < stop) std::fill(w + (std::max(n, i0) - i0), w + (stop - i0), 0.0f);
  }
}

void Gpt::ReadLogits(int row, float* out) const {
  std::memcpy(out, logits_ + int64_t{row} * config().padded_vocab, sizeof(float) * config().vocab);
}

void Gpt::ZeroGrad() {
  float* g = grad_data_;
  pool_.ParallelFor(
      static_cast<int64_t>(grads_->count()),
      [&](int64_t i0, int64_t i1) { std::memset(g + i0, 0, sizeof(float) * (i1 - i0)); }, 1 << 16);
}

float Gpt::Forward(const int* tokens, const int* targets, int b, int t) {
  const GptConfig& cfg = config();
  const int C = cfg.dim, NH = cfg.heads, V = cfg.vocab, Vp = cfg.padded_vocab;
  const int N = b * t;
  // Preconditions (programming errors, not data errors: the token readers
  // and Generate() validate their input): fail loudly, never corrupt memory.
  if (b < 1 || b > B_ || t < 1 || t > T_) {
    std::fprintf(stderr, "Gpt::Forward: (b=%d, t=%d) outside (1..%d, 1..%d)\n", b, t, B_, T_);
    std::abort();
  }
  for (int i = 0; i < N; ++i) {
    if (tokens[i] < 0 || tokens[i] >= V ||
        (targets != nullptr && (targets[i] < 0 || targets[i] >= V))) {
      std::fprintf(stderr, "Gpt::Forward: token/target at %d outside [0, %d)\n", i, V);
      std::abort();
    }
  }
  ThreadPool* pool = &pool_;
  last_b_ = b;
  last_t_ = t;
  have_targets_ = targets != nullptr;
  std::memcpy(tokens_.data(), tokens, sizeof(int) * N);
  if (targets != nullptr) std::memcpy(targets_.data(), targets, sizeof(int) * N);
  if (profiling_) timing_ = Timing{};

  {
    UnitScope use(*this, layout_.wte());
    PhaseTimer tm(profiling_, &timing_.encoder);
    EncoderForward(encoded_, tokens_.data(), param(layout_.wte()), param(layout_.wpe()), b, t, C,
                   pool);
  }
  const float* residual = encoded_;
  for (int l = 0; l < cfg.layers; ++l) {
    UnitScope use(*this, layout_.block_tensor(l, kLn1W));
    LayerActs& a = layer_acts_[l];
    auto w = [&](BlockTensor bt) { return param(layout_.block_tensor(l, bt)); };
    {
      PhaseTimer tm(profiling_, &timing_.layernorm);
      LayerNormForward(a.ln1, a.ln1_mean, a.ln1_rstd, residual, w(kLn1W), w(kLn1B), N, C, pool);
    }
    {
      PhaseTimer tm(profiling_, &timing_.matmul);
      MatmulForward(a.qkv, a.ln1, w(kQkvW), w(kQkvB), N, C, 3 * C, 3 * C, pool);
    }
    {
      PhaseTimer tm(profiling_, &timing_.attention);
      AttentionForward(a.atty, a.att, a.qkv, b, t, C, NH, pool);
    }
    {
      PhaseTimer tm(profiling_, &timing_.matmul);
      MatmulForward(proj_out_, a.atty, w(kAttnProjW), w(kAttnProjB), N, C, C, C, pool);
    }
    {
      PhaseTimer tm(profiling_, &timing_.residual);
      ResidualForward(a.residual2, residual, proj_out_, int64_t{N} * C, pool);
    }
    {
      PhaseTimer tm(profiling_, &timing_.layernorm);
      LayerNormForward(a.ln2, a.ln2_mean, a.ln2_rstd, a.residual2, w(kLn2W), w(kLn2B), N, C, pool);
    }
    {
      PhaseTimer tm(profiling_, &timing_.matmul);
      MatmulForward(a.fch, a.ln2, w(kFcW), w(kFcB), N, C, 4 * C, 4 * C, pool);
    }
    {
      PhaseTimer tm(profiling_, &timing_.gelu);
      GeluForward(a.fch_gelu, a.fch, int64_t{N} * 4 * C, pool);
    }
    {
      PhaseTimer tm(profiling_, &timing_.matmul);
      MatmulForward(proj_out_, a.fch_gelu, w(kFcProjW), w(kFcProjB), N, 4 * C, C, C, pool);
    }
    {
      PhaseTimer tm(profiling_, &timing_.residual);
      ResidualForward(a.residual3, a.residual2, proj_out_, int64_t{N} * C, pool);
    }
    residual = a.residual3;
  }
  {
    UnitScope use(*this, layout_.lnf_w());
    PhaseTimer tm(profiling_, &timing_.layernorm);
    LayerNormForward(lnf_, lnf_mean_, lnf_rstd_, residual, param(layout_.lnf_w()),
                     param(layout_.lnf_b()), N, C, pool);
  }
  {
    // LM head tied to wte; only the V real columns are computed.
    UnitScope use(*this, layout_.wte());
    PhaseTimer tm(profiling_, &timing_.lm_head);
    MatmulForward(logits_, lnf_, param(layout_.wte()), static_cast<const float*>(nullptr), N, C, V,
                  Vp, pool);
  }
  if (targets == nullptr) return 0.0f;
  PhaseTimer tm(profiling_, &timing_.softmax_ce);
  CrossEntropyForward(losses_, lse_, logits_, targets_.data(), N, V, Vp, pool);
  double sum = 0;
  for (int i = 0; i < N; ++i) sum += losses_[i];
  return static_cast<float>(sum / N);
}

void Gpt::Backward(float loss_scale) {
  if (!have_targets_) {  // precondition: a Forward with targets, not yet backpropagated
    std::fprintf(stderr, "Gpt::Backward: no preceding Forward with targets\n");
    std::abort();
  }
  const GptConfig& cfg = config();
  const int C = cfg.dim, NH = cfg.heads, V = cfg.vocab, Vp = cfg.padded_vocab;
  const int b = last_b_, t = last_t_, N = b * t;
  const int64_t NC = int64_t{N} * C;
  ThreadPool* pool = &pool_;
  auto zero = [&](float* p, int64_t n) {
    pool->ParallelFor(
        n, [&](int64_t i0, int64_t i1) { std::memset(p + i0, 0, sizeof(float) * (i1 - i0)); },
        1 << 14);
  };

  {
    PhaseTimer tm(profiling_, &timing_.softmax_ce);
    CrossEntropyBackwardInPlace(logits_, lse_, targets_.data(), loss_scale / static_cast<float>(N),
                                N, V, Vp, pool);
  }
  zero(dresidual_, NC);
  zero(dln_, NC);
  {
    UnitScope use(*this, layout_.wte());
    PhaseTimer tm(profiling_, &timing_.lm_head);
    MatmulBackward(dln_, grad(layout_.wte()), static_cast<float*>(nullptr), logits_, Vp, lnf_,
                   param(layout_.wte()), N, C, V, pool);
  }
  const float* final_residual = layer_acts_.back().residual3;
  {
    UnitScope use(*this, layout_.lnf_w());
    PhaseTimer tm(profiling_, &timing_.layernorm);
    LayerNormBackward(dresidual_, grad(layout_.lnf_w()), grad(layout_.lnf_b()), dln_,
                      final_residual, param(layout_.lnf_w()), lnf_mean_, lnf_rstd_, N, C, pool);
  }
  if (grads_ready_) grads_ready_(layout_.offset(layout_.lnf_w()));
  for (int l = cfg.layers - 1; l >= 0; --l) {
    LayerActs& a = layer_acts_[l];
    std::optional<UnitScope> use(std::in_place, *this, layout_.block_tensor(l, kLn1W));
    const float* residual = l == 0 ? encoded_ : layer_acts_[l - 1].residual3;
    auto w = [&](BlockTensor bt) { return param(layout_.block_tensor(l, bt)); };
    auto dw = [&](BlockTensor bt) { return grad(layout_.block_tensor(l, bt)); };
    // residual3 = residual2 + fcproj: both receive dresidual (in place).
    zero(dfch_gelu_, NC * 4);
    zero(dfch_, NC * 4);
    {
      PhaseTimer tm(profiling_, &timing_.matmul);
      MatmulBackward(dfch_gelu_, dw(kFcProjW), dw(kFcProjB), dresidual_, C, a.fch_gelu, w(kFcProjW),
                     N, 4 * C, C, pool);
    }
    {
      PhaseTimer tm(profiling_, &timing_.gelu);
      GeluBackward(dfch_, a.fch, dfch_gelu_, NC * 4, pool);
    }
    zero(dln_, NC);
    {
      PhaseTimer tm(profiling_, &timing_.matmul);
      MatmulBackward(dln_, dw(kFcW), dw(kFcB), dfch_, 4 * C, a.ln2, w(kFcW), N, C, 4 * C, pool);
    }
    {
      PhaseTimer tm(profiling_, &timing_.layernorm);
      LayerNormBackward(dresidual_, dw(kLn2W), dw(kLn2B), dln_, a.residual2, w(kLn2W), a.ln2_mean,
                        a.ln2_rstd, N, C, pool);
    }
    // residual2 = residual + attproj: both receive dresidual (in place).
    zero(datty_, NC);
    zero(dqkv_, NC * 3);
    {
      PhaseTimer tm(profiling_, &timing_.matmul);
      MatmulBackward(datty_, dw(kAttnProjW), dw(kAttnProjB), dresidual_, C, a.atty, w(kAttnProjW),
                     N, C, C, pool);
    }
    {
      PhaseTimer tm(profiling_, &timing_.attention);
      AttentionBackward(dqkv_, datty_, a.qkv, a.att, att_scratch_, b, t, C, NH, pool);
    }
    zero(dln_, NC);
    {
      PhaseTimer tm(profiling_, &timing_.matmul);
      MatmulBackward(dln_, dw(kQkvW), dw(kQkvB), dqkv_, 3 * C, a.ln1, w(kQkvW), N, C, 3 * C, pool);
    }
    {
      PhaseTimer tm(profiling_, &timing_.layernorm);
      LayerNormBackward(dresidual_, dw(kLn1W), dw(kLn1B), dln_, residual, w(kLn1W), a.ln1_mean,
                        a.ln1_rstd, N, C, pool);
    }
    use.reset();  // the block's parameters are no longer read
    if (grads_ready_) grads_ready_(layout_.offset(layout_.block_tensor(l, BlockTensor(0))));
  }
  {
    PhaseTimer tm(profiling_, &timing_.encoder);
    EncoderBackward(grad(layout_.wte()), grad(layout_.wpe()), dresidual_, tokens_.data(), b, t, C);
  }
  have_targets_ = false;
  if (grads_ready_) grads_ready_(0);
}

}  // namespace shardtrain::engine::cpu
