// CpuModel: the CPU engine (engine::Engine): a transformer of any model family
// (GPT-2, Llama) in fp32 on OpenBLAS, owning its parameters, gradients and activations. The order
// of the step (blocks, hooks, slots, tp regions) is engine::ModelEngine's
// (worker/engine/model_engine.h); this class supplies the layers
// (engine/cpu/layers.h, vocab_parallel.h).
//
// The flat parameter and gradient buffers come from a CpuDevice (PageBuffer
// mappings: ZeRO-2/3 release ranges of them and measure what is resident);
// the activation and scratch buffers are one more, laid out by the model's
// ActivationTable (common/model/activations.h), the table the planner
// accounts with. All are allocated by Create() for micro-batches of up to
// (B, T) tokens; Forward/Backward allocate nothing.
//
// Under tensor and pipeline parallelism (ModelEngineOptions) it runs one slice of the
// model (common/model/slice.h): one pipeline stage's layers, with the split
// tensors' tp-local parts, exchanging partial sums through a TensorParallel
// group (the conjugate pairs of tensor_parallel.h; the vocabulary-parallel
// ends in vocab_parallel.h), and keeping the saved activations of `slots`
// micro-batches for a pipeline schedule.
//
// Not thread-safe: one caller at a time. Internally uses `threads` compute
// threads (one ThreadPool; OpenBLAS is switched to 1 thread per call and is
// driven from the pool, see thread_pool.h).
#ifndef SHARDTRAIN_WORKER_ENGINE_CPU_CPU_MODEL_H_
#define SHARDTRAIN_WORKER_ENGINE_CPU_CPU_MODEL_H_

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
#include "worker/engine/model_engine.h"
#include "worker/engine/tensor_parallel.h"
#include "worker/engine/thread_pool.h"
#include "worker/quant/frozen_weights.h"

namespace shardtrain::engine::cpu {

class CpuModel final : public ModelEngine {
 public:
  // B >= 1, 1 <= T <= config.context, threads >= 1, slots >= 1, a slice
  // within the model whose tp divides heads, 4·dim and the padded vocabulary
  // (with its group). InvalidArgument otherwise (naming the field).
  // Parameters start at zero: call InitParams() or copy weights into
  // params().
  static absl::StatusOr<std::unique_ptr<CpuModel>> Create(const model::ModelConfig& config, int B,
                                                          int T, int threads,
                                                          const ModelEngineOptions& options = {});

  // ---- Engine
  Device& device() override { return device_; }
  Buffer& param_buffer() override { return *params_; }
  Buffer& grad_buffer() override { return *grads_; }
  int64_t activation_bytes() const override { return int64_t(acts_->bytes()); }
  int64_t ResidentActivationBytes() const override { return acts_->ResidentBytes(); }
  ThreadPool* host_pool() override { return &pool_; }
  FlatMath& math() override { return math_; }
  void InitParamsInto(uint64_t seed, size_t begin, size_t end, float* out) override {
    InitSliceHost(seed, begin, end, out, &pool_);
  }
  bool has_frozen() const override { return frozen_ != nullptr; }
  void SetFrozen(const float* host) override { frozen_->Set(host, &pool_); }
  void GetFrozen(float* host) override { frozen_->Get(host, &pool_); }
  int64_t frozen_bytes() const override { return frozen_ == nullptr ? 0 : frozen_->bytes(); }
  void InitFrozenInto(uint64_t seed, size_t begin, size_t end, float* out) override {
    InitFrozenHost(seed, begin, end, out, &pool_);
  }
  float StageForward(int slot, const int* tokens, const int* targets, const float* input, int b,
                     int t) override;
  using ModelEngine::Forward;
  const float* StageOutput(int slot) const override;
  const float* InputGrad() const override {
    return has_input_grad() ? static_cast<const float*>(dresidual()) : nullptr;
  }
  void ZeroGrad() override;
  void ReadLogits(int row, float* out) const override;

  // ---- The CPU engine's own.
  ThreadPool* pool() { return &pool_; }
  // Logits of slot 0's last forward: (b, t, Vp / tp) row stride Vp / tp
  // (this rank's vocabulary columns); columns >= vocab are not computed.
  // Invalidated by Backward() (it overwrites them with their gradient).
  const float* logits() const { return static_cast<const float*>(slot(0).logits); }

  // Per-phase wall time of the last Forward/Backward in ms (profiling).
  struct Timing {
    double encoder = 0, layernorm = 0, matmul = 0, attention = 0, gelu = 0, residual = 0,
           lm_head = 0, softmax_ce = 0;
  };
  void set_profiling(bool on) { profiling_ = on; }
  const Timing& timing() const { return timing_; }

