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
#include "worker/engine/cpu/gpt_internal.h"
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

}  // namespace

absl::StatusOr<std::unique_ptr<Gpt>> Gpt::Create(const GptConfig& config, int B, int T, int threads,
                                                 const GptOptions& options) {
  if (auto s = ValidateGptConfig(config); !s.ok()) return s;
  if (B < 1) return absl::InvalidArgumentError(absl::StrCat("batch size must be >= 1, got ", B));
  if (T < 1 || T > config.context) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sequence length must be in [1, model.context=", config.context, "], got ", T));
  }
  if (threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat("threads must be >= 1, got ", threads));
  }
  if (options.slots < 1) {
    return absl::InvalidArgumentError(absl::StrCat("slots must be >= 1, got ", options.slots));
  }
  const model::ModelSlice& sl = options.slice;
  const int end = sl.end_layer(config);
  if (sl.first_layer < 0 || end > config.layers || end <= sl.first_layer) {
    return absl::InvalidArgumentError(absl::StrCat("layers [", sl.first_layer, ", ", end,
                                                   ") outside the model's ", config.layers));
  }
  const int tp = sl.tp;
  if (tp < 1 || sl.tp_rank < 0 || sl.tp_rank >= tp || config.heads % tp != 0 ||
      config.padded_vocab % tp != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallel.tp: ", tp, " (rank ", sl.tp_rank, ") must divide model.heads ",
                     config.heads, " and the padded vocabulary ", config.padded_vocab));
  }
  if (tp > 1 &&
      (options.tp == nullptr || options.tp->size() != tp || options.tp->rank() != sl.tp_rank)) {
    return absl::InvalidArgumentError("tensor-parallel slice without its tp group");
  }
  return std::unique_ptr<Gpt>(new Gpt(config, B, T, threads, options));
}

