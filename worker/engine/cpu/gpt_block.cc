// One transformer block of the CPU engine, forward and backward, for the
// tp-local part of a tensor-parallel slice (Megatron-LM): the attention's
// qkv projection and the MLP's fc are column-parallel (this rank's heads /
// hidden units: its input enters the tp region through CopyToTpRegion),
// the two output projections row-parallel (their partial outputs leave it
// through ReduceFromTpRegion, then the replicated bias is added). With
// tp = 1 every region function is a no-op and the projections add their
// bias inside the matmul, as before tensor parallelism.
#include <cstring>

#include "worker/engine/cpu/gpt.h"
#include "worker/engine/cpu/gpt_internal.h"
#include "worker/engine/cpu/layers.h"

namespace shardtrain::engine::cpu {

using model::BlockTensor;
using model::kAttnProjB, model::kAttnProjW, model::kFcB, model::kFcProjB, model::kFcProjW,
    model::kFcW, model::kLn1B, model::kLn1W, model::kLn2B, model::kLn2W, model::kQkvB, model::kQkvW;

void Gpt::RowParallelForward(float* out, const float* inp, const float* weight, const float* bias,
                             int N, int IC, int OC) {
  if (tp_ == nullptr) {
    MatmulForward(out, inp, weight, bias, N, IC, OC, OC, &pool_);
    return;
  }
  MatmulForward(out, inp, weight, static_cast<const float*>(nullptr), N, IC, OC, OC, &pool_);
  ReduceFromTpRegion::Forward(tp_, out, static_cast<size_t>(N) * OC);
  pool_.ParallelFor(
      N,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          float* o = out + r * OC;
          for (int c = 0; c < OC; ++c) o[c] += bias[c];
        }
      },
      64);
}

void Gpt::BlockForward(int l, LayerActs& a, const float* residual, int b, int t) {
  UnitScope use(*this, layout_.block_tensor(l, kLn1W));
  const int C = config().dim, tp = layout_.slice().tp;
  const int Ct = C / tp, NHt = config().heads / tp, N = b * t;
  ThreadPool* pool = &pool_;
  auto w = [&](BlockTensor bt) { return param(layout_.block_tensor(l, bt)); };
  {
    PhaseTimer tm(profiling_, &timing_.layernorm);
    LayerNormForward(a.ln1, a.ln1_mean, a.ln1_rstd, residual, w(kLn1W), w(kLn1B), N, C, pool);
  }
  {
    PhaseTimer tm(profiling_, &timing_.matmul);
    CopyToTpRegion::Forward(tp_, a.ln1, int64_t{N} * C);
    MatmulForward(a.qkv, a.ln1, w(kQkvW), w(kQkvB), N, C, 3 * Ct, 3 * Ct, pool);
  }
  {
    PhaseTimer tm(profiling_, &timing_.attention);
    AttentionForward(a.atty, a.att, a.qkv, b, t, Ct, NHt, pool);
  }
  {
    PhaseTimer tm(profiling_, &timing_.matmul);
    RowParallelForward(proj_out_, a.atty, w(kAttnProjW), w(kAttnProjB), N, Ct, C);
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
    CopyToTpRegion::Forward(tp_, a.ln2, int64_t{N} * C);
    MatmulForward(a.fch, a.ln2, w(kFcW), w(kFcB), N, C, 4 * Ct, 4 * Ct, pool);
  }
  {
    PhaseTimer tm(profiling_, &timing_.gelu);
    GeluForward(a.fch_gelu, a.fch, int64_t{N} * 4 * Ct, pool);
  }
  {
    PhaseTimer tm(profiling_, &timing_.matmul);
    RowParallelForward(proj_out_, a.fch_gelu, w(kFcProjW), w(kFcProjB), N, 4 * Ct, C);
  }
  {
    PhaseTimer tm(profiling_, &timing_.residual);
    ResidualForward(a.residual3, a.residual2, proj_out_, int64_t{N} * C, pool);
  }
}

void Gpt::BlockBackward(int l, LayerActs& a, const float* residual, int b, int t) {
  UnitScope use(*this, layout_.block_tensor(l, kLn1W));
  const int C = config().dim, tp = layout_.slice().tp;
  const int Ct = C / tp, NHt = config().heads / tp, N = b * t;
  const int64_t NC = int64_t{N} * C, NCt = int64_t{N} * Ct;
  ThreadPool* pool = &pool_;
  auto zero = [pool](float* p, int64_t n) { ZeroFill(p, n, pool); };
  auto w = [&](BlockTensor bt) { return param(layout_.block_tensor(l, bt)); };
  auto dw = [&](BlockTensor bt) { return grad(layout_.block_tensor(l, bt)); };
  // residual3 = residual2 + fcproj: both receive dresidual (in place). The
  // row-parallel projections' backward is the identity side of their region:
  // dresidual is whole on every rank.
  zero(dfch_gelu_, NCt * 4);
  zero(dfch_, NCt * 4);
  {
    PhaseTimer tm(profiling_, &timing_.matmul);
    MatmulBackward(dfch_gelu_, dw(kFcProjW), dw(kFcProjB), dresidual_, C, a.fch_gelu, w(kFcProjW),
                   N, 4 * Ct, C, pool);
  }
  {
    PhaseTimer tm(profiling_, &timing_.gelu);
    GeluBackward(dfch_, a.fch, dfch_gelu_, NCt * 4, pool);
  }
  zero(dln_, NC);
  {
    PhaseTimer tm(profiling_, &timing_.matmul);
    MatmulBackward(dln_, dw(kFcW), dw(kFcB), dfch_, 4 * Ct, a.ln2, w(kFcW), N, C, 4 * Ct, pool);
    CopyToTpRegion::Backward(tp_, dln_, NC);
  }
  {
    PhaseTimer tm(profiling_, &timing_.layernorm);
    LayerNormBackward(dresidual_, dw(kLn2W), dw(kLn2B), dln_, a.residual2, w(kLn2W), a.ln2_mean,
                      a.ln2_rstd, N, C, pool);
  }
  // residual2 = residual + attproj: both receive dresidual (in place).
  zero(datty_, NCt);
  zero(dqkv_, NCt * 3);
  {
    PhaseTimer tm(profiling_, &timing_.matmul);
    MatmulBackward(datty_, dw(kAttnProjW), dw(kAttnProjB), dresidual_, C, a.atty, w(kAttnProjW), N,
                   Ct, C, pool);
  }
  {
    PhaseTimer tm(profiling_, &timing_.attention);
    AttentionBackward(dqkv_, datty_, a.qkv, a.att, att_scratch_, b, t, Ct, NHt, pool);
  }
  zero(dln_, NC);
  {
    PhaseTimer tm(profiling_, &timing_.matmul);
    MatmulBackward(dln_, dw(kQkvW), dw(kQkvB), dqkv_, 3 * Ct, a.ln1, w(kQkvW), N, C, 3 * Ct, pool);
    CopyToTpRegion::Backward(tp_, dln_, NC);
  }
  {
    PhaseTimer tm(profiling_, &timing_.layernorm);
    LayerNormBackward(dresidual_, dw(kLn1W), dw(kLn1B), dln_, residual, w(kLn1W), a.ln1_mean,
                      a.ln1_rstd, N, C, pool);
  }
}

}  // namespace shardtrain::engine::cpu