 protected:
  // ---- ModelEngine's layers, on the host in fp32.
  void EncoderForward(SlotActs& s) override;
  void EncoderBackward(const SlotActs& s, const void* dout) override;
  void CopyFromFloat32(void* dst, const float* src, int64_t n) override;
  void Zero(void* p, int64_t n) override;
  void LayerNormForward(void* out, float* mean, float* rstd, const void* inp, int weight, int bias,
                        int N, int C) override;
  void LayerNormBackward(void* dinp, const void* dout, const void* inp, const float* mean,
                         const float* rstd, int weight, int bias, int N, int C) override;
  void MatmulForward(void* out, const void* inp, int weight, int bias, int N, int IC, int OC,
                     int ld_out) override;
  void MatmulBackward(void* dinp, const void* dout, int ld_dout, const void* inp, int weight,
                      int bias, int N, int IC, int OC) override;
  void AddBias(void* out, int bias, int N, int OC) override;
  void RmsNormForward(void* out, float* rstd, const void* inp, int weight, int N, int C) override;
  void RmsNormBackward(void* dinp, const void* dout, const void* inp, const float* rstd, int weight,
                       int N, int C) override;
  void RotaryForward(void* qkv, int b, int t, int NHt, int KVHt, bool inverse) override;
  void QkNormForward(void* qkv, void* pre, float* rstd, int wq, int wk, int N, int NHt,
                     int KVHt) override;
  void QkNormBackward(void* dqkv, const void* pre, const float* rstd, int wq, int wk, int N,
                      int NHt, int KVHt) override;
  void AttentionForward(void* out, void* att, void* scratch, const void* qkv, int b, int t, int Ct,
                        int NHt, int KVHt) override;
  void AttentionBackward(void* dqkv, void* scratch, const void* dout, const void* qkv,
                         const void* out, const void* att, int b, int t, int Ct, int NHt,
                         int KVHt) override;
  void AttentionBlockForward(void* out, float* lse, void* blk_out, float* blk_lse, void* scores,
                             const void* qkv, const void* kv, const int* pos_q, const int* pos_k,
                             int b, int t, int Ct, int NHt, int KVHt, bool first) override;
  void AttentionRowDot(float* D, const void* dout, const void* out, int b, int t, int Ct,
                       int NHt) override;
  void AttentionBlockBackward(void* dqkv, void* dkv, void* scores, void* dscores, const void* dout,
                              const void* qkv, const void* kv, const float* lse, const float* D,
                              const int* pos_q, const int* pos_k, int b, int t, int Ct, int NHt,
                              int KVHt) override;
  void CopyKv(void* kv, const void* qkv, int b, int t, int Ct, int KVt) override;
  void AddKvGrad(void* dqkv, const void* dkv, int b, int t, int Ct, int KVt) override;
  void SwiGluForward(void* out, const void* inp, int N, int H) override;
  void SwiGluBackward(void* dinp, const void* inp, const void* dout, int N, int H) override;
  void GeluForward(void* out, const void* inp, int64_t n) override;
  void GeluBackward(void* dinp, const void* inp, const void* dout, int64_t n) override;
  void ResidualForward(void* out, const void* inp1, const void* inp2, int64_t n) override;
  void LmHeadForward(SlotActs& s) override;
  double CrossEntropyForward(SlotActs& s) override;
  void CrossEntropyBackward(SlotActs& s, float dloss) override;
  void LmHeadBackward(SlotActs& s, void* dln) override;
  void LoraForward(void* out, int ld, const void* in, int A, int B, int N, int in_dim,
                   int out_dim) override;
  void LoraBackward(void* dinp, const void* dout, int ld, const void* in, int A, int B, int N,
                    int in_dim, int out_dim) override;
  void TpAllReduceSum(void* x, int64_t n) override;
  void TpAllGather(void* full, const void* local, int64_t n) override;
  void TpReduceScatter(void* local, const void* full, int64_t n) override;
  // Mixture of Experts (cpu_model_moe.cc, over moe_layers.h).
  MoeRouted MoeRoute(LayerActs& a, const void* x, int router, int bias, int N,
                     int capacity) override;
  MoeBalance MoeBalanceLosses(const LayerActs& a, const int* load, int N) override;
  void MoePermute(void* xp, const LayerActs& a, const void* x, int N, int M) override;
  void MoeGatherRows(void* dst, const void* src, const int* index, int n) override;
  void MoeScatterRows(void* dst, const void* src, const int* index, int n) override;
  void MoeCombine(void* out, const LayerActs& a, int N) override;
  void MoeCombineBackward(void* dy, void* dgates, const void* dout, const LayerActs& a, int N,
                          int M) override;
  void MoePermuteBackward(void* dx, const void* dxp, const LayerActs& a, int N) override;
  void MoeRouterBackward(void* dx, void* dscores, void* dlogits, const void* dgates,
                         const LayerActs& a, const int* load, const void* x, int router, int N,
                         float dloss) override;

 private:
  CpuModel(const model::ModelConfig& config, int B, int T, int threads,
           const ModelEngineOptions& options);

  // A tensor's parameters and gradient; null for -1 (no such tensor). A
  // frozen tensor (LoRA) reads the frozen model and has no gradient; a
  // quantized one has no fp32 parameters either (quantized() has them).
  const float* param(int tensor) const {
    if (tensor < 0) return nullptr;
    if (layout().tensors()[tensor].frozen) return frozen_->fp32(frozen_index_[tensor]);
    return param_data_ + layout().offset(tensor);
  }
  const quant::QuantWeightView* quantized(int tensor) const {
    if (tensor < 0 || !layout().tensors()[tensor].frozen) return nullptr;
    return frozen_->quantized(frozen_index_[tensor]);
  }
  float* grad(int tensor) {
    if (tensor < 0 || layout().tensors()[tensor].frozen) return nullptr;
    return grad_data_ + layout().offset(tensor);
  }

  VocabShard vocab_;  // this rank's rows of wte
  ThreadPool pool_;
  HostFlatMath math_{&pool_};
  CpuDevice device_;
  std::unique_ptr<Buffer> params_, grads_, acts_;
  // LoRA only: the frozen model, and each tensor's index in its layout
  // (frozen_layout(); -1: an adapter).
  std::unique_ptr<quant::FrozenWeights> frozen_;
  std::vector<int> frozen_index_;
  float* param_data_ = nullptr;
  float* grad_data_ = nullptr;
  bool profiling_ = false;
  Timing timing_;
};

}  // namespace shardtrain::engine::cpu

#endif  // SHARDTRAIN_WORKER_ENGINE_CPU_CPU_MODEL_H_
