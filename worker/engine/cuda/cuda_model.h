// CudaModel: the transformer of any model family (GPT-2, Llama; the config's
// recipe) on one GPU (engine::Engine), in fp32, bf16 or fp16. The order of
// the step (blocks, hooks, slots, the recipe's switches) is
// engine::ModelEngine's; this class supplies the layers as the CUDA kernels
// of kernels.h on the device's compute stream. With rotary positions the
// rotary table (model::RotaryTable) is copied to the device once, at Create.
//
// Precision (job spec `precision`): the flat parameter and gradient buffers
// are the fp32 master (what strategies, the optimizer and checkpoints see);
// under bf16 / fp16 a compute copy of the parameters in that type is
// refreshed from the master each time a unit's parameters are read
// (OnUnitUse: after ZeRO's hook, so a gathered unit converts too), the
// activations are stored in the compute type (the ActivationTable says which
// stay fp32), and backward accumulates the parameters' gradients in fp32. In
// fp32 the compute copy is the master itself and TF32 is never used, so the
// engine equals the CPU engine to rounding.
//
// Pipeline stages run like whole models (ModelEngine's slots and slices);
// tensor-parallel slices (with sequence parallelism too) exchange through
// the host in fp32 over the tp group. The host synchronises once per
// forward, to read the losses back.
//
// CUDA errors inside a pass abort the process with the kernel's message (a
// worker crash: the coordinator recovers the job like any failed rank).
// Not thread-safe: one caller at a time.
#ifndef SHARDTRAIN_WORKER_ENGINE_CUDA_CUDA_MODEL_H_
#define SHARDTRAIN_WORKER_ENGINE_CUDA_CUDA_MODEL_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/weight_quant.h"
#include "worker/engine/cuda/cuda_device.h"
#include "worker/engine/cuda/kernels.h"
#include "worker/engine/model_engine.h"

namespace shardtrain::engine::cuda {

class CudaModel final : public ModelEngine {
 public:
  // The engine on GPU `ordinal` computing in `compute` (fp32, bf16, fp16).
  // FAILED_PRECONDITION without such a device, RESOURCE_EXHAUSTED when its
  // memory cannot hold the model and activations, INVALID_ARGUMENT for
  // shapes (as ValidateModelEngine), UNIMPLEMENTED for tp / pp slices.
  static absl::StatusOr<std::unique_ptr<CudaModel>> Create(const model::ModelConfig& config, int B,
                                                           int T, int ordinal, DataType compute,
                                                           int host_threads = 1,
                                                           const ModelEngineOptions& options = {});
  ~CudaModel() override;

  // ---- Engine
  Device& device() override { return *device_; }
  Buffer& param_buffer() override { return *params_; }
  Buffer& grad_buffer() override { return *grads_; }
  int64_t activation_bytes() const override { return int64_t(acts_->bytes()); }
  int64_t ResidentActivationBytes() const override { return acts_->ResidentBytes(); }
  ThreadPool* host_pool() override { return &pool_; }
  FlatMath& math() override { return *math_; }
  void InitParamsInto(uint64_t seed, size_t begin, size_t end, float* out) override;
  // Pipeline stages exchange fp32 in device memory: the slot's output and
  // the input gradient as they are (fp32 compute) or converted from the
  // compute type into buffers of this engine's (valid until the slot's next
  // forward, the next backward). Null where the stage sends none.
  const float* StageOutput(int slot) const override;
  const float* InputGrad() const override;
  void ZeroGrad() override;
  void ReadLogits(int row, float* out) const override;
  // LoRA (cuda_model_lora.cc): the frozen model in device memory.
  bool has_frozen() const override { return config().lora.on(); }
  void SetFrozen(const float* host) override;
  void GetFrozen(float* host) override;
  int64_t frozen_bytes() const override;
  void InitFrozenInto(uint64_t seed, size_t begin, size_t end, float* out) override {
    InitFrozenHost(seed, begin, end, out, &pool_);
  }

  DataType compute() const { return activations().compute(); }
  // Bytes of device memory this engine allocated (params, grads, compute
  // copy, activations, token buffers, the rotary table), for the
  // plan-vs-device check.
  int64_t allocated_bytes() const;

