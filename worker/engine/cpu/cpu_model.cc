#include "worker/engine/cpu/cpu_model.h"

#include <cblas.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/engine/cpu/layers.h"
#include "worker/engine/cpu/lora_layers.h"
#include "worker/engine/cpu/quant_matmul.h"

namespace shardtrain::engine::cpu {
namespace {

using model::ModelConfig;

float* F(void* p) { return static_cast<float*>(p); }
const float* F(const void* p) { return static_cast<const float*>(p); }

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

absl::StatusOr<std::unique_ptr<CpuModel>> CpuModel::Create(const ModelConfig& config, int B, int T,
                                                           int threads,
                                                           const ModelEngineOptions& options) {
  if (auto s = ValidateModelEngine(config, B, T, options); !s.ok()) return s;
  if (options.activations.flash_attention) {
    return absl::InvalidArgumentError(
        "flash attention is the CUDA engine's (activations.flash_attention on a CPU engine)");
  }
  if (threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat("threads must be >= 1, got ", threads));
  }
  return std::unique_ptr<CpuModel>(new CpuModel(config, B, T, threads, options));
}

CpuModel::CpuModel(const ModelConfig& config, int B, int T, int threads,
                   const ModelEngineOptions& options)
    : ModelEngine(config, B, T, options, DataType::kFloat32),
      vocab_(
          VocabShardOf(config.vocab, config.padded_vocab, options.slice.tp, options.slice.tp_rank)),
      pool_(threads) {
  // The pool drives OpenBLAS: one BLAS thread per pool thread (process-wide).
  openblas_set_num_threads(1);
  const size_t n = layout().num_params();
  // The CPU device holds fp32: allocating fp32 cannot fail but by aborting.
  params_ = *device_.Allocate(n, DataType::kFloat32);
  grads_ = *device_.Allocate(n, DataType::kFloat32);
  param_data_ = params_->as<float>();
  grad_data_ = grads_->as<float>();
  if (config.lora.on()) {
    model::FrozenFormat format = options.frozen;
    format.compute_bytes = 4;
    frozen_ = std::make_unique<quant::FrozenWeights>(frozen_layout(), format, &pool_);
    // Frozen tensors keep their names (and offsets) in the frozen layout.
    frozen_index_.assign(layout().tensors().size(), -1);
    for (int i = 0; i < static_cast<int>(layout().tensors().size()); ++i) {
      const model::TensorInfo& t = layout().tensors()[i];
      if (t.frozen) frozen_index_[i] = *frozen_layout().FindTensor(t.name);
    }
  }
  // Every activation and scratch tensor where the model's table puts it: one
  // set of the saved tensors per slot, then the scratch ones, in one buffer.
  acts_ = *device_.Allocate(static_cast<size_t>(activation_alloc_bytes() / sizeof(float)),
                            DataType::kFloat32);
  BindActivations(acts_->as<char>());
}

void CpuModel::ReadLogits(int row, float* out) const {
  std::memcpy(out, logits() + int64_t{row} * vocab_.Vpt, sizeof(float) * vocab_.real);
}

void CpuModel::ZeroGrad() { Zero(grad_data_, static_cast<int64_t>(grads_->count())); }

float CpuModel::StageForward(int slot, const int* tokens, const int* targets, const float* input,
                             int b, int t) {
  if (profiling_) timing_ = Timing{};
  return ModelEngine::StageForward(slot, tokens, targets, input, b, t);
}

const float* CpuModel::StageOutput(int k) const {
  if (PipelineLast(slot(k))) return nullptr;
  return F(LastOutput(slot(k)));
}

// ---- the layers

void CpuModel::EncoderForward(SlotActs& s) {
  PhaseTimer tm(profiling_, &timing_.encoder);
  const int C = config().dim;
  if (tp() == nullptr) {
    cpu::EncoderForward(F(s.encoded), s.tokens.data(), param(layout().wte()), param(layout().wpe()),
                        s.b, s.t, C, &pool_, positions());
  } else if (sequence_parallel()) {
    VocabParallelEncoderForward(F(sp_full()), s.tokens.data(), param(layout().wte()),
                                param(layout().wpe()), s.b, s.t, C, vocab_, tp(), &pool_,
                                F(s.encoded), positions());
  } else {
    VocabParallelEncoderForward(F(s.encoded), s.tokens.data(), param(layout().wte()),
                                param(layout().wpe()), s.b, s.t, C, vocab_, tp(), &pool_, nullptr,
                                positions());
  }
}

void CpuModel::EncoderBackward(const SlotActs& s, const void* dout) {
  PhaseTimer tm(profiling_, &timing_.encoder);
  const int C = config().dim;
  if (grad(layout().wte()) == nullptr) return;  // frozen embeddings (LoRA)
  if (tp() == nullptr) {
    cpu::EncoderBackward(grad(layout().wte()), grad(layout().wpe()), F(dout), s.tokens.data(), s.b,
                         s.t, C, positions());
  } else {
    VocabParallelEncoderBackward(grad(layout().wte()), grad(layout().wpe()), F(dout),
                                 s.tokens.data(), s.b, s.t, C, vocab_, positions());
  }
}

void CpuModel::CopyFromFloat32(void* dst, const float* src, int64_t n) {
  std::memcpy(dst, src, sizeof(float) * n);
}

void CpuModel::Zero(void* p, int64_t n) {
  float* x = F(p);
  pool_.ParallelFor(
      n, [&](int64_t i0, int64_t i1) { std::memset(x + i0, 0, sizeof(float) * (i1 - i0)); },
      1 << 14);
}

void CpuModel::LayerNormForward(void* out, float* mean, float* rstd, const void* inp, int weight,
                                int bias, int N, int C) {
  PhaseTimer tm(profiling_, &timing_.layernorm);
  cpu::LayerNormForward(F(out), mean, rstd, F(inp), param(weight), param(bias), N, C, &pool_);
}

void CpuModel::LayerNormBackward(void* dinp, const void* dout, const void* inp, const float* mean,
                                 const float* rstd, int weight, int bias, int N, int C) {
  PhaseTimer tm(profiling_, &timing_.layernorm);
  cpu::LayerNormBackward(F(dinp), grad(weight), grad(bias), F(dout), F(inp), param(weight), mean,
                         rstd, N, C, &pool_);
}

void CpuModel::MatmulForward(void* out, const void* inp, int weight, int bias, int N, int IC,
                             int OC, int ld_out) {
  PhaseTimer tm(profiling_, &timing_.matmul);
  if (const quant::QuantWeightView* q = quantized(weight); q != nullptr) {
    QuantMatmulForward(F(out), ld_out, F(inp), *q, param(bias), N, frozen_->tile(),
                       model::kDequantTileRows, &pool_);
    return;
  }
  cpu::MatmulForward(F(out), F(inp), param(weight), bias < 0 ? nullptr : param(bias), N, IC, OC,
                     ld_out, &pool_);
}

void CpuModel::MatmulBackward(void* dinp, const void* dout, int ld_dout, const void* inp,
                              int weight, int bias, int N, int IC, int OC) {
  PhaseTimer tm(profiling_, &timing_.matmul);
  if (const quant::QuantWeightView* q = quantized(weight); q != nullptr) {
    // Frozen: the input's gradient alone (the bias is frozen with it).
    QuantMatmulBackwardInput(F(dinp), F(dout), ld_dout, *q, N, frozen_->tile(),
                             model::kDequantTileRows, &pool_);
    return;
  }
  cpu::MatmulBackward(F(dinp), grad(weight), bias < 0 ? nullptr : grad(bias), F(dout), ld_dout,
                      F(inp), param(weight), N, IC, OC, &pool_);
}

void CpuModel::AddBias(void* out, int bias, int N, int OC) {
  PhaseTimer tm(profiling_, &timing_.matmul);
  float* o = F(out);
  const float* b = param(bias);
  pool_.ParallelFor(
      N,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          for (int c = 0; c < OC; ++c) o[r * OC + c] += b[c];
        }
      },
      64);
}

