// ModelEngine's transformer block (model_engine.h): the norms, the
// attention and the MLP, forward and backward, over the device's layers,
// with Megatron-LM's tensor-parallel regions around the projections.
#include <cstdint>

#include "common/model/lora.h"
#include "worker/engine/model_engine.h"
#include "worker/engine/model_engine_internal.h"

namespace shardtrain::engine {

using model::BlockTensor;
using model::kAttnProjB, model::kAttnProjW, model::kFcB, model::kFcProjB, model::kFcProjW,
    model::kFcW, model::kKNormW, model::kLn1B, model::kLn1W, model::kLn2B, model::kLn2W,
    model::kQkvB, model::kQkvW, model::kQNormW;

// One transformer block, forward and backward, for the tp-local part of a
// tensor-parallel slice (Megatron-LM): the attention's qkv projection and the
// MLP's fc (SwiGLU's gate and up) are column-parallel (this rank's heads /
// hidden units: its input enters the tp region through CopyToTpRegion, an
// identity in forward), the
// two output projections row-parallel (their partial outputs leave it through
// ReduceFromTpRegion, then the replicated bias is added). With tp = 1 every
// region function is a no-op and the projections add their bias inside the
// matmul.
const void* ModelEngine::RowParallelForward(const void* inp, int weight, int bias, int N, int IC,
                                            int OC) {
  if (tp_ == nullptr) {
    MatmulForward(proj_out_, inp, weight, bias, N, IC, OC, OC);
    return proj_out_;
  }
  MatmulForward(proj_out_, inp, weight, -1, N, IC, OC, OC);
  return ReduceRowParallel(proj_out_, bias, N, OC);
}

const void* ModelEngine::AdaptedRowParallelForward(int l, model::LoraTarget target, const void* inp,
                                                   int weight, int bias, int N, int IC, int OC) {
  // The adapter adds to the partial output before the reduction: this
  // rank's columns of A give its share of in · A^T, summed with the rest.
  MatmulForward(proj_out_, inp, weight, tp_ == nullptr ? bias : -1, N, IC, OC, OC);
  LoraForwardSites(l, target, target, proj_out_, inp, N);
  return tp_ == nullptr ? proj_out_ : ReduceRowParallel(proj_out_, bias, N, OC);
}

const void* ModelEngine::ReduceRowParallel(void* partial, int bias, int N, int OC) {
  if (!sp_) {
    ReduceFromTpRegionForward(partial, int64_t{N} * OC);
    if (bias >= 0) AddBias(partial, bias, N, OC);
    return partial;
  }
  // ReduceScatterToSequenceRegion: this rank's rows of the sum.
  const int Nl = LocalRows(N);
  TpReduceScatter(sp_local_, partial, int64_t{Nl} * OC);
  if (bias >= 0) AddBias(sp_local_, bias, Nl, OC);
  return sp_local_;
}

void ModelEngine::LoraForward(void*, int, const void*, int, int, int, int, int) {
  Fail("LoRA adapters are not implemented on this device");
}

void ModelEngine::LoraBackward(void*, const void*, int, const void*, int, int, int, int, int) {
  Fail("LoRA adapters are not implemented on this device");
}

// Calls f(A, site, offset) for layer l's adapters of targets [first, last]
// that the layout has: A its tensor (B is A + 1), offset the bytes of its
// first output column in a fused row.
template <typename F>
void ForEachLoraSite(const model::ParamLayout& layout, size_t elem, int l, int first, int last,
                     F f) {
  for (int t = first; t <= last; ++t) {
    const int A = layout.lora_tensor(l, model::LoraTarget(t), false);
    if (A < 0) continue;
    const model::LoraSite site =
        model::LoraTargetSite(layout.config(), model::LoraTarget(t), layout.slice().tp);
    f(A, site, static_cast<size_t>(site.first_col) * elem);
  }
}

void ModelEngine::LoraForwardSites(int l, int first, int last, void* out, const void* in, int N) {
  ForEachLoraSite(layout_, DataTypeSize(table_.compute()), l, first, last,
                  [&](int A, const model::LoraSite& site, size_t offset) {
                    LoraForward(static_cast<char*>(out) + offset, static_cast<int>(site.row), in, A,
                                A + 1, N, static_cast<int>(site.in), static_cast<int>(site.out));
                  });
}

void ModelEngine::LoraBackwardSites(int l, int first, int last, void* dinp, const void* dout,
                                    const void* in, int N) {
  ForEachLoraSite(layout_, DataTypeSize(table_.compute()), l, first, last,
                  [&](int A, const model::LoraSite& site, size_t offset) {
                    LoraBackward(dinp, static_cast<const char*>(dout) + offset,
                                 static_cast<int>(site.row), in, A, A + 1, N,
                                 static_cast<int>(site.in), static_cast<int>(site.out));
                  });
}

void ModelEngine::NormForward(void* out, float* mean, float* rstd, const void* inp, int weight,
                              int bias, int N) {
  if (config().norm == model::NormKind::kRmsNorm) {
    RmsNormForward(out, rstd, inp, weight, N, config().dim);
  } else {
    LayerNormForward(out, mean, rstd, inp, weight, bias, N, config().dim);
  }
}

void ModelEngine::NormBackward(void* dinp, const void* dout, const void* inp, const float* mean,
                               const float* rstd, int weight, int bias, int N) {
  if (config().norm == model::NormKind::kRmsNorm) {
    RmsNormBackward(dinp, dout, inp, rstd, weight, N, config().dim);
  } else {
    LayerNormBackward(dinp, dout, inp, mean, rstd, weight, bias, N, config().dim);
  }
}

// Layer widths below: the dense MLP's (Ft) is the layer's, config.mlp_dim(l)
// (an MoE layer's shared experts); `l` comes with each call.
void ModelEngine::MlpActForward(int l, void* out, const void* fch, int N) {
  const int Ft = config().mlp_dim(l) / layout_.slice().tp;
  if (config().mlp == model::MlpKind::kSwiGlu) {
    SwiGluForward(out, fch, N, Ft);
  } else {
    GeluForward(out, fch, int64_t{N} * Ft);
  }
}

void ModelEngine::MlpActBackward(int l, void* dfch, const void* fch, const void* dout, int N) {
  const int Ft = config().mlp_dim(l) / layout_.slice().tp;
  if (config().mlp == model::MlpKind::kSwiGlu) {
    SwiGluBackward(dfch, fch, dout, N, Ft);
  } else {
    GeluBackward(dfch, fch, dout, int64_t{N} * Ft);
  }
}

void ModelEngine::MlpInForward(int l, LayerActs& a, const void* inp, int N) {
  const int C = config().dim, FCt = config().fc_rows(config().mlp_dim(l) / layout_.slice().tp);
  const int weight = layout_.block_tensor(l, kFcW), bias = layout_.block_tensor(l, kFcB);
  // Adapters add to the fc's output before the activation: not fused then.
  const bool adapted = layout_.lora_tensor(l, model::kLoraGate, false) >= 0 ||
                       layout_.lora_tensor(l, model::kLoraUp, false) >= 0;
  if (config().mlp == model::MlpKind::kGelu && !adapted &&
      MatmulGeluForward(a.fch_act, a.fch, inp, weight, bias, N, C, FCt)) {
    return;
  }
  MatmulForward(a.fch, inp, weight, bias, N, C, FCt, FCt);
  LoraForwardSites(l, model::kLoraGate, model::kLoraUp, a.fch, inp, N);
  MlpActForward(l, a.fch_act, a.fch, N);
}

void ModelEngine::MlpOutBackward(int l, const LayerActs& a, const void* dout, int N) {
  const int C = config().dim, Ft = config().mlp_dim(l) / layout_.slice().tp;
  const int FCt = config().fc_rows(Ft);
  const int weight = layout_.block_tensor(l, kFcProjW), bias = layout_.block_tensor(l, kFcProjB);
  const bool adapted = layout_.lora_tensor(l, model::kLoraDown, false) >= 0;
  if (config().mlp == model::MlpKind::kGelu && !adapted &&
      MatmulDGeluBackward(dfch_, dout, C, a.fch_act, a.fch, weight, bias, N, Ft, C)) {
    return;
  }
  MatmulBackwardOverwrite(dfch_act_, dout, C, a.fch_act, weight, bias, N, Ft, C);
  LoraBackwardSites(l, model::kLoraDown, model::kLoraDown, dfch_act_, dout, a.fch_act, N);
  Zero(dfch_, int64_t{N} * FCt);  // the activation's backward adds into it
  MlpActBackward(l, dfch_, a.fch, dfch_act_, N);
}

void ModelEngine::BlockForward(int l, LayerActs& a, const void* residual, int b, int t) {
  UnitScope use(*this, layout_.block_tensor(l, kLn1W));
  BlockForwardMath(l, a, residual, b, t, /*refill=*/false);
}

void ModelEngine::BlockForwardMath(int l, LayerActs& a, const void* residual, int b, int t,
                                   bool refill) {
  const model::ModelConfig& cfg = config();
  const int C = cfg.dim, tp = layout_.slice().tp;
  // Qt: the attention's width on this rank (NHt·hs; C/tp unless head_dim is set).
  const int Qt = cfg.q_dim() / tp, NHt = cfg.heads / tp, KVHt = cfg.kv_heads / tp, N = b * t,
            Nl = LocalRows(N);
  const int QKVt = cfg.qkv_dim() / tp, Ft = cfg.mlp_dim(l) / tp;
  const int64_t NlC = int64_t{Nl} * C;
  auto w = [&](BlockTensor bt) { return layout_.block_tensor(l, bt); };
  // The residual stream and the norms: Nl rows (all of them without
  // sequence parallelism); the tp region between them: all N rows.
  NormForward(a.ln1, a.ln1_mean, a.ln1_rstd, residual, w(kLn1W), w(kLn1B), Nl);
  const void* qkv_in = GatherFromSequenceRegionForward(a.ln1, NlC);
  MatmulForward(a.qkv, qkv_in, w(kQkvW), w(kQkvB), N, C, QKVt, QKVt);
  LoraForwardSites(l, model::kLoraQ, model::kLoraV, a.qkv, qkv_in, N);
  if (cfg.qk_norm) QkNormForward(a.qkv, a.qk_pre, a.qk_rstd, w(kQNormW), w(kKNormW), N, NHt, KVHt);
  if (cfg.positions == model::PositionKind::kRotary) {
    RotaryForward(a.qkv, b, t, NHt, KVHt, /*inverse=*/false);
  }
  if (cp_ != nullptr) {
    RingAttentionForward(a, b, t);
  } else {
    AttentionForward(a.atty, a.att, att_scratch_, a.qkv, b, t, Qt, NHt, KVHt);
  }
  ResidualForward(
      a.residual2, residual,
      AdaptedRowParallelForward(l, model::kLoraO, a.atty, w(kAttnProjW), w(kAttnProjB), N, Qt, C),
      NlC);
  NormForward(a.ln2, a.ln2_mean, a.ln2_rstd, a.residual2, w(kLn2W), w(kLn2B), Nl);
  const void* mlp_in = GatherFromSequenceRegionForward(a.ln2, NlC);
  if (cfg.moe_layer(l)) {
    MoeMlpForward(l, a, mlp_in, N, /*record=*/!refill);
    if (refill) return;
    // The shared experts' output bias is added once, after the reduction.
    ResidualForward(a.residual3, a.residual2, ReduceRowParallel(moe_out_, w(kFcProjB), N, C), NlC);
    return;
  }
  MlpInForward(l, a, mlp_in, N);
  if (refill) return;
  ResidualForward(
      a.residual3, a.residual2,
      AdaptedRowParallelForward(l, model::kLoraDown, a.fch_act, w(kFcProjW), w(kFcProjB), N, Ft, C),
      NlC);
}

void ModelEngine::Refill(int l, LayerActs& a, const void* residual, int b, int t) {
  if (policy_.recompute == model::Recompute::kFull) {
    BlockForwardMath(l, a, residual, b, t, /*refill=*/true);
    return;
  }
  // Selective: the softmax probabilities from the saved qkv. The output is
  // the saved atty again; it goes to proj_out_ (N·max(C, Qt)), unused here.
  // Under context parallelism or flash attention nothing: the probabilities
  // are recomputed in backward anyway (the saved att is their logsumexp).
  if (cp_ != nullptr || policy_.flash_attention) return;
  const int tp = layout_.slice().tp;
  AttentionForward(proj_out_, a.att, att_scratch_, a.qkv, b, t, config().q_dim() / tp,
                   config().heads / tp, config().kv_heads / tp);
}

void ModelEngine::BlockBackward(int l, LayerActs& a, const void* residual, int b, int t) {
  UnitScope use(*this, layout_.block_tensor(l, kLn1W));
  const model::ModelConfig& cfg = config();
  const int C = cfg.dim, tp = layout_.slice().tp;
  const int Qt = cfg.q_dim() / tp, NHt = cfg.heads / tp, KVHt = cfg.kv_heads / tp, N = b * t,
            Nl = LocalRows(N);
  const int QKVt = cfg.qkv_dim() / tp, FCt = cfg.fc_rows(cfg.mlp_dim(l) / tp);
  const int64_t NlC = int64_t{Nl} * C;
  auto w = [&](BlockTensor bt) { return layout_.block_tensor(l, bt); };
  if (a.recompute) Refill(l, a, residual, b, t);
  // Where a norm's input gradient lands: dln_ itself (all rows, summed over
  // tp in place), or this rank's rows of it under sequence parallelism.
  void* const dln_rows = sp_ ? sp_local_ : dln_;
  // residual3 = residual2 + fcproj: both receive dresidual (in place). The
  // row-parallel projections' backward is the identity side of their region
  // (or the all-gather of dresidual's rows): their output gradient is whole
  // on every rank.
  if (cfg.moe_layer(l)) {
    MoeMlpBackward(l, a, ReduceScatterToSequenceRegionBackward(dresidual_, NlC), a.ln2, N);
  } else {
    MlpOutBackward(l, a, ReduceScatterToSequenceRegionBackward(dresidual_, NlC), N);
    // Sequence parallelism keeps ln2's rows only: gathered again for fc's
    // weight gradient (as Megatron-LM does).
    const void* fc_in = GatherFromSequenceRegionForward(a.ln2, NlC);
    MatmulBackwardOverwrite(dln_, dfch_, FCt, fc_in, w(kFcW), w(kFcB), N, C, FCt);
    LoraBackwardSites(l, model::kLoraGate, model::kLoraUp, dln_, dfch_, fc_in, N);
  }
  GatherFromSequenceRegionBackward(dln_rows, dln_, NlC);
  NormBackward(dresidual_, dln_rows, a.residual2, a.ln2_mean, a.ln2_rstd, w(kLn2W), w(kLn2B), Nl);
  // residual2 = residual + attproj: both receive dresidual (in place).
  Zero(dqkv_, int64_t{N} * QKVt);
  const void* dproj = ReduceScatterToSequenceRegionBackward(dresidual_, NlC);
  MatmulBackwardOverwrite(datty_, dproj, C, a.atty, w(kAttnProjW), w(kAttnProjB), N, Qt, C);
  LoraBackwardSites(l, model::kLoraO, model::kLoraO, datty_, dproj, a.atty, N);
  if (cp_ != nullptr) {
    RingAttentionBackward(a, b, t);
  } else {
    AttentionBackward(dqkv_, att_scratch_, datty_, a.qkv, a.atty, a.att, b, t, Qt, NHt, KVHt);
  }
  if (cfg.positions == model::PositionKind::kRotary) {
    RotaryForward(dqkv_, b, t, NHt, KVHt, /*inverse=*/true);  // dL/d(q, k before rotation)
  }
  if (cfg.qk_norm) QkNormBackward(dqkv_, a.qk_pre, a.qk_rstd, w(kQNormW), w(kKNormW), N, NHt, KVHt);
  const void* qkv_in = GatherFromSequenceRegionForward(a.ln1, NlC);
  MatmulBackwardOverwrite(dln_, dqkv_, QKVt, qkv_in, w(kQkvW), w(kQkvB), N, C, QKVt);
  LoraBackwardSites(l, model::kLoraQ, model::kLoraV, dln_, dqkv_, qkv_in, N);
  GatherFromSequenceRegionBackward(dln_rows, dln_, NlC);
  NormBackward(dresidual_, dln_rows, residual, a.ln1_mean, a.ln1_rstd, w(kLn1W), w(kLn1B), Nl);
}

}  // namespace shardtrain::engine
