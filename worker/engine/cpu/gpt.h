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
#include "worker/engine/engine.h"
#include "worker/engine/thread_pool.h"

namespace shardtrain::engine::cpu {

class Gpt final : public Engine {
 public:
  // B >= 1, 1 <= T <= config.context, threads >= 1. InvalidArgument
  // otherwise (naming the field). Parameters start at zero: call
  // InitParams() or copy weights into params().
  static absl::StatusOr<std::unique_ptr<Gpt>> Create(const model::GptConfig& config, int B, int T,
                                                     int threads);

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
  float Forward(const int* tokens, const int* targets, int b, int t) override;
  using Engine::Forward;
  void Backward(float loss_scale = 1.0f) override;
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
  // Logits of the last Forward: (b, t, Vp) row stride Vp; columns >= vocab
  // are not computed. Invalidated by Backward() (it overwrites them with
  // their gradient).
  const float* logits() const { return logits_; }

  // Per-phase wall time of the last Forward/Backward in ms (profiling).
  struct Timing {
    double encoder = 0, layernorm = 0, matmul = 0, attention = 0, gelu = 0, residual = 0,
           lm_head = 0, softmax_ce = 0;
  };
  void set_profiling(bool on) { profiling_ = on; }
  const Timing& timing() const { return timing_; }

 private:
  Gpt(const model::GptConfig& config, int B, int T, int threads);

  struct LayerActs {
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *att, *residual2, *ln2, *ln2_mean, *ln2_rstd,
        *fch, *fch_gelu, *residual3;
  };
  const float* param(int tensor) const { return param_data_ + layout_.offset(tensor); }
  float* grad(int tensor) { return grad_data_ + layout_.offset(tensor); }

  model::ParamLayout layout_;
  const int B_, T_;
  ThreadPool pool_;
  CpuDevice device_;
  // Calls param_hook_ (if any) for `unit` before and after a scope.
  class UnitScope;

  const model::ActivationTable table_;
  std::unique_ptr<Buffer> params_, grads_, acts_;
  float* param_data_ = nullptr;
  float* grad_data_ = nullptr;
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
