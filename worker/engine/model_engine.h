// ModelEngine: the order of a transformer step, written once for every device
// and every model family. It owns what does not depend on where the numbers
// live — the model's layout and slice, the activation table and the pointers
// carved from it for every pipeline slot, the parameter and gradient hooks
// ZeRO relies on (which unit is used when, which gradients are final when),
// the tensor-parallel regions and the stage API — and calls the device's
// layers for the arithmetic. The family is the config's recipe
// (common/model/config.h): which norm, positions, MLP and attention heads,
// biases or not, a tied head or not, each switch made here in one place.
// engine/cpu (fp32 on OpenBLAS) and engine/cuda (fp32, bf16 or fp16 on one
// GPU) supply the layers, so a fix to the sequence reaches both.
//
// Tensors the sequence hands to the layers:
//   void*   activations and their gradients, in the engine's compute type
//           (ActivationTable::compute()), in the device's memory;
//   float*  fp32 statistics (norm mean and rstd, losses, lse);
//   int     parameters, as the tensor's index in layout(): the device
//           resolves its compute copy (the fp32 master on the CPU) and its
//           fp32 gradient, which backward ACCUMULATES into. -1: no such
//           tensor (a bias of a family without biases).
// Every backward layer accumulates (+=) into its gradient outputs, as
// engine/cpu/layers.h documents.
//
// Not thread-safe: one caller at a time.
#ifndef SHARDTRAIN_WORKER_ENGINE_MODEL_ENGINE_H_
#define SHARDTRAIN_WORKER_ENGINE_MODEL_ENGINE_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "common/model/activations.h"
#include "common/model/config.h"
#include "common/model/param_layout.h"
#include "common/model/slice.h"
#include "worker/engine/context_parallel.h"
#include "worker/engine/engine.h"
#include "worker/engine/expert_parallel.h"
#include "worker/engine/model_engine_options.h"
#include "worker/engine/tensor_parallel.h"

namespace shardtrain::engine {

class ModelEngine : public Engine {
 public:
  // ---- Engine: the sequence.
  const model::ParamLayout& layout() const override { return layout_; }
  int max_batch() const override { return B_; }
  int max_seq_len() const override { return T_; }
  const model::ActivationTable& activations() const override { return table_; }
  float Forward(const int* tokens, const int* targets, int b, int t) override {
    return StageForward(0, tokens, targets, nullptr, b, t);
  }
  using Engine::Forward;
  void Backward(float loss_scale = 1.0f) override { StageBackward(0, loss_scale, nullptr); }
  void ExpectBackward(float loss_scale) override { expected_backward_ = loss_scale; }
  int slots() const override { return static_cast<int>(slots_.size()); }
  int chunks() const override { return static_cast<int>(chunk_slots_.size()); }
  int chunk_slots(int chunk) const override { return chunk_slots_[chunk]; }
  float StageForward(int slot, const int* tokens, const int* targets, const float* input, int b,
                     int t) override;
  void StageBackward(int slot, float loss_scale, const float* doutput) override;
  void set_grads_ready_hook(std::function<void(size_t offset)> hook) override {
    grads_ready_ = std::move(hook);
  }
  void set_param_hook(std::function<void(int unit, bool begin)> hook) override {
    param_hook_ = std::move(hook);
  }
  MoeStats TakeMoeStats() override;
  // Under LoRA the frozen model's layout (ParamLayout(BaseConfig(config),
  // slice)), whose tensors a device holds (frozen_layout().num_params()
  // elements: the model's own init or weights) and which layout()'s frozen
  // tensors' offsets index. Without LoRA, layout() itself.
  const model::ParamLayout& frozen_layout() const override { return base_; }

