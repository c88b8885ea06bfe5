// The CUDA engine's layers as launchers over explicit device buffers, the
// twins of engine/cpu/layers.h (same names, shapes and accumulation rules),
// so each can be tested against its CPU layer: every model family's layers
// (GPT-2's LayerNorm, learned positions, GELU; Llama's RMSNorm, rotary
// positions, SwiGLU, grouped-query attention). Shape letters: see
// common/model/config.h; N is the number of rows (N = B*T).
//
// Types. `void*` tensors (activations, their gradients, the parameters'
// compute copies) hold the engine's compute type, `ctx.dtype`: fp32, bf16 or
// fp16. `float*` tensors are fp32 whatever the compute type: gradients of
// parameters (the fp32 master gradient, which backward ACCUMULATES into), the
// LayerNorm statistics, losses and log-sum-exps. Arithmetic is fp32 inside
// every kernel (inputs converted on load, outputs rounded on store); GEMMs
// accumulate in fp32 (CUBLAS_COMPUTE_32F: TF32 is never used, so fp32 equals
// the CPU engine to rounding).
//
// Every launcher checks its sizes (>= 0 and within int32 where a kernel
// indexes with int), enqueues its work on ctx.stream only (no host
// synchronisation, no allocation: scratch is passed in), checks the launch
// (cudaGetLastError) and returns INVALID_ARGUMENT for bad sizes or INTERNAL
// naming the kernel and the CUDA / cuBLAS error. Unless stated, backward
// launchers ACCUMULATE (+=) into every gradient output, as on the CPU.
// Reductions are deterministic (no float atomics): the same inputs give the
// same bits, run after run.
#ifndef SHARDTRAIN_WORKER_ENGINE_CUDA_KERNELS_H_
#define SHARDTRAIN_WORKER_ENGINE_CUDA_KERNELS_H_

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "common/dtype.h"

namespace shardtrain::engine::cuda {
namespace internal {
class LtAlgoCache;  // kernel_util.cuh
}  // namespace internal

// What every launcher runs with. Handles and the workspace belong to the
// caller (KernelContext below owns a set); one context per stream.
struct KernelCtx {
  cudaStream_t stream = nullptr;
  DataType dtype = DataType::kFloat32;  // the compute type of the void* tensors
  cublasLtHandle_t lt = nullptr;        // matmuls
  cublasHandle_t blas = nullptr;        // attention's strided-batched GEMMs
  void* workspace = nullptr;            // cuBLASLt workspace (device memory)
  size_t workspace_bytes = 0;
  // Each GEMM shape's algorithm, chosen once (null: the heuristic runs every
  // call). Owned by the KernelContext; one stream, one thread.
  internal::LtAlgoCache* algos = nullptr;
  // Fused paths (GEMM epilogues for bias gradients and GELU, the engine's
  // wte gradient by token, LayerNorm's one-pass backward; RMSNorm's input
  // gradient and SwiGLU in 16-byte packs): on unless the environment sets
  // SHARDTRAIN_CUDA_FUSED=0 when the context is made — the same step
  // computed the separate way, the baseline gpu_train_bench --unfused
  // measures against.
  bool fused = true;
};

// Owns a cuBLASLt and a cuBLAS handle bound to `stream`, a 32 MiB
// workspace and the GEMM algorithm cache; ctx() hands them to the
// launchers. Create fails with INTERNAL naming the call (no device:
// FAILED_PRECONDITION).
class KernelContext {
 public:
  static absl::Status Create(cudaStream_t stream, DataType dtype, KernelContext* out);
  KernelContext();
  ~KernelContext();
  KernelContext(const KernelContext&) = delete;
  KernelContext& operator=(const KernelContext&) = delete;
  const KernelCtx& ctx() const { return ctx_; }

