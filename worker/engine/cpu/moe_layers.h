// The Mixture-of-Experts MLP's layers on the CPU, as three seams (after
// Megatron-Core's transformer/moe): the router (scores and the top-K choice),
// the dispatcher's local part (permute the tokens into per-expert blocks and
// combine them back) and the grouped experts (one GEMM per expert block). The
// all-to-all of expert parallelism sits between permute and the experts and
// is not here: one rank is the same code with no exchange.
//
// Shape letters (with layers.h's): N rows (tokens), C channels, E experts,
// K top_k (experts per token), H an expert's hidden width (the MLP's F; F
// names the float type in code), F1 = H (GELU) or 2H (SwiGLU: [gate | up]),
// M the (token, slot) pairs kept by the dispatcher (M <= N·K). A pair (t, k)
// has index t·K + k.
//
// As in layers.h: row-major contiguous buffers, backward functions
// ACCUMULATE (+=) into every gradient output, `pool` may be null (serial),
// templates on F are instantiated for float (the engine) and double (the
// finite-difference tests). Shared experts are a dense MLP added to the
// output: layers.h's, nothing here.
#ifndef SHARDTRAIN_WORKER_ENGINE_CPU_MOE_LAYERS_H_
#define SHARDTRAIN_WORKER_ENGINE_CPU_MOE_LAYERS_H_

#include "common/model/config.h"
#include "worker/engine/thread_pool.h"