 protected:
  // The activations of one transformer block of one micro-batch (the
  // table's "block.<l>.<name>" tensors).
  struct LayerActs {
    void *ln1, *qkv, *atty, *att, *residual2, *ln2, *fch, *fch_act, *residual3;
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd;  // means: LayerNorm only (else null)
    void* qk_pre = nullptr;                            // q and k before their norms (qk_norm only)
    float* qk_rstd = nullptr;
    // An MoE layer's (null in a dense one): the router's logits, scores
    // (N, E) and gates (N, K), its chosen experts (N, K), the permutation
    // (MoeIndex), the experts' input rows, hidden pre-activations and
    // activations, outputs (moe_rows of each).
    void *router_logits = nullptr, *router_scores = nullptr, *router_gates = nullptr;
    int* router_experts = nullptr;
    int* moe_index = nullptr;
    void *moe_xp = nullptr, *moe_h_pre = nullptr, *moe_h = nullptr, *moe_y = nullptr;
    int moe_rows = 0;           // M: the (token, slot) pairs the experts received (host)
    std::vector<int> moe_load;  // (E, host) the balancing loss's load (summed over cp)
    // (E + 1, host) each expert's first row in moe_xp (MoeRouted's offsets:
    // moe_index lives in the device's memory, which the host may not read).
    std::vector<int> moe_offsets;
    // Expert parallelism (host): rows sent to and received from each ep
    // rank, the received rows' order by local expert (MoeGatherRows'
    // index) and the local experts' offsets in it (E / ep + 1); without
    // it, offsets are moe_offsets.
    std::vector<size_t> ep_send, ep_recv;
    std::vector<int> ep_gather, ep_offsets;
    int ep_rows = 0;  // the rows the local experts ran
    // Its backward first refills what the table did not save (the
    // "recompute.*" scratch tensors above point there).
    bool recompute = false;
  };
  // The saved activations of one micro-batch in flight; tokens and targets
  // are the host's copies of its ids.
  struct SlotActs {
    int chunk = 0;                  // the model chunk whose activations it keeps
    std::vector<LayerActs> layers;  // the chunk's layers, in order
    void *encoded, *lnf, *logits;
    float *lnf_mean, *lnf_rstd, *losses, *lse;
    std::vector<int> tokens, targets;
    int b = 0, t = 0;
    bool forwarded = false;  // a forward with targets (last stage) not yet backpropagated
    // The dloss the forward's fused classifier already turned the logits
    // into the gradient for (ExpectBackward); 0: the logits are logits.
    float dlogits_scale = 0.0f;
  };

  ModelEngine(const model::ModelConfig& config, int B, int T, const ModelEngineOptions& options,
              DataType compute);

  // Points every slot's and the scratch tensors into `base`, a buffer of
  // activation_alloc_bytes() bytes in the device's memory (16-byte aligned).
  void BindActivations(char* base);

  // The whole model's init (GPT-2's, for every family: normal(0, 0.02)
  // matrices, output projections scaled by 1/sqrt(2L), norm weights 1,
  // biases 0, padded vocabulary rows 0) of global elements [begin, end) into
  // host memory out[0, end - begin) (InitParamsInto in the slice's coordinates
  // maps through layout().GlobalRuns).
  void InitGlobal(uint64_t seed, size_t begin, size_t end, float* out, ThreadPool* pool) const {
    InitGlobalOf(whole_, seed, begin, end, out, pool);
  }
  // InitParamsInto's host part: the slice's elements [begin, end) into host
  // memory.
  void InitSliceHost(uint64_t seed, size_t begin, size_t end, float* out, ThreadPool* pool) const;

  TensorParallel* tp() const { return tp_; }
  const model::ActivationPolicy& policy() const { return policy_; }
  // Rotary's (context, hs/2, [cos, sin]) table (model::RotaryTable), in host
  // memory; empty without rotary positions.
  const std::vector<float>& rotary_table() const { return rotary_; }
  // Context parallelism: the position in its sequence of each of the T
  // columns (host memory), which the encoder's learned positions and
  // rotary read; null without cp (column t is position t).
  const int* positions() const { return cp_ == nullptr ? nullptr : cp_pos_[cp_->rank()].data(); }
  SlotActs& slot(int k) { return slots_[k]; }
  const SlotActs& slot(int k) const { return slots_[k]; }
  // Whether slot s's chunk is the pipeline's first (it reads tokens) or
  // last (it computes the loss): chunk 0 of the first stage, the last chunk
  // of the last.
  bool PipelineFirst(const SlotActs& s) const {
    return layout_.slice().first_stage && s.chunk == 0;
  }
  bool PipelineLast(const SlotActs& s) const {
    return layout_.slice().last_stage && s.chunk == chunks() - 1;
  }
  // Whether the last StageBackward left an input gradient (its chunk reads
  // input rather than tokens).
  bool has_input_grad() const { return has_input_grad_; }
  // Bytes of the activation buffer BindActivations carves: every chunk's
  // slots and the scratch.
  int64_t activation_alloc_bytes() const { return table_.bytes(chunk_slots_); }
  // The (b, t, C) output of slot k's last block (its input on a stage
  // without blocks).
  const void* LastOutput(const SlotActs& s) const {
    return s.layers.empty() ? s.encoded : s.layers.back().residual3;
  }
  void* dresidual() const { return dresidual_; }
  // Sequence parallelism: the residual stream holds LocalRows(N) of a
  // micro-batch's N rows, this tp rank's [rank·N/tp, (rank+1)·N/tp).
  bool sequence_parallel() const { return sp_; }
  int LocalRows(int N) const { return sp_ ? N / layout_.slice().tp : N; }
  // Scratch of B·T·C (compute type) the first stage's embeddings are summed
  // in before their reduce-scatter under sequence parallelism.
  void* sp_full() const { return sp_full_; }
  // Elements of the activation one stage sends the next (and of its
  // gradient back): (B·T/tp)·C under sequence parallelism, else B·T·C.
  size_t StageIoElements() const override {
    return size_t(LocalRows(B_ * T_)) * size_t(config().dim);
  }