void CpuModel::RmsNormForward(void* out, float* rstd, const void* inp, int weight, int N, int C) {
  PhaseTimer tm(profiling_, &timing_.layernorm);
  cpu::RmsNormForward(F(out), rstd, F(inp), param(weight), static_cast<float>(config().norm_eps), N,
                      C, &pool_);
}

void CpuModel::RmsNormBackward(void* dinp, const void* dout, const void* inp, const float* rstd,
                               int weight, int N, int C) {
  PhaseTimer tm(profiling_, &timing_.layernorm);
  cpu::RmsNormBackward(F(dinp), grad(weight), F(dout), F(inp), param(weight), rstd, N, C, &pool_);
}

void CpuModel::RotaryForward(void* qkv, int b, int t, int NHt, int KVHt, bool inverse) {
  PhaseTimer tm(profiling_, &timing_.attention);
  const int hs = config().head_dim();
  cpu::RotaryForward(F(qkv), rotary_table().data(), b, t, NHt + KVHt, hs, (NHt + 2 * KVHt) * hs,
                     inverse, &pool_, positions());
}

void CpuModel::QkNormForward(void* qkv, void* pre, float* rstd, int wq, int wk, int N, int NHt,
                             int KVHt) {
  PhaseTimer tm(profiling_, &timing_.layernorm);
  const int hs = config().head_dim(), ld = (NHt + 2 * KVHt) * hs, heads = NHt + KVHt;
  const float eps = static_cast<float>(config().norm_eps);
  float* x = F(qkv);
  float* p = F(pre);
  cpu::HeadRmsNormForward(x, ld, p, rstd, heads, param(wq), eps, N, NHt, hs, &pool_);
  cpu::HeadRmsNormForward(x + NHt * hs, ld, p + NHt * hs, rstd + NHt, heads, param(wk), eps, N,
                          KVHt, hs, &pool_);
}