 protected:
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
  void MatmulBackwardOverwrite(void* dinp, const void* dout, int ld_dout, const void* inp,
                               int weight, int bias, int N, int IC, int OC) override;
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
  void GeluForward(void* out, const void* inp, int64_t n) override;
  void GeluBackward(void* dinp, const void* inp, const void* dout, int64_t n) override;
  bool MatmulGeluForward(void* act, void* pre, const void* inp, int weight, int bias, int N, int IC,
                         int OC) override;
  bool MatmulDGeluBackward(void* dpre, const void* dout, int ld_dout, const void* act,
                           const void* pre, int weight, int bias, int N, int IC, int OC) override;
  void SwiGluForward(void* out, const void* inp, int N, int H) override;
  void SwiGluBackward(void* dinp, const void* inp, const void* dout, int N, int H) override;
  void ResidualForward(void* out, const void* inp1, const void* inp2, int64_t n) override;
  void LmHeadForward(SlotActs& s) override;
  double CrossEntropyForward(SlotActs& s) override;
  bool CrossEntropyForwardBackward(SlotActs& s, float dloss, double* loss_sum) override;
  void CrossEntropyBackward(SlotActs& s, float dloss) override;
  void LmHeadBackward(SlotActs& s, void* dln) override;
  // Context parallelism (cuda_model_cp.cc).
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
  const int* CpPositions(int r) const override;
  void StartRingPass(const void* send, void* recv, int64_t count) override;
  void FinishRingPass() override;
  void LoraForward(void* out, int ld, const void* in, int A, int B, int N, int in_dim,
                   int out_dim) override;
  void LoraBackward(void* dinp, const void* dout, int ld, const void* in, int A, int B, int N,
                    int in_dim, int out_dim) override;
  void TpAllReduceSum(void* x, int64_t n) override;
  void TpAllGather(void* full, const void* local, int64_t n) override;
  void TpReduceScatter(void* local, const void* full, int64_t n) override;
  void OnUnitUse(int unit, bool backward) override;
  void OnUnitDone(int unit) override;
  // Mixture of Experts (cuda_model_moe.cc); the experts are ModelEngine's.
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
  // Expert parallelism's exchange: in the engine's buffers, in the compute
  // type, where the ep group takes device memory (NCCL); else through host
  // fp32, as the tp collectives stage theirs. The plan's counts go through
  // ep_counts_ on a device-memory group.
  void EpAllToAll(const void* send, const std::vector<size_t>& send_counts, void* recv,
                  const std::vector<size_t>& recv_counts) override;
  void EpAllToAllHost(const float* send, const std::vector<size_t>& send_counts, float* recv,
                      const std::vector<size_t>& recv_counts) override;

 private:
  CudaModel(const model::ModelConfig& config, int B, int T, DataType compute, int host_threads,
            const ModelEngineOptions& options, std::unique_ptr<CudaDevice> device);
  absl::Status Init();
  // Aborts with the message when a launcher failed (see the class comment).
  void Check(const absl::Status& s) const;
  const KernelCtx& k() const { return kernels_.ctx(); }
  // The cross-entropy's forward (dloss 0) or forward and backward in one
  // pass (kernels.h CrossEntropyForwardBackward): the losses' sum, read
  // back to the host.
  double LossForward(SlotActs& s, float dloss);
  cudaStream_t stream() const;
  // The compute copy of a parameter tensor, and its fp32 gradient; null
  // for -1 (no such tensor in the recipe or the slice). A frozen tensor
  // (LoRA) reads the frozen model (null where it is quantized: quantized()
  // has it) and has no gradient; a norm's frozen weight writes its unused
  // gradient into a sink (norm_grad), which the norm kernels need.
  const void* param(int tensor) const;
  float* grad(int tensor) const;
  float* norm_grad(int tensor) const;
  // LoRA's frozen model (cuda_model_lora.cc): allocated for `format` at
  // Init, the zero model until SetFrozen.
  absl::Status InitFrozen(const model::FrozenFormat& format);
  const void* frozen_param(int tensor) const;
  const DeviceQuantWeight* quantized(int tensor) const;
  // out (N, rows) with row stride ld_out = inp · W^T (+ bias) and its
  // input gradient, dinp (+)= dout · W, W dequantized kDequantTileRows rows
  // at a time into frozen_tile_.
  void QuantMatmulForward(void* out, const void* inp, const DeviceQuantWeight& w, int bias, int N,
                          int ld_out);
  void QuantMatmulBackward(void* dinp, const void* dout, int ld_dout, const DeviceQuantWeight& w,
                           int N, bool overwrite);
  int SlotIndex(const SlotActs& s) const { return static_cast<int>(&s - &slot(0)); }
  // n elements of the compute type at x to tp_host_[at, at + n) as fp32,
  // and back (the tp collectives' staging through the host).
  void ToHostF32(const void* x, int64_t n, size_t at);
  void FromHostF32(void* x, int64_t n, size_t at);
  // The vocabulary-parallel cross-entropy's exchange over tp (host_lse_,
  // host_losses_ become the whole vocabulary's; s.lse too).
  void CombineVocabShards(SlotActs& s, int N);
  // n host floats summed (max: maxed) over the tp group, wherever it
  // takes its buffers.
  void TpHostAllReduce(float* host, int n, bool max);
  // tp_scratch_'s fp32 element `at`.
  float* TpScratch(size_t at) const;
  // `src` (n of the compute type) as fp32: itself under fp32, else
  // converted into dst (on the compute stream).
  const float* AsFloat32(float* dst, const void* src, int64_t n) const;
  int* DeviceTokens(int slot) const;
  // Slot k's rows grouped by token (kernels.h TokenBuckets), made when its
  // tokens arrive (EncoderForward) for the wte gradient.
  TokenBuckets DeviceBuckets(int slot) const;
  int* DeviceTargets(int slot) const;
  // This rank's columns' positions on the device under cp; null without.
  const int* DevicePositions() const;
  // n elements of the compute type at x (device) as host floats, and host
  // floats into x; both synchronise the stream.
  std::vector<float> HostFloats(const void* x, int64_t n) const;
  void DeviceFromFloats(void* x, const std::vector<float>& host);
  // A host row index (expert parallelism's regrouping) in moe_rows_.
  const int* DeviceRowIndex(const int* index, int n);