namespace shardtrain::engine::cpu {

// How the router turns logits into scores (config.h): softmax over the E
// experts or an independent sigmoid per expert.
using RouterScoring = model::RouterScoring;

// ---- router ----
// logits (N,E) = x (N,C) · wr (E,C)^T; scores (N,E) = softmax or sigmoid of
// each row's logits. Per token, experts (N,K) = the K experts with the
// largest score[e] + bias[e], in decreasing order of that key, a tie going to
// the lower expert index (every rank routes alike). bias (E) is the
// aux-loss-free balancing bias (DeepSeek-V3; null: none): it only chooses,
// it never weighs. gates (N,K) = the chosen experts' scores (no bias),
// divided by their sum when norm_topk_prob. Overwrites logits, scores,
// experts, gates; backward needs x, wr, scores and experts. K <= E.
template <typename F>
void RouterForward(F* logits, F* scores, int* experts, F* gates, const F* x, const F* wr,
                   const float* bias, int N, int C, int E, int K, RouterScoring scoring,
                   bool norm_topk_prob, ThreadPool* pool);
// The router's backward from dgates (N,K); the choice of experts is piecewise
// constant and passes no gradient. dscores (N,E) += the gates' gradient on
// the scores: on entry it holds the other terms' gradient on the scores (the
// balancing loss's, AuxLossBackward; zeros when none). dlogits (N,E) += the
// gradient of all of dscores through the softmax/sigmoid: on entry it holds
// the other terms' gradient on the logits (the z-loss's, ZLossBackward; zeros
// when none). Then, from all of dlogits, dx (N,C) += dlogits · wr and
// dwr (E,C) += dlogits^T · x.
template <typename F>
void RouterBackward(F* dx, F* dwr, F* dscores, F* dlogits, const F* dgates, const F* x, const F* wr,
                    const F* scores, const int* experts, int N, int C, int E, int K,
                    RouterScoring scoring, bool norm_topk_prob, ThreadPool* pool);

// ---- load and the balancing losses ----
// load (E) = how many of the N·K (token, slot) pairs of experts (N,K) chose
// each expert, before any capacity drop. Overwrites load.
void ExpertLoad(int* load, const int* experts, int N, int K, int E);

// The Switch/GShard auxiliary loss: aux = coef · E · Σ_e f_e · P_e with
// f_e = load[e] / Σ_j load[j] (a constant: no gradient; the N·K pairs of
// these tokens, or under context parallelism the whole sequences' pairs,
// summed over the ranks) and P_e = the mean over the
// N tokens of p[t,e], the token's probability of expert e: p = scores for
// softmax scoring; for sigmoid scoring p[t,e] = scores[t,e] / Σ_j scores[t,j]
// (DeepSeek-V3's normalisation, so that a balanced router gives coef in both
// scorings). load (E) from ExpertLoad. Returns aux, summed serially in
// token order (the same value on every run).
template <typename F>
F AuxLossForward(const F* scores, const int* load, int N, int E, int K, RouterScoring scoring,
                 F coef);
// dscores (N,E) += d(dloss · aux) / dscores.
template <typename F>
void AuxLossBackward(F* dscores, const F* scores, const int* load, int N, int E, int K,
                     RouterScoring scoring, F coef, F dloss, ThreadPool* pool);

// The router z-loss (ST-MoE): z = coef · mean over the N tokens of
// (logsumexp_e logits[t,e])², for either scoring. Returns z (serial, in
// token order).
template <typename F>
F ZLossForward(const F* logits, int N, int E, F coef);
// dlogits (N,E) += d(dloss · z) / dlogits.
template <typename F>
void ZLossBackward(F* dlogits, const F* logits, int N, int E, F coef, F dloss, ThreadPool* pool);

// The aux-loss-free balancing update (DeepSeek-V3), between steps:
// bias[e] += rate · sign(mean_e load − load[e]) (sign 0 at equality), then
// the mean of bias is subtracted from every entry (the choice only depends
// on differences; centring keeps the bias from drifting). load (E): the
// step's tokens per expert summed over every rank, so that every rank's bias
// stays identical. bias (E) is updated in place; nothing else is touched.
void AuxFreeBiasUpdate(float* bias, const int* load, int E, float rate);

// ---- dispatch: permute and combine (the dispatcher's local part) ----
// Groups the N·K (token, slot) pairs of experts (N,K) by expert, stably (an
// expert's pairs in token order, then slot order). capacity > 0: an expert
// keeps its first `capacity` pairs in that order and DROPS the rest (they
// are in no block and contribute 0 to the output); capacity <= 0: no limit.
// Overwrites counts (E) = kept pairs per expert, offsets (E+1) = their
// exclusive prefix sum (M = offsets[E] rows in all; expert e's block is rows
// [offsets[e], offsets[e+1])), pair_of_row (M, room for N·K) = the pair index
// t·K + k of each row, row_of_pair (N·K) = the row of each pair, or -1 when
// dropped. Returns the number of dropped pairs (N·K − M).
int BuildPermutation(int* counts, int* offsets, int* pair_of_row, int* row_of_pair,
                     const int* experts, int N, int K, int E, int capacity);

// xp (M,C): row r = x (N,C)'s row of the token of pair pair_of_row[r].
// Overwrites xp.
template <typename F>
void PermuteForward(F* xp, const F* x, const int* pair_of_row, int M, int K, int C,
                    ThreadPool* pool);
// dx (N,C) += for each token, the dxp (M,C) rows of its kept pairs.
template <typename F>
void PermuteBackward(F* dx, const F* dxp, const int* row_of_pair, int N, int K, int C,
                     ThreadPool* pool);

// out (N,C) = Σ_k gates[t,k] · y[row_of_pair[t·K+k]] over the token's kept
// pairs, in slot order; a token whose pairs were all dropped gets zeros.
// y (M,C), gates (N,K). Overwrites out.
template <typename F>
void CombineForward(F* out, const F* y, const F* gates, const int* row_of_pair, int N, int K, int C,
                    ThreadPool* pool);
// dy (M,C) += gates[t,k] · dout[t] on each kept pair's row; dgates (N,K) +=
// dout[t] · y[row] for each kept pair (nothing for a dropped one). Uses y
// and gates.
template <typename F>
void CombineBackward(F* dy, F* dgates, const F* dout, const F* y, const F* gates,
                     const int* row_of_pair, int N, int K, int C, ThreadPool* pool);

// ---- grouped experts ----
// Every expert's MLP on its block of xp (M,C), rows [offsets[e],
// offsets[e+1]), one GEMM per non-empty expert (an empty one is skipped):
//   h_pre (M,F1) = xp · w1[e] (F1,C)^T + b1[e] (F1),
//   h (M,H) = gelu(h_pre) (mlp kGelu, F1 = H) or, per row [gate | up],
//             silu(gate) ⊙ up (kSwiGlu, F1 = 2H, layers.h's SwiGLU layout),
//   y (M,C) = h · w2[e] (C,H)^T + b2[e] (C).
// w1 (E,F1,C), w2 (E,C,H); b1 (E,F1), b2 (E,C) may each be null (no bias).
// offsets (E+1) from BuildPermutation. Overwrites y and saves h_pre, h for
// backward.
template <typename F>
void ExpertsForward(F* y, F* h_pre, F* h, const F* xp, const F* w1, const F* b1, const F* w2,
                    const F* b2, const int* offsets, int E, int C, int H, model::MlpKind mlp,
                    ThreadPool* pool);
// dxp (M,C) +=, dw1 (E,F1,C) +=, dw2 (E,C,H) +=, db1 (E,F1) +=, db2 (E,C) +=
// (db1, db2 may be null) from dy (M,C); uses xp, w1, w2, h_pre, h. dh (M,H)
// and dh_pre (M,F1): scratch, overwritten. An expert with no rows gets no
// gradient.
template <typename F>
void ExpertsBackward(F* dxp, F* dw1, F* db1, F* dw2, F* db2, F* dh, F* dh_pre, const F* dy,
                     const F* xp, const F* w1, const F* w2, const F* h_pre, const F* h,
                     const int* offsets, int E, int C, int H, model::MlpKind mlp, ThreadPool* pool);

}  // namespace shardtrain::engine::cpu

#endif  // SHARDTRAIN_WORKER_ENGINE_CPU_MOE_LAYERS_H_