  // ---- The device's layers (see the header comment for the types). Sizes:
  // N rows of B·T; widths as in engine/cpu/layers.h.
  // The first stage's embeddings of s.tokens into s.encoded (summed over tp
  // when the vocabulary is split; under sequence parallelism reduce-scattered
  // to this rank's LocalRows, sp_full() holding the partial sums).
  virtual void EncoderForward(SlotActs& s) = 0;
  // wte / wpe gradients of the embeddings from dout (b, t, C), every row.
  // (Without learned positions layout().wpe() is -1: wte alone.)
  virtual void EncoderBackward(const SlotActs& s, const void* dout) = 0;
  // dst (n, compute type) = src (n, fp32 in the device's memory: the
  // pipeline's exchange type).
  virtual void CopyFromFloat32(void* dst, const float* src, int64_t n) = 0;
  // n elements of the compute type at p set to 0.
  virtual void Zero(void* p, int64_t n) = 0;
  virtual void LayerNormForward(void* out, float* mean, float* rstd, const void* inp, int weight,
                                int bias, int N, int C) = 0;
  virtual void LayerNormBackward(void* dinp, const void* dout, const void* inp, const float* mean,
                                 const float* rstd, int weight, int bias, int N, int C) = 0;
  // RMSNorm (eps: config().norm_eps); saves rstd.
  virtual void RmsNormForward(void* out, float* rstd, const void* inp, int weight, int N,
                              int C) = 0;
  virtual void RmsNormBackward(void* dinp, const void* dout, const void* inp, const float* rstd,
                               int weight, int N, int C) = 0;
  // Rotary positions, in place on qkv (b, t, (NHt + 2·KVHt)·hs): q's NHt and
  // k's KVHt heads rotated by rotary_table() at each row's position in its
  // sequence; `inverse` rotates back (the backward, on dqkv).
  virtual void RotaryForward(void* qkv, int b, int t, int NHt, int KVHt, bool inverse) = 0;
  // The q and k norms (qk_norm recipes), in place on qkv (N, (NHt +
  // 2·KVHt)·hs): q's NHt heads by weight `wq`, k's KVHt by `wk` (eps:
  // config().norm_eps); saves pre (N, (NHt + KVHt)·hs) and rstd (N, NHt +
  // KVHt). Backward: dqkv's q and k columns, the normalised values'
  // gradient, become the gradient of the values before (overwritten);
  // the weights' gradients +=. A device without them fails (its engine's
  // Create refuses qk_norm first).
  virtual void QkNormForward(void* qkv, void* pre, float* rstd, int wq, int wk, int N, int NHt,
                             int KVHt);
  virtual void QkNormBackward(void* dqkv, const void* pre, const float* rstd, int wq, int wk, int N,
                              int NHt, int KVHt);
  // out (N, OC) row stride ld_out = inp (N, IC) · weight^T (+ bias; -1: none).
  virtual void MatmulForward(void* out, const void* inp, int weight, int bias, int N, int IC,
                             int OC, int ld_out) = 0;
  virtual void MatmulBackward(void* dinp, const void* dout, int ld_dout, const void* inp,
                              int weight, int bias, int N, int IC, int OC) = 0;
  // MatmulBackward with dinp (N, IC) set to dout · weight rather than added
  // to. Default: Zero, then MatmulBackward; a device may skip the zeros
  // (a GEMM that overwrites).
  virtual void MatmulBackwardOverwrite(void* dinp, const void* dout, int ld_dout, const void* inp,
                                       int weight, int bias, int N, int IC, int OC) {
    Zero(dinp, int64_t{N} * IC);
    MatmulBackward(dinp, dout, ld_dout, inp, weight, bias, N, IC, OC);
  }
  // out (N, OC) += bias (OC) on every row.
  virtual void AddBias(void* out, int bias, int N, int OC) = 0;
  // qkv (b, t, Ct + 2·KVHt·hs) of NHt query and KVHt key/value heads (hs =
  // Ct / NHt); out (b, t, Ct); att (b, NHt, t, t) saved — the rows'
  // logsumexp (b, NHt, t, fp32) under policy().flash_attention; scratch the
  // table's att_scratch. Backward also gets the forward's out.
  virtual void AttentionForward(void* out, void* att, void* scratch, const void* qkv, int b, int t,
                                int Ct, int NHt, int KVHt) = 0;
  virtual void AttentionBackward(void* dqkv, void* scratch, const void* dout, const void* qkv,
                                 const void* out, const void* att, int b, int t, int Ct, int NHt,
                                 int KVHt) = 0;
  virtual void GeluForward(void* out, const void* inp, int64_t n) = 0;
  virtual void GeluBackward(void* dinp, const void* inp, const void* dout, int64_t n) = 0;
  // A GEMM and the GELU in one call, where a device fuses them (the GELU in
  // the GEMM's epilogue): pre (N, OC) = inp (N, IC) · weight^T + bias (-1:
  // none), act = gelu(pre); and the backward of out = act · weight^T + bias
  // through it: dpre (N, IC) = gelu'(pre) ⊙ (dout · weight), OVERWRITTEN,
  // the weight's and bias's gradients +=. false (the default): not fused
  // here, nothing done; the engine then runs the GEMM and the GELU apart.
  virtual bool MatmulGeluForward(void* act, void* pre, const void* inp, int weight, int bias, int N,
                                 int IC, int OC) {
    return false;
  }
  virtual bool MatmulDGeluBackward(void* dpre, const void* dout, int ld_dout, const void* act,
                                   const void* pre, int weight, int bias, int N, int IC, int OC) {
    return false;
  }
  // inp (N, 2H) = [gate | up]; out (N, H) (engine/cpu/layers.h).
  virtual void SwiGluForward(void* out, const void* inp, int N, int H) = 0;
  virtual void SwiGluBackward(void* dinp, const void* inp, const void* dout, int N, int H) = 0;
  virtual void ResidualForward(void* out, const void* inp1, const void* inp2, int64_t n) = 0;
  // The LM head (layout().lm_head(): wte when tied) of s.lnf into s.logits:
  // this rank's real vocabulary columns.
  virtual void LmHeadForward(SlotActs& s) = 0;
  // s.losses and s.lse from s.logits and s.targets; returns the sum of the
  // losses (read back to the host: the step's one synchronisation).
  virtual double CrossEntropyForward(SlotActs& s) = 0;
  // s.logits become their gradient, times dloss.
  virtual void CrossEntropyBackward(SlotActs& s, float dloss) = 0;
  // Both at once where the device fuses them (without tp: the whole
  // vocabulary's lse is this rank's): *loss_sum as CrossEntropyForward's
  // result, s.logits their gradient times dloss. false (the default): not
  // fused here, nothing done.
  virtual bool CrossEntropyForwardBackward(SlotActs& s, float dloss, double* loss_sum) {
    return false;
  }
  // dln (N, C) += the LM head's input gradient; the head weight's gradient +=.
  virtual void LmHeadBackward(SlotActs& s, void* dln) = 0;
  // ---- Mixture of Experts (MoE layers; engine/cpu/moe_layers.h says what
  // each computes). The defaults fail: a device without them is refused
  // MoE before an engine is made. N tokens (rows of x), E experts, K slots;
  // `index`: a layer's moe_index as MoeIndex splits it.
  struct MoeIndex {
    int* row_of_pair;  // (N·K)
    int* pair_of_row;  // (N·K)
    int* offsets;      // (E + 1)
    int* counts;       // (E)
  };
  MoeIndex moe_index(const LayerActs& a) const;
  // What the router did for one micro-batch, in host memory: every
  // expert's (token, slot) pairs before drops, the pairs kept (M), and each
  // expert's first kept row (E + 1: moe_index's offsets, a host copy).
  struct MoeRouted {
    std::vector<int> load;
    int kept = 0;
    std::vector<int> offsets;
  };
  // The router (tensor `router`; its choice bias `bias`, -1: none) on x
  // (N, C) into a.router_*, the load and the permutation (capacity per
  // expert; <= 0: none) into a.moe_index.
  virtual MoeRouted MoeRoute(LayerActs& a, const void* x, int router, int bias, int N,
                             int capacity);
  // The balancing losses' values (with their coefficients; 0 for a zero
  // coefficient) of a routed layer: aux from `load` (E, host: the pairs
  // per expert over the whole sequences, summed over cp), z from the logits.
  struct MoeBalance {
    double aux = 0, z = 0;
  };
  virtual MoeBalance MoeBalanceLosses(const LayerActs& a, const int* load, int N);
  // xp (M, C) = x's rows in expert order.
  virtual void MoePermute(void* xp, const LayerActs& a, const void* x, int N, int M);
  // Layer l's local experts (ParamLayout::expert_tensor) on a.moe_xp's
  // `rows` rows grouped by `offsets` (E_local + 1, host memory) into y,
  // saving a.moe_h_pre and a.moe_h; with_bias2: add the output biases
  // (tp rank 0 only: y is a partial sum over tp).
  virtual void MoeExperts(int layer, LayerActs& a, void* y, const int* offsets, int rows,
                          bool with_bias2);
  // Rows of C: dst[i] = src[index[i]], and dst[index[i]] = src[i], for i <
  // n (index in host memory): expert parallelism's regrouping of the rows
  // received from each rank by local expert, and back.
  virtual void MoeGatherRows(void* dst, const void* src, const int* index, int n);
  virtual void MoeScatterRows(void* dst, const void* src, const int* index, int n);
  // out (N, C) = the gate-weighted sum of a.moe_y's rows of each token.
  virtual void MoeCombine(void* out, const LayerActs& a, int N);
  // dy (M, C) and dgates (N, K) OVERWRITTEN from dout (N, C).
  virtual void MoeCombineBackward(void* dy, void* dgates, const void* dout, const LayerActs& a,
                                  int N, int M);
  // dxp (rows, C) OVERWRITTEN from dy; dh, dh_pre scratch; the experts'
  // gradients += (the output biases' on every tp rank: replicated).
  virtual void MoeExpertsBackward(int layer, void* dxp, void* dh, void* dh_pre, const void* dy,
                                  const LayerActs& a, const int* offsets, int rows);
  // dx (N, C) += the permutation's backward of dxp (M, C).
  virtual void MoePermuteBackward(void* dx, const void* dxp, const LayerActs& a, int N);
  // dx (N, C) += the router's input gradient from dgates (N, K) and the
  // balancing losses (times dloss; load as MoeBalanceLosses read it); the
  // router's gradient +=. dscores, dlogits (N, E): scratch.
  virtual void MoeRouterBackward(void* dx, void* dscores, void* dlogits, const void* dgates,
                                 const LayerActs& a, const int* load, const void* x, int router,
                                 int N, float dloss);
  const MoeOptions& moe_options() const { return moe_; }