void CpuModel::QkNormBackward(void* dqkv, const void* pre, const float* rstd, int wq, int wk, int N,
                              int NHt, int KVHt) {
  PhaseTimer tm(profiling_, &timing_.layernorm);
  const int hs = config().head_dim(), ld = (NHt + 2 * KVHt) * hs, heads = NHt + KVHt;
  float* d = F(dqkv);
  const float* p = F(pre);
  cpu::HeadRmsNormBackward(d, ld, grad(wq), p, rstd, heads, param(wq), N, NHt, hs, &pool_);
  cpu::HeadRmsNormBackward(d + NHt * hs, ld, grad(wk), p + NHt * hs, rstd + NHt, heads, param(wk),
                           N, KVHt, hs, &pool_);
}

void CpuModel::AttentionForward(void* out, void* att, void* scratch, const void* qkv, int b, int t,
                                int Ct, int NHt, int KVHt) {
  PhaseTimer tm(profiling_, &timing_.attention);
  cpu::AttentionForward(F(out), F(att), F(qkv), b, t, Ct, NHt, KVHt, &pool_);
}

void CpuModel::AttentionBackward(void* dqkv, void* scratch, const void* dout, const void* qkv,
                                 const void* /*out*/, const void* att, int b, int t, int Ct,
                                 int NHt, int KVHt) {
  PhaseTimer tm(profiling_, &timing_.attention);
  cpu::AttentionBackward(F(dqkv), F(dout), F(qkv), F(att), F(scratch), b, t, Ct, NHt, KVHt, &pool_);
}

void CpuModel::AttentionBlockForward(void* out, float* lse, void* blk_out, float* blk_lse,
                                     void* scores, const void* qkv, const void* kv,
                                     const int* pos_q, const int* pos_k, int b, int t, int Ct,
                                     int NHt, int KVHt, bool first) {
  PhaseTimer tm(profiling_, &timing_.attention);
  cpu::AttentionBlockForward(F(out), lse, F(blk_out), blk_lse, F(qkv), F(kv), pos_q, pos_k, b, t, t,
                             Ct, NHt, KVHt, first, F(scores), &pool_);
}

void CpuModel::AttentionRowDot(float* D, const void* dout, const void* out, int b, int t, int Ct,
                               int NHt) {
  PhaseTimer tm(profiling_, &timing_.attention);
  cpu::AttentionRowDot(D, F(dout), F(out), b, t, Ct, NHt, &pool_);
}

void CpuModel::AttentionBlockBackward(void* dqkv, void* dkv, void* scores, void* dscores,
                                      const void* dout, const void* qkv, const void* kv,
                                      const float* lse, const float* D, const int* pos_q,
                                      const int* pos_k, int b, int t, int Ct, int NHt, int KVHt) {
  PhaseTimer tm(profiling_, &timing_.attention);
  cpu::AttentionBlockBackward(F(dqkv), F(dkv), F(dout), F(qkv), F(kv), lse, D, pos_q, pos_k, b, t,
                              t, Ct, NHt, KVHt, F(scores), F(dscores), &pool_);
}

void CpuModel::CopyKv(void* kv, const void* qkv, int b, int t, int Ct, int KVt) {
  cpu::CopyKv(F(kv), F(qkv), b, t, Ct, KVt, &pool_);
}

void CpuModel::AddKvGrad(void* dqkv, const void* dkv, int b, int t, int Ct, int KVt) {
  cpu::AddKvGrad(F(dqkv), F(dkv), b, t, Ct, KVt, &pool_);
}

void CpuModel::SwiGluForward(void* out, const void* inp, int N, int H) {
  PhaseTimer tm(profiling_, &timing_.gelu);
  cpu::SwiGluForward(F(out), F(inp), N, H, &pool_);
}

void CpuModel::SwiGluBackward(void* dinp, const void* inp, const void* dout, int N, int H) {
  PhaseTimer tm(profiling_, &timing_.gelu);
  cpu::SwiGluBackward(F(dinp), F(inp), F(dout), N, H, &pool_);
}