  ThreadPool pool_;
  std::unique_ptr<CudaDevice> device_;
  std::unique_ptr<FlatMath> math_;
  KernelContext kernels_;
  std::unique_ptr<Buffer> params_, grads_, compute_, acts_, ids_, row_;
  // rotary_table() in device memory (fp32, (context, hs/2, 2)); null
  // without rotary positions.
  std::unique_ptr<Buffer> rotary_table_;
  // Context parallelism: every cp rank's T positions (int32), rank r's at
  // r·T; the ring's host staging (a group of host memory) and the device
  // buffer the pass in flight delivers to.
  std::unique_ptr<Buffer> cp_positions_;
  // Every slot's token buckets (3·B·T ints each; the first stage only), the
  // count of each, and the host's scratch for making them.
  std::unique_ptr<Buffer> buckets_;
  std::vector<int> bucket_counts_, host_buckets_, bucket_scratch_;
  std::vector<char> ring_send_, ring_recv_;
  void* ring_pending_ = nullptr;
  size_t ring_pending_bytes_ = 0;
  // Pipeline exchange in fp32 under a 16-bit compute type: every slot's
  // output (not on the last stage), the input gradient (not on the first).
  std::unique_ptr<Buffer> stage_out_, input_grad_;
  // The tp sums' fp32 staging on the device (16-bit compute only) and on
  // the host; the targets as this rank's vocabulary columns; the losses'
  // and log-sum-exps' host copies.
  std::unique_ptr<Buffer> tp_scratch_;
  // The cross-entropy's tp exchange in device memory (a device group only).
  std::unique_ptr<Buffer> lse_scratch_;
  std::vector<float> tp_host_, host_lse_;
  std::vector<int> shifted_targets_;
  const VocabShard vocab_;      // this rank's rows of wte (all of them without tp)
  const bool release_state_;    // params_ and grads_ give memory back (VMM)
  const bool release_compute_;  // compute_ held per unit in use (VMM)
  std::vector<float> host_losses_;
  // MoE layers: room for a regrouping's row index (B·T·K·ep int32).
  std::unique_ptr<Buffer> moe_rows_;
  // A device-memory ep group's plan counts, out and in (2·E floats).
  std::unique_ptr<Buffer> ep_counts_;
  // LoRA: each frozen tensor (frozen_layout()'s index) dense in the compute
  // type at element `dense` of frozen_dense_, or quantized with its arrays
  // at byte offsets of frozen_quant_; each layout() tensor's index there
  // (-1: an adapter); the dequantization tile; the norms' gradient sink;
  // the signed dynamic map (double-quantized NF4).
  struct FrozenTensor {
    int64_t dense = -1;
    DeviceQuantWeight quant;
    size_t codes_at = 0, absmax_at = 0;
    int64_t scale_at = -1;  // double quantization only
  };
  model::FrozenFormat frozen_format_;
  std::vector<FrozenTensor> frozen_;
  std::vector<int> frozen_index_;
  std::unique_ptr<Buffer> frozen_dense_, frozen_quant_, frozen_tile_, frozen_sink_, dynamic_map_;
};

// The GPU's FlatMath on `stream` (kernels.h's optimizer launchers); copies
// synchronise the stream. Allocates on `device`.
std::unique_ptr<FlatMath> MakeCudaFlatMath(CudaDevice* device);

}  // namespace shardtrain::engine::cuda

#endif  // SHARDTRAIN_WORKER_ENGINE_CUDA_CUDA_MODEL_H_