  // ---- LoRA adapters (config().lora; engine/cpu/lora_layers.h says what
  // each computes). A and B are the adapter's tensors (ParamLayout::
  // lora_tensor), in (N, in) the target's input, out (N, out_dim) with row
  // stride ld its output's columns; lora_xa() and lora_g() (N, rank) are the
  // table's scratch. Forward: out += scale · (in · A^T) · B^T. Backward from
  // dout (row stride ld): dinp (N, in) += its share, A's and B's gradients
  // += (the product in · A^T recomputed, not saved). The defaults fail: a
  // device without them is refused LoRA before an engine is made.
  virtual void LoraForward(void* out, int ld, const void* in, int A, int B, int N, int in_dim,
                           int out_dim);
  virtual void LoraBackward(void* dinp, const void* dout, int ld, const void* in, int A, int B,
                            int N, int in_dim, int out_dim);
  void* lora_xa() const { return lora_xa_; }
  void* lora_g() const { return lora_g_; }
  // The frozen model's init (InitGlobal of the model without adapters, so
  // it equals a plain engine's) of frozen elements [begin, end) into host
  // memory out[0, end - begin).
  void InitFrozenHost(uint64_t seed, size_t begin, size_t end, float* out, ThreadPool* pool) const;

  // ---- Attention by blocks of keys, for context parallelism's ring (called
  // only under cp; engine/cpu/layers.h's functions of the same names say
  // what each computes). lse, blk_lse and D are fp32 rows (b, NHt, t);
  // kv blocks (b, t, 2·KVHt·hs). The defaults fail: a device without them
  // is refused cp before an engine is made.
  virtual void AttentionBlockForward(void* out, float* lse, void* blk_out, float* blk_lse,
                                     void* scores, const void* qkv, const void* kv,
                                     const int* pos_q, const int* pos_k, int b, int t, int Ct,
                                     int NHt, int KVHt, bool first);
  virtual void AttentionRowDot(float* D, const void* dout, const void* out, int b, int t, int Ct,
                               int NHt);
  virtual void AttentionBlockBackward(void* dqkv, void* dkv, void* scores, void* dscores,
                                      const void* dout, const void* qkv, const void* kv,
                                      const float* lse, const float* D, const int* pos_q,
                                      const int* pos_k, int b, int t, int Ct, int NHt, int KVHt);
  virtual void CopyKv(void* kv, const void* qkv, int b, int t, int Ct, int KVt);
  virtual void AddKvGrad(void* dqkv, const void* dkv, int b, int t, int Ct, int KVt);
  // The positions of cp rank r's T columns as the block functions read them
  // (pos_q, pos_k): host memory here, a device copy on a GPU engine.
  virtual const int* CpPositions(int r) const { return cp_pos_[r].data(); }
  // One pass of the cp ring, `count` elements of the compute type from
  // `send` to the next rank and into `recv` from the previous (buffers in
  // the engine's memory, untouched until FinishRingPass): the group's
  // StartRingPass / FinishRingPass here; a GPU engine with a group of host
  // memory stages them through the host.
  virtual void StartRingPass(const void* send, void* recv, int64_t count);
  virtual void FinishRingPass();
  ContextParallel* cp() const { return cp_; }
  // Expert parallelism's exchange (EpDispatch, EpReturn): send_counts[p]
  // elements of `send` (the compute type, in the engine's memory) to each
  // ep rank p in rank order, recv_counts[p] from each into `recv`. Default:
  // the ep group's AllToAllV on the buffers themselves (host fp32: the CPU
  // engine's); a device whose buffers the group cannot take stages them
  // through host fp32.
  virtual void EpAllToAll(const void* send, const std::vector<size_t>& send_counts, void* recv,
                          const std::vector<size_t>& recv_counts);
  // The same of host fp32 arrays (EpPlan's pair counts). Default: the ep
  // group's AllToAllV; a device whose group takes device memory stages them
  // through its own.
  virtual void EpAllToAllHost(const float* send, const std::vector<size_t>& send_counts,
                              float* recv, const std::vector<size_t>& recv_counts);
  ExpertParallel* ep() const { return ep_; }
  // In place sum over the tp group (called only when tp > 1).
  virtual void TpAllReduceSum(void* x, int64_t n) = 0;
  // Sequence parallelism (called only then): full (tp·n) = every rank's
  // local (n), rank r's at r·n; local (n) = the sum over ranks of their
  // full[rank·n, +n).
  virtual void TpAllGather(void* full, const void* local, int64_t n) = 0;
  virtual void TpReduceScatter(void* local, const void* full, int64_t n) = 0;
  // Called when a unit's parameters are about to be read, after the
  // parameter hook: a mixed-precision engine refreshes the unit's compute
  // copy from its fp32 master here. `backward`: within StageBackward — the
  // parameters are those the same slot's forward read in this step (they
  // change only between steps), so a compute copy kept since then is
  // current. Default: nothing.
  virtual void OnUnitUse(int unit, bool backward) {}
  // Called when a unit's parameters are no longer read, after the parameter
  // hook (release_compute_copy gives the compute copy back here). Default:
  // nothing.
  virtual void OnUnitDone(int unit) {}
  // Precondition failures (programming errors, not data errors): print and
  // abort.
  [[noreturn]] void Fail(const char* what) const;

