// The model families' layers as free functions over explicit buffers, forward
// and backward side by side (llm.c style). Shape letters: see common/model/config.h; N is
// the number of rows (N = B*T). Unless stated, buffers are row-major and
// contiguous, backward functions ACCUMULATE (+=) into every gradient output,
// and `pool` may be null (serial). A weight's gradient output (dweight,
// dbias, and the norms' and matmul's) may be null: a frozen weight (LoRA),
// whose gradient is not computed.
//
// Every kernel is a template on the float type F; float is the engine, double
// is instantiated for the finite-difference tests.
#ifndef SHARDTRAIN_WORKER_ENGINE_CPU_LAYERS_H_
#define SHARDTRAIN_WORKER_ENGINE_CPU_LAYERS_H_

#include <cstdint>

#include "worker/engine/thread_pool.h"

namespace shardtrain::engine::cpu {

// C (M,N) = alpha * op(A) · op(B) + beta * C, row-major, op(X) = X or X^T,
// with leading dimensions lda/ldb/ldc. Splits the larger of M and N across
// the pool; each thread calls a single-threaded OpenBLAS gemm.
template <typename F>
void Gemm(bool trans_a, bool trans_b, int M, int N, int K, F alpha, const F* A, int lda, const F* B,
          int ldb, F beta, F* C, int ldc, ThreadPool* pool);

// ---- encoder: token + position embedding ----
// inp (B,T) token ids in [0,V); wte (Vp,C); wpe (context,C) or null (no
// learned positions: rotary models); out (B,T,C). pos (T): the position in
// its sequence of each of the T columns (context parallelism holds chunks
// of the sequence); null: column t is position t.
template <typename F>
void EncoderForward(F* out, const int* inp, const F* wte, const F* wpe, int B, int T, int C,
                    ThreadPool* pool, const int* pos = nullptr);
// dwte (Vp,C) += scatter of dout rows; dwpe (context,C) += sum over B (dwpe
// may be null). Serial (token ids may repeat).
template <typename F>
void EncoderBackward(F* dwte, F* dwpe, const F* dout, const int* inp, int B, int T, int C,
                     const int* pos = nullptr);

// ---- layernorm over the last dim, eps 1e-5 ----
// inp, out (N,C); weight, bias (C); saves mean, rstd (N) for backward.
template <typename F>
void LayerNormForward(F* out, F* mean, F* rstd, const F* inp, const F* weight, const F* bias, int N,
                      int C, ThreadPool* pool);
// dinp (N,C), dweight, dbias (C) += ; uses inp, weight, mean, rstd.
template <typename F>
void LayerNormBackward(F* dinp, F* dweight, F* dbias, const F* dout, const F* inp, const F* weight,
                       const F* mean, const F* rstd, int N, int C, ThreadPool* pool);

// ---- RMSNorm over the last dim (Llama) ----
// out = inp · rstd · weight with rstd = 1 / sqrt(mean(inp²) + eps); inp, out
// (N,C); weight (C); saves rstd (N) for backward.
template <typename F>
void RmsNormForward(F* out, F* rstd, const F* inp, const F* weight, F eps, int N, int C,
                    ThreadPool* pool);
// dinp (N,C), dweight (C) += ; uses inp, weight, rstd.
template <typename F>
void RmsNormBackward(F* dinp, F* dweight, const F* dout, const F* inp, const F* weight,
                     const F* rstd, int N, int C, ThreadPool* pool);

// ---- RMSNorm over each head (Qwen3's q_norm, k_norm) ----
// x (N, ld): in each row, `heads` consecutive heads of hs channels from
// column 0 (pass x offset to the first head's column) are normalised in
// place: x = x · rstd · weight, one rstd per (row, head) and weight (hs)
// shared by the heads. Saves the values before, pre (N, ld_stat·hs): head h
// of row r at (r·ld_stat + h)·hs, and rstd (N, ld_stat) at r·ld_stat + h
// (ld_stat >= heads: q's and k's heads share one saved buffer).
template <typename F>
void HeadRmsNormForward(F* x, int ld, F* pre, F* rstd, int ld_stat, const F* weight, F eps, int N,
                        int heads, int hs, ThreadPool* pool);
// In place: dx (N, ld), laid out as x, holds the normalised values'
// gradient and is OVERWRITTEN with the gradient of the values before;
// dweight (hs) += ; uses pre, rstd and weight as saved.
template <typename F>
void HeadRmsNormBackward(F* dx, int ld, F* dweight, const F* pre, const F* rstd, int ld_stat,
                         const F* weight, int N, int heads, int hs, ThreadPool* pool);

// ---- rotary position embedding (RoPE) ----
// x (B,T,ld): in each row, `heads` consecutive heads of hs channels from
// column 0 (q's heads, then k's: the qkv layout puts them side by side) are
// rotated in place, pair (2i, 2i+1) of a head at position t by the angle of
// table (context, hs/2, [cos, sin]) (model::RotaryTable): (x0, x1) ->
// (x0 cos - x1 sin, x0 sin + x1 cos). `inverse` rotates by minus the angle:
// the backward of the rotation (applied to the rotated tensors' gradients).
// pos (T): each column's position, as for the encoder (null: t).
template <typename F>
void RotaryForward(F* x, const float* table, int B, int T, int heads, int hs, int ld, bool inverse,
                   ThreadPool* pool, const int* pos = nullptr);

// ---- matmul (torch.nn.Linear) ----
// out (N,OC) with row stride ld_out = inp (N,C) · weight(OC,C)^T + bias (OC);
// bias may be null. Saves nothing (backward needs inp and weight).
template <typename F>
void MatmulForward(F* out, const F* inp, const F* weight, const F* bias, int N, int C, int OC,
                   int ld_out, ThreadPool* pool);
// dinp (N,C) += dout · weight; dweight (OC,C) += dout^T · inp;
// dbias (OC) += column sums of dout (dbias may be null). dout (N,OC) has row
// stride ld_dout.
template <typename F>
void MatmulBackward(F* dinp, F* dweight, F* dbias, const F* dout, int ld_dout, const F* inp,
                    const F* weight, int N, int C, int OC, ThreadPool* pool);

// ---- causal self-attention, multi-head or grouped-query ----
// qkv (B,T,C+2KV) = [Q | K | V] with KV = KVH·hs, hs = C/NH: query head h
// uses channels [h*hs, (h+1)*hs) of Q and key/value head h / (NH/KVH) of K
// and V (KVH == NH: multi-head attention, [Q | K | V] of 3C). out (B,T,C);
// saves att (B,NH,T,T) = softmax(Q K^T / sqrt(hs)) with zeros above the
// diagonal.
template <typename F>
void AttentionForward(F* out, F* att, const F* qkv, int B, int T, int C, int NH, int KVH,
                      ThreadPool* pool);
// dqkv (B,T,C+2KV) += ; uses qkv and att (the heads of a group add into their
// shared K and V gradients in head order). scratch: B*NH*T*T elements (no
// per-call allocation).
template <typename F>
void AttentionBackward(F* dqkv, const F* dout, const F* qkv, const F* att, F* scratch, int B, int T,
                       int C, int NH, int KVH, ThreadPool* pool);

// ---- attention by blocks of keys (context parallelism's ring) ----
// The queries of qkv (B,Tq,C+2KV) attend one block of keys and values kv
// (B,Tk,2KV) = [K | V] (another rank's, or this rank's own), causal by
// position: key j is visible to query i when pos_k[j] <= pos_q[i] (pos_q
// (Tq), pos_k (Tk): positions in the sequence). The block's result merges
// into the running out (B,Tq,C) and lse (B,NH,Tq) (each row's logsumexp of
// the scores seen so far) as the softmax over the union of the key sets:
// with lse' = log(e^lse + e^lse_blk), out' = e^(lse − lse') out +
// e^(lse_blk − lse') out_blk. `first`: out and lse are set, not merged (the
// first block must hold each row's own position, so every row sees a key).
// blk_out (B,Tq,C), blk_lse (B,NH,Tq) and scores (B·NH·Tq·Tk): scratch for
// the block's own result before the merge. Over every block, out equals
// AttentionForward's rows.
template <typename F>
void AttentionBlockForward(F* out, F* lse, F* blk_out, F* blk_lse, const F* qkv, const F* kv,
                           const int* pos_q, const int* pos_k, int B, int Tq, int Tk, int C, int NH,
                           int KVH, bool first, F* scores, ThreadPool* pool);
// D (B,NH,T) = per head, each row's dout · out (the softmax backward's
// row term, the same for every block).
template <typename F>
void AttentionRowDot(F* D, const F* dout, const F* out, int B, int T, int C, int NH,
                     ThreadPool* pool);
// One block's share of the gradients, from the final out's lse and D: the
// queries' columns of dqkv (B,Tq,C+2KV) +=, dkv (B,Tk,2KV) +=. scores,
// dscores: B·NH·Tq·Tk scratch each. Over every block, equals
// AttentionBackward.
template <typename F>
void AttentionBlockBackward(F* dqkv, F* dkv, const F* dout, const F* qkv, const F* kv, const F* lse,
                            const F* D, const int* pos_q, const int* pos_k, int B, int Tq, int Tk,
                            int C, int NH, int KVH, F* scores, F* dscores, ThreadPool* pool);
// kv (B,T,2KV) = the [K | V] columns of qkv (B,T,C+2KV); and its backward,
// dqkv's K and V columns += dkv.
template <typename F>
void CopyKv(F* kv, const F* qkv, int B, int T, int C, int KV, ThreadPool* pool);
template <typename F>
void AddKvGrad(F* dqkv, const F* dkv, int B, int T, int C, int KV, ThreadPool* pool);

// ---- GELU, tanh approximation (GPT-2; torch approximate='tanh') ----
// inp, out (N). Backward uses inp.
template <typename F>
void GeluForward(F* out, const F* inp, int64_t N, ThreadPool* pool);
template <typename F>
void GeluBackward(F* dinp, const F* inp, const F* dout, int64_t N, ThreadPool* pool);

// ---- SwiGLU (Llama's MLP activation) ----
// inp (N, 2H) = [gate | up] per row; out (N, H) = silu(gate) ⊙ up with
// silu(g) = g·σ(g). Backward: dinp (N, 2H) += [dout ⊙ up ⊙ silu'(gate) |
// dout ⊙ silu(gate)]; uses inp.
template <typename F>
void SwiGluForward(F* out, const F* inp, int N, int H, ThreadPool* pool);
template <typename F>
void SwiGluBackward(F* dinp, const F* inp, const F* dout, int N, int H, ThreadPool* pool);

// ---- residual add ----
// out = inp1 + inp2, all (N). Backward: dinp1 += dout, dinp2 += dout.
template <typename F>
void ResidualForward(F* out, const F* inp1, const F* inp2, int64_t N, ThreadPool* pool);
template <typename F>
void ResidualBackward(F* dinp1, F* dinp2, const F* dout, int64_t N, ThreadPool* pool);

// ---- fused softmax + cross-entropy over the real vocab ----
// logits (N,Vp) row stride Vp; only columns [0,V) are read (padding is never
// part of the softmax). targets (N). Writes losses (N) = lse - logit[target]
// and saves lse (N) = log-sum-exp of each row for backward.
template <typename F>
void CrossEntropyForward(F* losses, F* lse, const F* logits, const int* targets, int N, int V,
                         int Vp, ThreadPool* pool);
// In place: logits[i][j] becomes dL/dlogit = (softmax_j - 1{j==t_i}) * dloss
// for j < V, where L = dloss * sum_i losses[i]. Columns >= V are untouched.
// This OVERWRITES (does not accumulate) the logits.
template <typename F>
void CrossEntropyBackwardInPlace(F* logits, const F* lse, const int* targets, F dloss, int N, int V,
                                 int Vp, ThreadPool* pool);

}  // namespace shardtrain::engine::cpu

#endif  // SHARDTRAIN_WORKER_ENGINE_CPU_LAYERS_H_