void CpuModel::GeluForward(void* out, const void* inp, int64_t n) {
  PhaseTimer tm(profiling_, &timing_.gelu);
  cpu::GeluForward(F(out), F(inp), n, &pool_);
}

void CpuModel::GeluBackward(void* dinp, const void* inp, const void* dout, int64_t n) {
  PhaseTimer tm(profiling_, &timing_.gelu);
  cpu::GeluBackward(F(dinp), F(inp), F(dout), n, &pool_);
}

void CpuModel::ResidualForward(void* out, const void* inp1, const void* inp2, int64_t n) {
  PhaseTimer tm(profiling_, &timing_.residual);
  cpu::ResidualForward(F(out), F(inp1), F(inp2), n, &pool_);
}

void CpuModel::LmHeadForward(SlotActs& s) {
  PhaseTimer tm(profiling_, &timing_.lm_head);
  if (vocab_.real > 0) {
    cpu::MatmulForward(F(s.logits), F(s.lnf), param(layout().lm_head()),
                       static_cast<const float*>(nullptr), s.b * s.t, config().dim, vocab_.real,
                       vocab_.Vpt, &pool_);
  }
}

double CpuModel::CrossEntropyForward(SlotActs& s) {
  PhaseTimer tm(profiling_, &timing_.softmax_ce);
  const int N = s.b * s.t;
  if (tp() == nullptr) {
    cpu::CrossEntropyForward(s.losses, s.lse, F(s.logits), s.targets.data(), N, config().vocab,
                             config().padded_vocab, &pool_);
  } else {
    VocabParallelCrossEntropyForward(s.losses, s.lse, F(s.logits), s.targets.data(), N, vocab_,
                                     tp(), &pool_);
  }
  double sum = 0;
  for (int i = 0; i < N; ++i) sum += s.losses[i];
  return sum;
}

void CpuModel::CrossEntropyBackward(SlotActs& s, float dloss) {
  PhaseTimer tm(profiling_, &timing_.softmax_ce);
  const int N = s.b * s.t;
  if (tp() == nullptr) {
    CrossEntropyBackwardInPlace(F(s.logits), s.lse, s.targets.data(), dloss, N, config().vocab,
                                config().padded_vocab, &pool_);
  } else {
    VocabParallelCrossEntropyBackward(F(s.logits), s.lse, s.targets.data(), dloss, N, vocab_,
                                      &pool_);
  }
}

void CpuModel::LmHeadBackward(SlotActs& s, void* dln) {
  PhaseTimer tm(profiling_, &timing_.lm_head);
  if (vocab_.real > 0) {
    cpu::MatmulBackward(F(dln), grad(layout().lm_head()), static_cast<float*>(nullptr), F(s.logits),
                        vocab_.Vpt, F(s.lnf), param(layout().lm_head()), s.b * s.t, config().dim,
                        vocab_.real, &pool_);
  }
}

void CpuModel::LoraForward(void* out, int ld, const void* in, int A, int B, int N, int in_dim,
                           int out_dim) {
  PhaseTimer tm(profiling_, &timing_.matmul);
  cpu::LoraForward<float>(F(out), ld, F(lora_xa()), F(in), param(A), param(B),
                          static_cast<float>(config().lora.scale()), N, in_dim, out_dim,
                          config().lora.rank, &pool_);
}

void CpuModel::LoraBackward(void* dinp, const void* dout, int ld, const void* in, int A, int B,
                            int N, int in_dim, int out_dim) {
  PhaseTimer tm(profiling_, &timing_.matmul);
  const int r = config().lora.rank;
  // The product in · A^T again (not saved: N·r per target is cheap next to
  // the frozen GEMM).
  cpu::Gemm<float>(false, true, N, r, in_dim, 1.0f, F(in), in_dim, param(A), in_dim, 0.0f,
                   F(lora_xa()), r, &pool_);
  cpu::LoraBackward<float>(F(dinp), grad(A), grad(B), F(lora_g()), F(dout), ld, F(in), F(lora_xa()),
                           param(A), param(B), static_cast<float>(config().lora.scale()), N, in_dim,
                           out_dim, r, &pool_);
}

void CpuModel::TpAllReduceSum(void* x, int64_t n) {
  tp()->AllReduceSum(F(x), static_cast<size_t>(n));
}

void CpuModel::TpAllGather(void* full, const void* local, int64_t n) {
  tp()->AllGather(static_cast<const float*>(local), F(full), static_cast<size_t>(n));
}

void CpuModel::TpReduceScatter(void* local, const void* full, int64_t n) {
  tp()->ReduceScatterSum(static_cast<const float*>(full), F(local), static_cast<size_t>(n));
}

}  // namespace shardtrain::engine::cpu