Gpt::Gpt(const GptConfig& config, int B, int T, int threads, const GptOptions& options)
    : layout_(config, options.slice),
      whole_(config),
      tp_(options.slice.tp > 1 ? options.tp : nullptr),
      vocab_(
          VocabShardOf(config.vocab, config.padded_vocab, options.slice.tp, options.slice.tp_rank)),
      B_(B),
      T_(T),
      pool_(threads),
      table_(config, B, T, options.slice) {
  // The pool drives OpenBLAS: one BLAS thread per pool thread (process-wide).
  openblas_set_num_threads(1);
  const size_t n = layout_.num_params();
  // The CPU device holds fp32: allocating fp32 cannot fail but by aborting.
  params_ = *device_.Allocate(n, DataType::kFloat32);
  grads_ = *device_.Allocate(n, DataType::kFloat32);
  param_data_ = params_->as<float>();
  grad_data_ = grads_->as<float>();

  // Every activation and scratch tensor where the model's table puts it:
  // one set of the saved tensors per slot, then the scratch ones, in one
  // buffer.
  const int num_slots = options.slots;
  acts_ = *device_.Allocate(
      static_cast<size_t>(table_.saved_numel() * num_slots + table_.scratch_numel()),
      DataType::kFloat32);
  float* const scratch = acts_->as<float>() + table_.saved_numel() * num_slots;
  auto take = [&](float* saved, const std::string& name) -> float* {
    for (const model::ActivationTensor& t : table_.tensors()) {
      if (t.name == name)
        return (t.kind == model::ActivationKind::kSaved ? saved : scratch) + t.offset;
    }
    return nullptr;  // not on this stage
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
  static constexpr std::pair<const char*, float* SlotActs::*> kEnds[] = {
      {"encoded", &SlotActs::encoded}, {"lnf", &SlotActs::lnf}, {"lnf_mean", &SlotActs::lnf_mean},
      {"lnf_rstd", &SlotActs::lnf_rstd}, {"logits", &SlotActs::logits},
      {"losses", &SlotActs::losses}, {"lse", &SlotActs::lse}};
  const std::pair<const char*, float**> kScratch[] = {
      {"proj_out", &proj_out_}, {"dresidual", &dresidual_}, {"dln", &dln_}, {"datty", &datty_},
      {"dqkv", &dqkv_}, {"dfch", &dfch_}, {"dfch_gelu", &dfch_gelu_},
      {"att_scratch", &att_scratch_}};
  // clang-format on
  const int64_t BT = int64_t{B} * T;
  slots_.resize(num_slots);
  for (int k = 0; k < num_slots; ++k) {
    SlotActs& s = slots_[k];
    float* const saved = acts_->as<float>() + table_.saved_numel() * k;
    s.layers.resize(layout_.num_layers());
    for (int i = 0; i < layout_.num_layers(); ++i) {
      for (const auto& [name, member] : kLayer) {
        s.layers[i].*member =
            take(saved, absl::StrCat("block.", layout_.first_layer() + i, ".", name));
      }
    }
    for (const auto& [name, member] : kEnds) s.*member = take(saved, name);
    s.tokens.assign(BT, 0);
    s.targets.assign(BT, 0);
  }
  for (const auto& [name, ptr] : kScratch) *ptr = take(nullptr, name);
}

void Gpt::InitParamsInto(uint64_t seed, size_t begin, size_t end, float* out) {
  // Each local element gets its value in the whole model: a slice starts
  // exactly where one rank would.
  for (const model::FlatRun& r : layout_.GlobalRuns(begin, end)) {
    InitGlobal(seed, r.global, r.global + r.count, out + (r.local - begin));
  }
}

void Gpt::InitGlobal(uint64_t seed, size_t begin, size_t end, float* out) {
  const GptConfig& cfg = config();
  const float residual_std = 0.02f / std::sqrt(2.0f * cfg.layers);
  const auto& tensors = whole_.tensors();
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
        static_cast<int>(k) == whole_.wte() ? static_cast<size_t>(cfg.vocab) * cfg.dim : t.numel;
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
  std::memcpy(out, slots_[0].logits + int64_t{row} * vocab_.Vpt, sizeof(float) * vocab_.real);
}

void Gpt::ZeroGrad() {
  float* g = grad_data_;
  pool_.ParallelFor(
      static_cast<int64_t>(grads_->count()),
      [&](int64_t i0, int64_t i1) { std::memset(g + i0, 0, sizeof(float) * (i1 - i0)); }, 1 << 16);
}

float Gpt::StageForward(int slot, const int* tokens, const int* targets, const float* input, int b,
                        int t) {
  const GptConfig& cfg = config();
  const model::ModelSlice& sl = layout_.slice();
  const int C = cfg.dim, V = cfg.vocab;
  const int N = b * t;
  // Preconditions (programming errors, not data errors: the token readers
  // and Generate() validate their input): fail loudly, never corrupt memory.
  if (slot < 0 || slot >= slots() || b < 1 || b > B_ || t < 1 || t > T_) {
    std::fprintf(stderr, "Gpt::StageForward: (slot=%d, b=%d, t=%d) outside (%d, 1..%d, 1..%d)\n",
                 slot, b, t, slots(), B_, T_);
    std::abort();
  }
  if ((sl.first_stage && tokens == nullptr) || (!sl.first_stage && input == nullptr)) {
    std::fprintf(stderr, "Gpt::StageForward: the first stage reads tokens, the others input\n");
    std::abort();
  }
  for (int i = 0; i < N; ++i) {
    if ((tokens != nullptr && (tokens[i] < 0 || tokens[i] >= V)) ||
        (targets != nullptr && (targets[i] < 0 || targets[i] >= V))) {
      std::fprintf(stderr, "Gpt::StageForward: token/target at %d outside [0, %d)\n", i, V);
      std::abort();
    }
  }
  ThreadPool* pool = &pool_;
  SlotActs& s = slots_[slot];
  s.b = b;
  s.t = t;
  s.forwarded = sl.last_stage ? targets != nullptr : true;
  if (tokens != nullptr) std::memcpy(s.tokens.data(), tokens, sizeof(int) * N);
  if (targets != nullptr) std::memcpy(s.targets.data(), targets, sizeof(int) * N);
  if (profiling_) timing_ = Timing{};

  if (sl.first_stage) {
    UnitScope use(*this, layout_.wte());
    PhaseTimer tm(profiling_, &timing_.encoder);
    if (tp_ == nullptr) {
      EncoderForward(s.encoded, s.tokens.data(), param(layout_.wte()), param(layout_.wpe()), b, t,
                     C, pool);
    } else {
      VocabParallelEncoderForward(s.encoded, s.tokens.data(), param(layout_.wte()),
                                  param(layout_.wpe()), b, t, C, vocab_, tp_, pool);
    }
  } else {
    std::memcpy(s.encoded, input, sizeof(float) * N * C);
  }
  const float* residual = s.encoded;
  for (int i = 0; i < layout_.num_layers(); ++i) {
    BlockForward(layout_.first_layer() + i, s.layers[i], residual, b, t);
    residual = s.layers[i].residual3;
  }
  if (!sl.last_stage) return 0.0f;
  {
    UnitScope use(*this, layout_.lnf_w());
    PhaseTimer tm(profiling_, &timing_.layernorm);
    LayerNormForward(s.lnf, s.lnf_mean, s.lnf_rstd, residual, param(layout_.lnf_w()),
                     param(layout_.lnf_b()), N, C, pool);
  }
  {
    // LM head tied to wte; only this rank's real vocabulary columns are
    // computed (lnf enters the tp region: CopyToTpRegion, an identity).
    UnitScope use(*this, layout_.wte());
    PhaseTimer tm(profiling_, &timing_.lm_head);
    if (vocab_.real > 0) {
      MatmulForward(s.logits, s.lnf, param(layout_.wte()), static_cast<const float*>(nullptr), N, C,
                    vocab_.real, vocab_.Vpt, pool);
    }
  }
  if (targets == nullptr) return 0.0f;
  PhaseTimer tm(profiling_, &timing_.softmax_ce);
  if (tp_ == nullptr) {
    CrossEntropyForward(s.losses, s.lse, s.logits, s.targets.data(), N, V, cfg.padded_vocab, pool);
  } else {
    VocabParallelCrossEntropyForward(s.losses, s.lse, s.logits, s.targets.data(), N, vocab_, tp_,
                                     pool);
  }
  double sum = 0;
  for (int i = 0; i < N; ++i) sum += s.losses[i];
  return static_cast<float>(sum / N);
}

const float* Gpt::StageOutput(int slot) const {
  if (layout_.slice().last_stage) return nullptr;
  const SlotActs& s = slots_[slot];
  return s.layers.empty() ? s.encoded : s.layers.back().residual3;
}

void Gpt::StageBackward(int slot, float loss_scale, const float* doutput) {
  const model::ModelSlice& sl = layout_.slice();
  if (slot < 0 || slot >= slots() || !slots_[slot].forwarded ||
      (!sl.last_stage && doutput == nullptr)) {
    // precondition: a forward (with targets on the last stage) of this
    // slot, not yet backpropagated; the gradient of its output elsewhere.
    std::fprintf(
        stderr,
        "Gpt::StageBackward: no preceding Forward with targets of slot %d to backpropagate\n",
        slot);
    std::abort();
  }
  SlotActs& s = slots_[slot];
  const GptConfig& cfg = config();
  const int C = cfg.dim, b = s.b, t = s.t, N = b * t;
  const int64_t NC = int64_t{N} * C;
  ThreadPool* pool = &pool_;
  auto zero = [pool](float* p, int64_t n) { ZeroFill(p, n, pool); };
  const float* last_output = s.layers.empty() ? s.encoded : s.layers.back().residual3;
  if (sl.last_stage) {
    {
      PhaseTimer tm(profiling_, &timing_.softmax_ce);
      const float dloss = loss_scale / static_cast<float>(N);
      if (tp_ == nullptr) {
        CrossEntropyBackwardInPlace(s.logits, s.lse, s.targets.data(), dloss, N, cfg.vocab,
                                    cfg.padded_vocab, pool);
      } else {
        VocabParallelCrossEntropyBackward(s.logits, s.lse, s.targets.data(), dloss, N, vocab_,
                                          pool);
      }
    }
    zero(dresidual_, NC);
    zero(dln_, NC);
    {
      UnitScope use(*this, layout_.wte());
      PhaseTimer tm(profiling_, &timing_.lm_head);
      if (vocab_.real > 0) {
        MatmulBackward(dln_, grad(layout_.wte()), static_cast<float*>(nullptr), s.logits,
                       vocab_.Vpt, s.lnf, param(layout_.wte()), N, C, vocab_.real, pool);
      }
      CopyToTpRegion::Backward(tp_, dln_, NC);
    }
    {
      UnitScope use(*this, layout_.lnf_w());
      PhaseTimer tm(profiling_, &timing_.layernorm);
      LayerNormBackward(dresidual_, grad(layout_.lnf_w()), grad(layout_.lnf_b()), dln_, last_output,
                        param(layout_.lnf_w()), s.lnf_mean, s.lnf_rstd, N, C, pool);
    }
    if (grads_ready_) grads_ready_(layout_.offset(layout_.lnf_w()));
  } else {
    std::memcpy(dresidual_, doutput, sizeof(float) * NC);
  }
  for (int i = layout_.num_layers() - 1; i >= 0; --i) {
    const int l = layout_.first_layer() + i;
    BlockBackward(l, s.layers[i], i == 0 ? s.encoded : s.layers[i - 1].residual3, b, t);
    if (grads_ready_) grads_ready_(layout_.offset(layout_.block_tensor(l, BlockTensor(0))));
  }
  if (sl.first_stage) {
    PhaseTimer tm(profiling_, &timing_.encoder);
    if (tp_ == nullptr) {
      EncoderBackward(grad(layout_.wte()), grad(layout_.wpe()), dresidual_, s.tokens.data(), b, t,
                      C);
    } else {
      VocabParallelEncoderBackward(grad(layout_.wte()), grad(layout_.wpe()), dresidual_,
                                   s.tokens.data(), b, t, C, vocab_);
    }
  }
  s.forwarded = false;
  if (sl.has_embeddings() && grads_ready_) grads_ready_(0);
}

}  // namespace shardtrain::engine::cpu