 private:
  class UnitScope;
  // InitGlobal over the whole layout `whole` (the model's, or under LoRA
  // the trained one's adapters: A uniform in ±1/sqrt(in), PEFT's kaiming
  // init, and B 0).
  void InitGlobalOf(const model::ParamLayout& whole, uint64_t seed, size_t begin, size_t end,
                    float* out, ThreadPool* pool) const;
  // Layer l's adapters of the targets in [first, last] (LoraTarget order)
  // on one fused GEMM's input `in` (N, in) and output `out` (N, row), or
  // their backward from dout (N, row) into dinp: the targets the layout has,
  // each at its columns (model::LoraTargetSite). Nothing without LoRA.
  void LoraForwardSites(int l, int first, int last, void* out, const void* in, int N);
  void LoraBackwardSites(int l, int first, int last, void* dinp, const void* dout, const void* in,
                         int N);
  void BlockForward(int layer, LayerActs& a, const void* residual, int b, int t);
  // The block's forward arithmetic (the caller holds the unit's scope);
  // `refill`: a recomputing block in backward, which stops once what its
  // backward reads is back (after the GELU: the MLP's projection and the
  // output residual3 are not read).
  void BlockForwardMath(int layer, LayerActs& a, const void* residual, int b, int t, bool refill);
  // Before a recomputing block's backward: selective recomputes the
  // attention probabilities from the saved qkv, full the block up to its
  // MLP's activation from the block's input `residual`.
  void Refill(int layer, LayerActs& a, const void* residual, int b, int t);
  void BlockBackward(int layer, LayerActs& a, const void* residual, int b, int t);
  // An MoE layer's MLP (model_engine_moe.cc) on x (N, C, the norm's output
  // gathered): moe_out_ = the experts' combined output plus the shared
  // experts' (without their output bias), a partial sum over tp (the
  // caller reduces it); `record`: add the router's figures to the step's
  // MoeStats (not when a recomputing block refills). Backward from dout (N,
  // C, whole): dln_ = the input gradient (partial over tp), the gradients
  // +=; ln2: this rank's rows of the norm's output, gathered again after
  // dout is used (sp_full_ holds either).
  void MoeMlpForward(int layer, LayerActs& a, const void* x, int N, bool record);
  void MoeMlpBackward(int layer, LayerActs& a, const void* dout, const void* ln2, int N);
  // load (E) summed over the cp group, in place (the balancing loss's
  // fractions are the whole sequences'): cp − 1 passes of the ring.
  void SumOverCp(std::vector<int>& load);
  // Expert parallelism (model_engine_moe.cc): from the kept pairs per
  // expert, each rank's rows each way, the counts exchanged first, and the
  // received rows' regrouping (a.ep_*). Then the rows of `send` (M, C, in
  // expert order) to their experts' ranks, regrouped into recv_grouped
  // (a.ep_rows, C), through `staging` (a.ep_rows, C); and back: grouped
  // rows through staging to their ranks' `out` (M, C).
  void EpPlan(LayerActs& a, const std::vector<int>& kept);
  void EpDispatch(const LayerActs& a, const void* send, void* staging, void* recv_grouped);
  void EpReturn(const LayerActs& a, const void* grouped, void* staging, void* out);
  // Attention under context parallelism (model_engine_cp.cc): this rank's
  // queries against every cp rank's key/value block as it passes around the
  // ring (the block in hand computed while the next one arrives), merged
  // by logsumexp into
  // a.atty and a.att (the rows' logsumexp). Backward recomputes each
  // block's probabilities from a.qkv and passes each block's key/value
  // gradient around with it, back to its owner, into dqkv_.
  void RingAttentionForward(LayerActs& a, int b, int t);
  void RingAttentionBackward(LayerActs& a, int b, int t);
  // The recipe's switches, one place each: the norm (LayerNorm with its mean
  // and bias, or RMSNorm), the MLP's activation on fch (N, FCt) into (N, Ft)
  // (GELU, or SwiGLU of [gate | up]) and their backward.
  void NormForward(void* out, float* mean, float* rstd, const void* inp, int weight, int bias,
                   int N);
  void NormBackward(void* dinp, const void* dout, const void* inp, const float* mean,
                    const float* rstd, int weight, int bias, int N);
  void MlpActForward(int layer, void* out, const void* fch, int N);
  void MlpActBackward(int layer, void* dfch, const void* fch, const void* dout, int N);
  // The MLP's fc GEMM and activation: a.fch (N, FCt) = inp (N, C) · fc^T
  // + bias, a.fch_act = act(a.fch) (MatmulGeluForward where the device
  // fuses them). Backward of the MLP's projection (dout (N, C): its output
  // gradient) through the activation: dfch_ = act'(fch) ⊙ (dout ·
  // proj), overwritten; the projection's gradients +=.
  void MlpInForward(int layer, LayerActs& a, const void* inp, int N);
  void MlpOutBackward(int layer, const LayerActs& a, const void* dout, int N);
  // Row-parallel linear forward: inp (N, IC_local) · weight^T summed over tp
  // (ReduceFromTpRegion; or ReduceScatterToSequenceRegion, this rank's
  // LocalRows(N) rows of it), plus bias: returns proj_out_ (N, OC) or
  // sp_local_ (Nl, OC).
  const void* RowParallelForward(const void* inp, int weight, int bias, int N, int IC, int OC);
  // RowParallelForward plus layer l's adapter of `target` (o or down) on
  // its output, when the layout has one.
  const void* AdaptedRowParallelForward(int l, model::LoraTarget target, const void* inp,
                                        int weight, int bias, int N, int IC, int OC);
  // The row-parallel reduction of partial (N, OC) (in place, or into
  // sp_local_ under sequence parallelism) plus bias (-1: none).
  const void* ReduceRowParallel(void* partial, int bias, int N, int OC);
  // Megatron's conjugate pairs over this engine's tp group (no-ops at tp 1);
  // see tensor_parallel.h. n: elements of this rank's rows.
  void CopyToTpRegionBackward(void* dinput, int64_t n);
  void ReduceFromTpRegionForward(void* output, int64_t n);
  // Without sequence parallelism: `local` itself (every row is here).
  // With it: every rank's rows gathered into sp_full_.
  const void* GatherFromSequenceRegionForward(const void* local, int64_t n);
  // dfull (all rows, this rank's partial sums) summed over tp: in place
  // (CopyToTpRegion's backward; dlocal == dfull), or this rank's rows into
  // dlocal under sequence parallelism.
  void GatherFromSequenceRegionBackward(void* dlocal, void* dfull, int64_t n);
  // The gradient of a reduce-scattered output, whole: dlocal itself, or
  // every rank's rows gathered into sp_full_.
  const void* ReduceScatterToSequenceRegionBackward(const void* dlocal, int64_t n);

