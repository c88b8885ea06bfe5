// Gpt: a GPT-2 style transformer on the CPU, fp32, owning its parameters,
// gradients and activations.
//
// All buffers are allocated by Create() for micro-batches of up to (B, T)
// tokens; Forward/Backward allocate nothing. Parameters and gradients are one
// flat buffer each, laid out by ParamLayout (see param_layout.h), so
// DDP/ZeRO/checkpointing can work on ranges of them directly.
//
// Not thread-safe: one caller at a time. Internally uses `threads` compute
// threads (one ThreadPool; OpenBLAS is switched to 1 thread per call and is
// driven from the pool, see thread_pool.h).
#ifndef SHARDTRAIN_WORKER_ENGINE_CPU_GPT_H_
#define SHARDTRAIN_WORKER_ENGINE_CPU_GPT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/model/config.h"
#include "common/model/param_layout.h"
#include "worker/engine/cpu/page_buffer.h"
#include "worker/engine/thread_pool.h"

namespace shardtrain::engine::cpu {

class Gpt {
 public:
  // B >= 1, 1 <= T <= config.context, threads >= 1. InvalidArgument
  // otherwise (naming the field). Parameters start at zero: call
  // InitParams() or copy weights into params().
  static absl::StatusOr<std::unique_ptr<Gpt>> Create(const model::GptConfig& config, int B, int T,
                                                     int threads);

  const model::GptConfig& config() const { return layout_.config(); }
  const model::ParamLayout& layout() const { return layout_; }
  int max_batch() const { return B_; }
  int max_seq_len() const { return T_; }
  ThreadPool* pool() { return &pool_; }

  absl::Span<float> params() { return params_.span(); }
  absl::Span<const float> params() const { return params_.span(); }
  absl::Span<float> grads() { return grads_.span(); }
  absl::Span<const float> grads() const { return grads_.span(); }
  // The same buffers, for ZeRO-2/3 which release the ranges of units they do
  // not hold (page_buffer.h) and measure what is resident.
  PageBuffer& param_buffer() { return params_; }
  PageBuffer& grad_buffer() { return grads_; }
  // Bytes of activations and backward scratch (allocated, all resident).
  int64_t activation_bytes() const {
    return int64_t((acts_.size() + scratch_.size()) * sizeof(float));
  }

  // GPT-2 init, a pure function of (seed, layout): weights N(0, 0.02), the
  // residual projections (attn.proj.weight, mlp.proj.weight) N(0, 0.02 /
  // sqrt(2L)), biases 0, LayerNorm weights 1, padded wte rows 0. Element i of
  // tensor k depends only on (seed, k, i) (counter-based RNG), so every
  // machine and every shard computes the same values.
  void InitParams(uint64_t seed);
  // The same values, written only to flat elements [begin, end) (ZeRO-3
  // initialises just its shards; nothing else is touched).
  void InitParams(uint64_t seed, size_t begin, size_t end);
  // The values of flat elements [begin, end) written to out[0, end - begin)
  // instead (ZeRO-3 initialises its shard without touching params()).
  void InitParamsInto(uint64_t seed, size_t begin, size_t end, float* out);

  // Forward over b sequences of t tokens (defaults: the full B, T).
  // tokens, targets: (b, t) row-major ids in [0, vocab); 1 <= b <= B,
  // 1 <= t <= T. Violations are programming errors and abort with a message.
  // Returns the mean cross-entropy loss; targets may be null (inference),
  // then returns 0 and only logits() is meaningful.
  float Forward(const int* tokens, const int* targets);
  float Forward(const int* tokens, const int* targets, int b, int t);

  // Backward of the last Forward, which must have had targets and not been
  // backpropagated yet (else aborts with a message). ACCUMULATES
  // into grads(): dL/dparams * loss_scale where L is that Forward's mean loss
  // (pass 1/accumulation_steps for gradient accumulation). Overwrites the
  // logits with their gradient.
  void Backward(float loss_scale = 1.0f);

  // Sets every gradient to 0.
  void ZeroGrad();

  // Logits of the last Forward: (b, t, Vp) row stride Vp; columns >= vocab
  // are not computed. Invalidated by Backward().
  const float* logits() const { return logits_; }

  // Per-phase wall time of the last Forward/Backward in ms (profiling).
  struct Timing {
    double encoder = 0, layernorm = 0, matmul = 0, attention = 0, gelu = 0, residual = 0,
           lm_head = 0, softmax_ce = 0;
  };
  void set_profiling(bool on) { profiling_ = on; }

  // Called by Backward, on the calling thread, each time the gradients of a
  // whole unit became final: with the unit's first element `offset`, meaning
  // every gradient in [offset, num_params) is final. Units finish in reverse
  // layout order (final, block.L-1, ..., block.0, then embeddings at offset 0,
  // since wte also collects the LM head's gradient), so DDP can launch bucket
  // all-reduces from the end of the buffer while backward goes on. Null: off.
  void set_grads_ready_hook(std::function<void(size_t offset)> hook) {
    grads_ready_ = std::move(hook);
  }
  const Timing& timing() const { return timing_; }

  // Called on the calling thread around every computation that reads a
  // unit's parameters: hook(unit, true) before, hook(unit, false) after
  // (unit indexes layout().units()). Uses, in order — Forward: embeddings
  // (token + position encoding), block.0 .. block.L-1, final, embeddings (the
  // LM head, tied to wte); Backward: embeddings (LM head), final,
  // block.L-1 .. block.0 (the encoder's backward reads no parameter). ZeRO-3
  // gathers a unit's parameters in the "before" call and may free them in
  // the "after" call. Null: off.
  void set_param_hook(std::function<void(int unit, bool begin)> hook) {
    param_hook_ = std::move(hook);
  }

 private:
  Gpt(const model::GptConfig& config, int B, int T, int threads);

  struct LayerActs {
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *att, *residual2, *ln2, *ln2_mean, *ln2_rstd,
        *fch, *fch_gelu, *residual3;
  };
  const float* param(int tensor) const { return params_.data() + layout_.offset(tensor); }
  float* grad(int tensor) { return grads_.data() + layout_.offset(tensor); }

  model::ParamLayout layout_;
  const int B_, T_;
  ThreadPool pool_;
  // Calls param_hook_ (if any) for `unit` before and after a scope.
  class UnitScope;

  PageBuffer params_, grads_;
  std::vector<float> acts_, scratch_;
  std::vector<int> tokens_, targets_;
  std::vector<LayerActs> layer_acts_;
  float *encoded_, *lnf_, *lnf_mean_, *lnf_rstd_, *logits_, *losses_, *lse_, *proj_out_;
  // backward scratch
  float *dresidual_, *dln_, *datty_, *dqkv_, *dfch_, *dfch_gelu_, *att_scratch_;
  int last_b_ = 0, last_t_ = 0;
  bool have_targets_ = false;
  bool profiling_ = false;
  std::function<void(size_t)> grads_ready_;
  std::function<void(int, bool)> param_hook_;
  Timing timing_;
};

}  // namespace shardtrain::engine::cpu

#endif  // SHARDTRAIN_WORKER_ENGINE_CPU_GPT_H_
