// Gpt: the CPU engine (engine::Engine): a GPT-2 style transformer in fp32
// on OpenBLAS, owning its parameters, gradients and activations.
//
// The flat parameter and gradient buffers come from a CpuDevice (PageBuffer
// mappings: ZeRO-2/3 release ranges of them and measure what is resident);
// the activation and scratch buffers are one more, laid out by the model's
// ActivationTable (common/model/activations.h), the table the planner
// accounts with. All are allocated by Create() for micro-batches of up to
// (B, T) tokens; Forward/Backward allocate nothing.
//
// Under tensor and pipeline parallelism (GptOptions) it runs one slice of the
// model (common/model/slice.h): one pipeline stage's layers, with the split
// tensors' tp-local parts, exchanging partial sums through a TensorParallel
// group (the conjugate pairs of tensor_parallel.h; the vocabulary-parallel
// ends in vocab_parallel.h), and keeping the saved activations of `slots`
// micro-batches for a pipeline schedule.
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
#include "common/model/activations.h"
#include "common/model/config.h"
#include "common/model/param_layout.h"
#include "worker/engine/cpu/cpu_device.h"
#include "worker/engine/cpu/vocab_parallel.h"
#include "worker/engine/engine.h"
#include "worker/engine/tensor_parallel.h"
#include "worker/engine/thread_pool.h"

namespace shardtrain::engine::cpu {

struct GptOptions {
  model::ModelSlice slice;  // default: the whole model
  int slots = 1;            // micro-batches whose saved activations are kept at once
  // The slice's tp group (rank slice.tp_rank of slice.tp); required when
  // slice.tp > 1, must outlive the engine.
  TensorParallel* tp = nullptr;
};

class Gpt final : public Engine {
 public:
  // B >= 1, 1 <= T <= config.context, threads >= 1, slots >= 1, a slice
  // within the model whose tp divides heads, 4·dim and the padded vocabulary
  // (with its group). InvalidArgument otherwise (naming the field).
  // Parameters start at zero: call InitParams() or copy weights into
  // params().
  static absl::StatusOr<std::unique_ptr<Gpt>> Create(const model::GptConfig& config, int B, int T,
                                                     int threads, const GptOptions& options = {});

  // ---- Engine
  const model::ParamLayout& layout() const override { return layout_; }
  int max_batch() const override { return B_; }
  int max_seq_len() const override { return T_; }
  Device& device() override { return device_; }
  Buffer& param_buffer() override { return *params_; }
  Buffer& grad_buffer() override { return *grads_; }
  const model::ActivationTable& activations() const override { return table_; }
  int64_t activation_bytes() const override { return int64_t(acts_->bytes()); }
  int64_t ResidentActivationBytes() const override { return acts_->ResidentBytes(); }
  ThreadPool* host_pool() override { return &pool_; }
  void InitParamsInto(uint64_t seed, size_t begin, size_t end, float* out) override;
  float Forward(const int* tokens, const int* targets, int b, int t) override {
    return StageForward(0, tokens, targets, nullptr, b, t);
  }
  using Engine::Forward;
  void Backward(float loss_scale = 1.0f) override { StageBackward(0, loss_scale, nullptr); }
  int slots() const override { return static_cast<int>(slots_.size()); }
  float StageForward(int slot, const int* tokens, const int* targets, const float* input, int b,
                     int t) override;
  const float* StageOutput(int slot) const override;
  void StageBackward(int slot, float loss_scale, const float* doutput) override;
  const float* InputGrad() const override {
    return layout_.slice().first_stage ? nullptr : dresidual_;
  }
  void ZeroGrad() override;
  void ReadLogits(int row, float* out) const override;
  void set_grads_ready_hook(std::function<void(size_t offset)> hook) override {
    grads_ready_ = std::move(hook);
  }
  void set_param_hook(std::function<void(int unit, bool begin)> hook) override {
    param_hook_ = std::move(hook);
  }

  // ---- The CPU engine's own.
  ThreadPool* pool() { return &pool_; }
  // Logits of slot 0's last forward: (b, t, Vp / tp) row stride Vp / tp
  // (this rank's vocabulary columns); columns >= vocab are not computed.
  // Invalidated by Backward() (it overwrites them with their gradient).
  const float* logits() const { return slots_[0].logits; }

  // Per-phase wall time of the last Forward/Backward in ms (profiling).
  struct Timing {
    double encoder = 0, layernorm = 0, matmul = 0, attention = 0, gelu = 0, residual = 0,
           lm_head = 0, softmax_ce = 0;
  };
  void set_profiling(bool on) { profiling_ = on; }
  const Timing& timing() const { return timing_; }

 private:
  Gpt(const model::GptConfig& config, int B, int T, int threads, const GptOptions& options);

  struct LayerActs {
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *att, *residual2, *ln2, *ln2_mean, *ln2_rstd,
        *fch, *fch_gelu, *residual3;
  };
  // The saved activations of one micro-batch in flight.
  struct SlotActs {
    std::vector<LayerActs> layers;  // the slice's layers, in order
    float *encoded, *lnf, *lnf_mean, *lnf_rstd, *logits, *losses, *lse;
    std::vector<int> tokens, targets;
    int b = 0, t = 0;
    bool forwarded = false;  // a forward with targets (last stage) not yet backpropagated
  };
  const float* param(int tensor) const { return param_data_ + layout_.offset(tensor); }
  float* grad(int tensor) { return grad_data_ + layout_.offset(tensor); }
  // The whole model's init of global elements [begin, end) into out.
  void InitGlobal(uint64_t seed, size_t begin, size_t end, float* out);
  // One block of the slice (gpt_block.cc): `residual` is its input.
  void BlockForward(int layer, LayerActs& a, const float* residual, int b, int t);
  void BlockBackward(int layer, LayerActs& a, const float* residual, int b, int t);
  // Row-parallel linear forward: out (N, OC) = inp (N, IC_local) ·
  // weightᵀ, summed over tp, plus bias.
  void RowParallelForward(float* out, const float* inp, const float* weight, const float* bias,
                          int N, int IC, int OC);

  model::ParamLayout layout_;
  const model::ParamLayout whole_;  // the whole model's layout (init, global indices)
  TensorParallel* const tp_;
  VocabShard vocab_;  // this rank's rows of wte
  const int B_, T_;
  ThreadPool pool_;
  CpuDevice device_;
  // Calls param_hook_ (if any) for `unit` before and after a scope.
  class UnitScope;

  const model::ActivationTable table_;
  std::unique_ptr<Buffer> params_, grads_, acts_;
  float* param_data_ = nullptr;
  float* grad_data_ = nullptr;
  std::vector<SlotActs> slots_;
  float* proj_out_;
  // backward scratch
  float *dresidual_, *dln_, *datty_, *dqkv_, *dfch_, *dfch_gelu_, *att_scratch_;
  bool profiling_ = false;
  std::function<void(size_t)> grads_ready_;
  std::function<void(int, bool)> param_hook_;
  Timing timing_;
};

}  // namespace shardtrain::engine::cpu

#endif  // SHARDTRAIN_WORKER_ENGINE_CPU_GPT_H_