 private:
  KernelCtx ctx_;
  std::unique_ptr<internal::LtAlgoCache> algos_;
};

// ---- conversions and fills ----
// dst (n, ctx.dtype) = src (n, fp32), rounded to nearest even.
absl::Status ConvertFromFloat32(const KernelCtx& ctx, void* dst, const float* src, int64_t n);
// dst (n, fp32) = src (n, ctx.dtype).
absl::Status ConvertToFloat32(const KernelCtx& ctx, float* dst, const void* src, int64_t n);

// ---- encoder: token + position embedding ----
// tokens (B,T) device ids in [0,V); wte (Vp,C); wpe (context,C), or null
// without learned positions (rotary models: wte alone); out (B,T,C).
absl::Status EncoderForward(const KernelCtx& ctx, void* out, const int* tokens, const void* wte,
                            const void* wpe, int B, int T, int C);
// dwte (Vp,C) += scatter of dout rows by token; dwpe (T rows of (context,C))
// += sum over B, skipped when dwpe is null. One thread per channel walks the
// rows in order: deterministic although token ids repeat.
absl::Status EncoderBackward(const KernelCtx& ctx, float* dwte, float* dwpe, const void* dout,
                             const int* tokens, int B, int T, int C);
// The vocabulary-parallel embedding (engine/cpu/vocab_parallel.h): this tp
// rank holds wte rows [v0, v0 + real) as wte_shard (real, C). Forward: out
// (B,T,C) = (token's row if this rank holds it, else 0) + wpe[t], wpe
// skipped when null (the tp sum adds it once: one rank passes it).
// Backward: dwte_shard += the rows of this rank's tokens, dwpe += every row
// (as EncoderBackward; skipped when dwpe is null).
// pos (T, device ints, distinct): column t's position in its sequence
// (context parallelism's chunks) — wpe's row pos[t] instead of t; null: t.
absl::Status EncoderForwardShard(const KernelCtx& ctx, void* out, const int* tokens,
                                 const void* wte_shard, const void* wpe, int v0, int real, int B,
                                 int T, int C, const int* pos = nullptr);
// `buckets`: the rows grouped by token (TokenBuckets below, built from these
// tokens with the same v0 and real), so the wte gradient reads each row
// once, a block per token; null: a warp per (token class, 32 channels)
// scans every token (the reference). Both add in row order per token: the
// same bits.
struct TokenBuckets;
absl::Status EncoderBackwardShard(const KernelCtx& ctx, float* dwte_shard, float* dwpe,
                                  const void* dout, const int* tokens, int v0, int real, int B,
                                  int T, int C, const int* pos = nullptr,
                                  const TokenBuckets* buckets = nullptr);
// The rows of a micro-batch grouped by token, for the wte gradient: made on
// the host (BuildTokenBuckets), copied to the device whole. data = [first
// (count) | size (count) | rows]: bucket g holds rows[first[g], first[g] +
// size[g]), the rows (indices into the B·T rows) of one token in row order;
// the largest buckets first (they take longest). Rows whose token is
// outside [v0, v0 + real) are in none.
struct TokenBuckets {
  const int* data = nullptr;  // device: 2·count + (rows kept) ints
  int count = 0;              // buckets (distinct tokens kept)
};
// Fills *out (resized; at most 3·n ints) from tokens (n, host) and returns
// the number of buckets. `counts` is scratch (resized to real; reused).
int BuildTokenBuckets(const int* tokens, int n, int v0, int real, std::vector<int>* out,
                      std::vector<int>* counts);

// ---- layernorm over the last dim, eps 1e-5 ----
// inp, out (N,C); weight, bias (C); saves mean, rstd (N, fp32).
absl::Status LayerNormForward(const KernelCtx& ctx, void* out, float* mean, float* rstd,
                              const void* inp, const void* weight, const void* bias, int N, int C);
// dinp (N,C) += ; dweight, dbias (C, fp32) += ; uses inp, weight, mean, rstd.
absl::Status LayerNormBackward(const KernelCtx& ctx, void* dinp, float* dweight, float* dbias,
                               const void* dout, const void* inp, const void* weight,
                               const float* mean, const float* rstd, int N, int C);

// ---- RMSNorm over the last dim (Llama) ----
// out = inp · rstd · weight with rstd = 1 / sqrt(mean(inp²) + eps); inp, out
// (N,C); weight (C); saves rstd (N, fp32). One warp per row.
absl::Status RmsNormForward(const KernelCtx& ctx, void* out, float* rstd, const void* inp,
                            const void* weight, float eps, int N, int C);
// dinp (N,C) += ; dweight (C, fp32) += (a fixed-order column sum, no
// atomics); uses inp, weight, rstd.
absl::Status RmsNormBackward(const KernelCtx& ctx, void* dinp, float* dweight, const void* dout,
                             const void* inp, const void* weight, const float* rstd, int N, int C);

// ---- RMSNorm over each head (Qwen3's q_norm, k_norm), in place ----
// x (N rows of ld): `heads` consecutive heads of hs channels from column 0
// (pass x offset to the first head) become x · rstd · weight (weight (hs),
// shared by the heads); saves the values before in pre ((r·ld_stat + h)·hs)
// and rstd (fp32, r·ld_stat + h). One warp per (row, head). The CPU twin is
// cpu::HeadRmsNormForward.
absl::Status HeadRmsNormForward(const KernelCtx& ctx, void* x, int ld, void* pre, float* rstd,
                                int ld_stat, const void* weight, float eps, int N, int heads,
                                int hs);
// dx, laid out as x, holds the normalised values' gradient and is
// OVERWRITTEN with the gradient of the values before; dweight (hs, fp32)
// += (a block per channel, fixed-order sums: deterministic).
absl::Status HeadRmsNormBackward(const KernelCtx& ctx, void* dx, int ld, float* dweight,
                                 const void* pre, const float* rstd, int ld_stat,
                                 const void* weight, int N, int heads, int hs);

// ---- rotary position embedding (RoPE), in place ----
// x (B,T,ld): in each row the first `heads` heads of hs channels (q's, then
// k's: side by side in the qkv rows) are rotated, pair (2i, 2i+1) of a head
// at position t = row mod T by table (context, hs/2, [cos, sin]) (device
// fp32, model::RotaryTable; T <= context): (x0, x1) -> (x0 cos - x1 sin,
// x0 sin + x1 cos); `inverse` rotates by minus the angle (the backward,
// applied to dqkv). Columns from heads·hs on are untouched. hs even, ld >=
// heads·hs. One thread per pair. pos (T, device ints): the position of
// column t (context parallelism's chunks); null: t.
absl::Status RotaryForward(const KernelCtx& ctx, void* x, const float* table, int B, int T,
                           int heads, int hs, int ld, bool inverse, const int* pos = nullptr);

// ---- matmul (torch.nn.Linear) through cuBLASLt ----
// out (N,OC) with row stride ld_out = inp (N,C) · weight (OC,C)^T + bias
// (OC); bias may be null (added as the GEMM's epilogue otherwise). Overwrites
// out.
absl::Status MatmulForward(const KernelCtx& ctx, void* out, const void* inp, const void* weight,
                           const void* bias, int N, int C, int OC, int ld_out);
// dinp (N,C) += dout · weight (dinp may be null: skipped); dweight (OC,C,
// fp32) += dout^T · inp; dbias (OC, fp32) += column sums of dout (may be
// null; with ctx.fused by the weight GEMM's BGRADB epilogue where cuBLASLt
// has one, else a column-sum kernel). dout (N,OC) has row stride ld_dout.
// overwrite_dinp: dinp = dout · weight instead (its old values unread).
absl::Status MatmulBackward(const KernelCtx& ctx, void* dinp, float* dweight, float* dbias,
                            const void* dout, int ld_dout, const void* inp, const void* weight,
                            int N, int C, int OC, bool overwrite_dinp = false);
// The MLP's GEMMs with the GELU (tanh) in their epilogues, for 16-bit
// compute: UNIMPLEMENTED — nothing ran — when !ctx.fused, a width is not a
// multiple of 8 or cuBLASLt has no such algorithm; the caller then runs
// MatmulForward + GeluForward (MatmulBackward + GeluBackward), the same
// arithmetic with the product rounded before the GELU.
// Forward: pre (N,OC) = inp (N,C) · weight (OC,C)^T + bias (null: none),
// act (N,OC) = gelu(pre); both overwritten (GELU_AUX_BIAS).
absl::Status MatmulGeluForward(const KernelCtx& ctx, void* act, void* pre, const void* inp,
                               const void* weight, const void* bias, int N, int C, int OC);
// Backward of out = act · weight^T + bias through act = gelu(pre): dpre
// (N,C) = gelu'(pre) ⊙ (dout · weight), OVERWRITTEN (DGELU); dweight
// (OC,C, fp32) += dout^T · act; dbias (OC, fp32; may be null) += column
// sums of dout. dout (N,OC) has row stride ld_dout.
absl::Status MatmulDGeluBackward(const KernelCtx& ctx, void* dpre, float* dweight, float* dbias,
                                 const void* dout, int ld_dout, const void* act, const void* pre,
                                 const void* weight, int N, int C, int OC);

// dinp, dweight and dbias of MatmulBackward and MatmulDGeluBackward may
// all be null but one: a frozen weight (LoRA) has no gradients.

// ---- LoRA adapters (matmul.cu; the CPU twin is engine/cpu/lora_layers.h),
// r the rank: A (r, IC), B (OC, r) in ctx.dtype, their gradients fp32.
// Forward: xa (N, r) = inp (N, IC) · A^T (scratch, left holding it); out
// (N, OC) with row stride ld_out += scale · xa · B^T.
absl::Status LoraForward(const KernelCtx& ctx, void* out, int ld_out, void* xa, const void* inp,
                         const void* A, const void* B, float scale, int N, int IC, int OC, int r);
// Backward from dout (N, OC) with row stride ld_dout: xa recomputed as
// above; dB += scale · dout^T · xa; g (N, r, scratch) = scale · dout · B;
// dA += g^T · inp; dinp (N, IC) += g · A (skipped when null).
absl::Status LoraBackward(const KernelCtx& ctx, void* dinp, float* dA, float* dB, void* g, void* xa,
                          const void* dout, int ld_dout, const void* inp, const void* A,
                          const void* B, float scale, int N, int IC, int OC, int r);

// ---- frozen weights in 8 or 4 bits (quant.cu; the CPU twin is
// worker/quant/weight_quant.h, whose formats these are) ----
// A quantized (rows, cols) weight in device memory: quant::QuantWeightView's
// fields, plus the 256 values of the signed dynamic map where the NF4
// blocks' absmax is double-quantized.
struct DeviceQuantWeight {
  bool int8 = false;  // else NF4
  int64_t rows = 0, cols = 0;
  const uint8_t* codes = nullptr;
  const float* absmax = nullptr;  // int8: per row; NF4: per block (null: double-quantized)
  const uint8_t* absmax_codes = nullptr;
  const float* absmax_scale = nullptr;
  float absmax_offset = 0;
  const float* dynamic_map = nullptr;  // double quantization only
};
// Rows [r0, r0 + rows) of w dequantized into tile (rows, w.cols) of
// ctx.dtype: the CPU's DequantizeRows in fp32, then rounded to ctx.dtype.
absl::Status DequantizeRows(const KernelCtx& ctx, void* tile, const DeviceQuantWeight& w,
                            int64_t r0, int64_t rows);

// ---- causal self-attention, multi-head or grouped-query ----
// qkv (B,T,C+2KV) = [Q | K | V] with KV = KVH·hs, hs = C/NH: query head h
// uses channels [h*hs, (h+1)*hs) of Q and key/value head h / (NH/KVH) of K
// and V (KVH == NH: multi-head attention, rows of 3C). out (B,T,C); att
// (B,NH,T,T) saved = softmax(Q K^T / sqrt(hs)) with zeros above the
// diagonal; scratch (B,NH,T,T) holds the pre-softmax scores. QK^T and att·V
// are strided-batched GEMMs, one call per sequence and position g in the
// group (NH/KVH calls per sequence), the KVH heads h = j·NH/KVH + g batched;
// the causal softmax one warp per row. KVH == NH is the multi-head call of
// one GEMM per sequence with the NH heads batched.
absl::Status AttentionForward(const KernelCtx& ctx, void* out, void* att, void* scratch,
                              const void* qkv, int B, int T, int C, int NH, int KVH);
// dqkv (B,T,C+2KV) += ; uses qkv and att; scratch (B,NH,T,T) is overwritten
// (dL/datt, then in place dL/dscores). The NH/KVH query heads of a group add
// into their shared dK and dV in head order, one GEMM (beta = 1) after the
// other on ctx.stream: deterministic, no atomics.
absl::Status AttentionBackward(const KernelCtx& ctx, void* dqkv, void* scratch, const void* dout,
                               const void* qkv, const void* att, int B, int T, int C, int NH,
                               int KVH);

// ---- flash attention (flash_attention.cu): no (T,T) matrix ----
// Whether the flash kernels run this attention: bf16 or fp16 compute and a
// head size hs = C/NH of 64 or 128 (KVH dividing NH). Otherwise (fp32
// among them: tensor cores would need TF32) AttentionForward/Backward run.
bool FlashAttentionSupports(DataType dtype, int C, int NH, int KVH);
// out (B,T,C) as AttentionForward's from qkv (B,T,C+2KV); lse (B,NH,T,
// fp32) the natural-log logsumexp of each row's scaled scores, all that
// backward needs besides qkv and out. Tensor-core tiles of 64 rows, online
// softmax.
absl::Status FlashAttentionForward(const KernelCtx& ctx, void* out, float* lse, const void* qkv,
                                   int B, int T, int C, int NH, int KVH);
// dqkv (B,T,C+2KV) += from dout (B,T,C), qkv, out and lse; D (B,NH,T, fp32)
// is scratch (the rows' dout · out). dK and dV by key tile (a group's heads
// in order), dQ by query tile: each element summed in a fixed order and
// added once (deterministic, no atomics).
absl::Status FlashAttentionBackward(const KernelCtx& ctx, void* dqkv, float* D, const void* dout,
                                    const void* qkv, const void* out, const float* lse, int B,
                                    int T, int C, int NH, int KVH);

// ---- attention by blocks of keys (context parallelism's ring) ----
// The twins of engine/cpu/layers.h's functions of the same names: the
// queries of qkv (B,Tq,C+2KV) against one block of keys and values kv
// (B,Tk,2KV), causal by position (pos_q (Tq), pos_k (Tk): device int
// arrays), merged into out (B,Tq,C) and lse (B,NH,Tq, fp32) by logsumexp
// (`first`: set, not merged); blk_out (B,Tq,C), blk_lse (B,NH,Tq, fp32) and
// scores (B·NH·Tq·Tk) are scratch. One warp per query row, fixed summation
// order (deterministic).
absl::Status AttentionBlockForward(const KernelCtx& ctx, void* out, float* lse, void* blk_out,
                                   float* blk_lse, void* scores, const void* qkv, const void* kv,
                                   const int* pos_q, const int* pos_k, int B, int Tq, int Tk, int C,
                                   int NH, int KVH, bool first);
// D (B,NH,T, fp32) = per head each row's dout · out.
absl::Status AttentionRowDot(const KernelCtx& ctx, float* D, const void* dout, const void* out,
                             int B, int T, int C, int NH);
// One block's share of the gradients from the final lse and D: the queries'
// columns of dqkv (B,Tq,C+2KV) +=, dkv (B,Tk,2KV) +=; scores and dscores
// (B·NH·Tq·Tk) are overwritten (the block's probabilities and their
// gradients). One warp per query row, then one per key row (the group's
// heads in order): deterministic, no atomics.
absl::Status AttentionBlockBackward(const KernelCtx& ctx, void* dqkv, void* dkv, void* scores,
                                    void* dscores, const void* dout, const void* qkv,
                                    const void* kv, const float* lse, const float* D,
                                    const int* pos_q, const int* pos_k, int B, int Tq, int Tk,
                                    int C, int NH, int KVH);
// kv (B,T,2KV) = the [K | V] columns of qkv (B,T,C+2KV); AddKvGrad: dqkv's
// K and V columns += dkv.
absl::Status CopyKv(const KernelCtx& ctx, void* kv, const void* qkv, int B, int T, int C, int KV);
absl::Status AddKvGrad(const KernelCtx& ctx, void* dqkv, const void* dkv, int B, int T, int C,
                       int KV);

// ---- GELU, tanh approximation (GPT-2; torch approximate='tanh') ----
// inp, out (n). Backward: dinp (n) += gelu'(inp) · dout.
absl::Status GeluForward(const KernelCtx& ctx, void* out, const void* inp, int64_t n);
absl::Status GeluBackward(const KernelCtx& ctx, void* dinp, const void* inp, const void* dout,
                          int64_t n);

// ---- SwiGLU (Llama's MLP activation) ----
// inp (N, 2H) = [gate | up] per row; out (N, H) = silu(gate) ⊙ up with
// silu(g) = g·σ(g). Backward: dinp (N, 2H) += [dout ⊙ up ⊙ silu'(gate) |
// dout ⊙ silu(gate)]; uses inp. One thread per element of out.
absl::Status SwiGluForward(const KernelCtx& ctx, void* out, const void* inp, int N, int H);
absl::Status SwiGluBackward(const KernelCtx& ctx, void* dinp, const void* inp, const void* dout,
                            int N, int H);

// ---- Mixture of Experts (engine/cpu/moe_layers.h's twins; E <= kMaxMoeExperts) ----
// N tokens, E experts, K slots; a pair (t, k) has index t·K + k. Scores,
// gates and their gradients are in the compute type, their arithmetic fp32.
inline constexpr int kMaxMoeExperts = 256;
// From the router's logits (N,E): scores (N,E) = softmax or sigmoid of each
// row; experts (N,K) = the K largest score + bias (E; null: none), the larger
// first, a tie to the lower expert; gates (N,K) = their scores (divided by
// their sum when norm_topk_prob). Overwrites scores, experts, gates.
absl::Status MoeRouterForward(const KernelCtx& ctx, void* scores, int* experts, void* gates,
                              const void* logits, const void* bias, int N, int E, int K,
                              bool sigmoid, bool norm_topk_prob);
// dscores (N,E) += the gates' gradient from dgates (N,K) (on entry: the
// balancing loss's gradient, or zeros); dlogits (N,E) += all of dscores
// through the softmax or sigmoid (on entry: the z-loss's, or zeros). The
// router's matmul backward (dx, its weight's gradient) is the engine's.
absl::Status MoeRouterBackward(const KernelCtx& ctx, void* dlogits, void* dscores,
                               const void* dgates, const void* scores, const int* experts, int N,
                               int E, int K, bool sigmoid, bool norm_topk_prob);
// Rows of C: dst[i] = src[index[i] / div] (div K: the permutation's
// forward from pair_of_row; 1: a regrouping), and dst[index[i]] = src[i].
// index in device memory. Overwrite.
absl::Status MoeGatherRows(const KernelCtx& ctx, void* dst, const void* src, const int* index,
                           int rows, int C, int div);
absl::Status MoeScatterRows(const KernelCtx& ctx, void* dst, const void* src, const int* index,
                            int rows, int C);
// out (N,C) = Σ_k gates[t,k] · y[row_of_pair[t·K+k]] over the kept pairs
// (row >= 0), in slot order. Overwrites out.
absl::Status MoeCombineForward(const KernelCtx& ctx, void* out, const void* y, const void* gates,
                               const int* row_of_pair, int N, int K, int C);
// dy (M,C) += gates[t,k] · dout[t] on each kept pair's row; dgates (N,K) +=
// dout[t] · y[row].
absl::Status MoeCombineBackward(const KernelCtx& ctx, void* dy, void* dgates, const void* dout,
                                const void* y, const void* gates, const int* row_of_pair, int N,
                                int K, int C);
// dx (N,C) += the dxp (M,C) rows of each token's kept pairs.
absl::Status MoePermuteBackward(const KernelCtx& ctx, void* dx, const void* dxp,
                                const int* row_of_pair, int N, int K, int C);

// ---- residual add ----
// out = inp1 + inp2, all (n). (Backward is the identity: the engine keeps
// one gradient of the residual stream.)
absl::Status ResidualForward(const KernelCtx& ctx, void* out, const void* inp1, const void* inp2,
                             int64_t n);
// dst (n) += src (n), both ctx.dtype.
absl::Status AddInPlace(const KernelCtx& ctx, void* dst, const void* src, int64_t n);
// out (N, OC) += bias (OC) on every row (a row-parallel matmul's bias, added
// once after the tp sum), both ctx.dtype.
absl::Status AddBias(const KernelCtx& ctx, void* out, const void* bias, int N, int OC);
// out (rows, C) += wpe (T rows of C)[(first + r) mod T] on row r: the
// position embeddings of a sequence-parallel rank's rows [first, first +
// rows) of the (B·T) rows, added after the tp reduce-scatter.
absl::Status AddPositionRows(const KernelCtx& ctx, void* out, const void* wpe, int64_t first,
                             int rows, int T, int C);

// ---- fused softmax + cross-entropy over the real vocab ----
// logits (N,Vp) row stride Vp, only columns [0,V) read (padding is never in
// the softmax); targets (N) device ids. Writes losses (N, fp32) = lse -
// logit[target] and saves lse (N, fp32). One block per row.
absl::Status CrossEntropyForward(const KernelCtx& ctx, float* losses, float* lse,
                                 const void* logits, const int* targets, int N, int V, int Vp);
// In place: logits[i][j] becomes (softmax_j - 1{j==t_i}) · dloss for j < V;
// columns >= V are set to 0. OVERWRITES the logits.
absl::Status CrossEntropyBackward(const KernelCtx& ctx, void* logits, const float* lse,
                                  const int* targets, float dloss, int N, int V, int Vp);
// Both in one launch (the fused classifier): losses and lse as
// CrossEntropyForward, then the logits become their gradient as
// CrossEntropyBackward with dloss — each row read twice by one block, the
// second time from L2, so the logits cross the memory bus twice instead of
// three times. targets required.
absl::Status CrossEntropyForwardBackward(const KernelCtx& ctx, float* losses, float* lse,
                                         void* logits, const int* targets, float dloss, int N,
                                         int V, int Vp);

// ---- the optimizer side, over flat fp32 buffers ----
// partial (blocks, fp32x2 as double) = per-block sums of x[i]^2 over a fixed
// grid: SquaredNormBlocks() blocks of kNormThreads threads, block k taking a
// fixed set of elements, so the result is independent of anything but n.
// The host adds `partial` in order (in double) for the norm.
constexpr int kNormThreads = 256;
int SquaredNormBlocks(int64_t n);
absl::Status SquaredNormPartial(cudaStream_t stream, double* partial, const float* x, int64_t n);
// x (n) *= s.
absl::Status ScaleFloat32(cudaStream_t stream, float* x, int64_t n, float s);
// AdamW over n elements (optim/adamw.h's rule, torch.optim.AdamW):
//   g = grads[i] · grad_scale
//   p -= lr · weight_decay · p                 (weight_decay 0: no decay)
//   m = b1 m + (1-b1) g ;  v = b2 v + (1-b2) g²
//   p -= lr · (m / bias1) / (sqrt(v / bias2) + eps)
// with bias1 = 1 - b1^t, bias2 = 1 - b2^t computed by the caller in double.
// One thread per element, fp32.
struct AdamWArgs {
  float lr = 0, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0;
  float bias1 = 1, bias2 = 1, grad_scale = 1;
};
absl::Status AdamWUpdate(cudaStream_t stream, float* params, const float* grads, float* m, float* v,
                         int64_t n, const AdamWArgs& args);
// AdamWUpdate of several ranges of the same arrays in one launch per
// kAdamWRangesPerLaunch ranges (the multi-tensor update: a model's tensors
// alternate with and without weight decay, ~8 ranges per block): range k
// is elements [begin, end) with its own weight_decay, every other
// coefficient from args (args.weight_decay unused). Per element the same
// arithmetic as AdamWUpdate: the same bits. zero_grads: each gradient is
// set to 0 once read. Ranges must not overlap.
struct AdamWRangeArgs {
  int64_t begin = 0, end = 0;
  float weight_decay = 0;
};
constexpr int kAdamWRangesPerLaunch = 128;
absl::Status AdamWUpdateRanges(cudaStream_t stream, float* params, float* grads, float* m, float* v,
                               const AdamWRangeArgs* ranges, int count, const AdamWArgs& args,
                               bool zero_grads);

// 8-bit AdamW (optim/adamw8bit.h, bitsandbytes' AdamW8bit): m and v are
// uint8 codes into the two maps times one fp32 absmax per block of
// kAdamW8bitBlock elements. A block of threads per block of elements:
// dequantize, the host's update per element with the same float operations
// in the same order (fmaf where it fuses, IEEE division and sqrt: the same
// bits), the block's new absmax, requantize to the nearest map entry (a tie
// keeps the lower). ranges: num_ranges (begin, end, decayed) uint32 triples
// in device memory, sorted; a decayed element takes p · args.decay.
// zero_grads: each gradient is set to 0 once read.
constexpr int kAdamW8bitBlock = 2048;
struct AdamW8bitArgs {
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, decay = 1.0f;
  float step_size = 0.0f, inv_sqrt_bc2 = 1.0f, grad_scale = 1.0f;
  float m_map[256] = {}, v_map[256] = {};
};
absl::Status AdamW8bitUpdate(cudaStream_t stream, float* params, float* grads, uint8_t* m,
                             float* m_absmax, uint8_t* v, float* v_absmax, int64_t n,
                             const uint32_t* ranges, int num_ranges, const AdamW8bitArgs& args,
                             bool zero_grads);

}  // namespace shardtrain::engine::cuda

#endif  // SHARDTRAIN_WORKER_ENGINE_CUDA_KERNELS_H_