  model::ParamLayout layout_;
  const model::ParamLayout whole_;  // the whole model's layout (init, global indices)
  // The frozen model's slice and whole layouts under LoRA (without: copies
  // of layout_ and whole_).
  const model::ParamLayout base_, base_whole_;
  TensorParallel* const tp_;
  ContextParallel* const cp_;  // null without context parallelism
  ExpertParallel* const ep_;   // null without expert parallelism
  // Per cp rank: the positions of its T columns (ContextChunkPositions).
  std::vector<std::vector<int>> cp_pos_;
  const int B_, T_;
  const model::ActivationPolicy policy_;
  const bool sp_;  // sequence parallelism
  const model::ActivationTable table_;
  const std::vector<float> rotary_;
  std::vector<SlotActs> slots_;
  std::vector<int> chunk_slots_;  // per chunk
  bool has_input_grad_ = false;
  // Within StageBackward (UnitScope tells OnUnitUse).
  bool in_backward_ = false;
  // ExpectBackward's loss_scale for the next forward (0: none).
  float expected_backward_ = 0.0f;
  // The running StageBackward's loss_scale (the balancing losses' dloss).
  float loss_scale_ = 1.0f;
  const MoeOptions moe_;
  MoeStats moe_stats_;
  // scratch
  void *proj_out_ = nullptr, *dresidual_ = nullptr, *dln_ = nullptr, *datty_ = nullptr,
       *dqkv_ = nullptr, *dfch_ = nullptr, *dfch_act_ = nullptr, *att_scratch_ = nullptr,
       *sp_full_ = nullptr, *sp_local_ = nullptr, *cp_kv_ = nullptr, *cp_dkv_ = nullptr,
       *cp_out_ = nullptr, *cp_scores_ = nullptr, *moe_out_ = nullptr, *moe_dxp_ = nullptr,
       *moe_dy_ = nullptr, *moe_dh_ = nullptr, *moe_dh_pre_ = nullptr, *moe_dscores_ = nullptr,
       *moe_dlogits_ = nullptr, *moe_dgates_ = nullptr, *moe_xfer_ = nullptr, *lora_xa_ = nullptr,
       *lora_g_ = nullptr;
  float* cp_rows_ = nullptr;
  std::function<void(size_t)> grads_ready_;
  std::function<void(int, bool)> param_hook_;
};

}  // namespace shardtrain::engine

#endif  // SHARDTRAIN_WORKER_ENGINE_MODEL_ENGINE_H_
