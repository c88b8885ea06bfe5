#include "worker/engine/cuda/cuda_model.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/engine/cuda/cuda_model_internal.h"

namespace shardtrain::engine::cuda {
namespace {

const char* Bytes(const void* p) { return static_cast<const char*>(p); }

}  // namespace

absl::StatusOr<std::unique_ptr<CudaModel>> CudaModel::Create(const model::ModelConfig& config,
                                                             int B, int T, int ordinal,
                                                             DataType compute, int host_threads,
                                                             const ModelEngineOptions& options) {
  if (auto s = ValidateModelEngine(config, B, T, options); !s.ok()) return s;
  if (config.moe.on() && options.cp != nullptr && options.cp->device_memory()) {
    return absl::InvalidArgumentError(
        "model.moe with parallel.cp: the expert load is summed over the ring in host memory (a "
        "group of device memory, parallel.comm: nccl, cannot take it yet)");
  }
  if (config.moe.on() && config.moe.experts > cuda::kMaxMoeExperts) {
    return absl::InvalidArgumentError(absl::StrCat("model.moe.experts: ", config.moe.experts,
                                                   " above the CUDA router's ",
                                                   cuda::kMaxMoeExperts));
  }
  const int tp = options.slice.tp;
  if (options.activations.flash_attention &&
      !cuda::FlashAttentionSupports(compute, config.q_dim() / tp, config.heads / tp,
                                    config.kv_heads / tp)) {
    return absl::InvalidArgumentError(
        absl::StrCat("flash attention needs bf16 or fp16 and a head size of 64 or 128 (compute ",
                     DataTypeName(compute), ", head size ", config.head_dim(), ")"));
  }
  if (host_threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat("threads must be >= 1, got ", host_threads));
  }
  absl::StatusOr<std::unique_ptr<CudaDevice>> device = CudaDevice::Create(ordinal);
  if (!device.ok()) return device.status();
  std::unique_ptr<CudaModel> gpt(
      new CudaModel(config, B, T, compute, host_threads, options, *std::move(device)));
  if (absl::Status s = gpt->Init(); !s.ok()) return s;
  return gpt;
}

CudaModel::CudaModel(const model::ModelConfig& config, int B, int T, DataType compute,
                     int host_threads, const ModelEngineOptions& options,
                     std::unique_ptr<CudaDevice> device)
    : ModelEngine(config, B, T, options, compute),
      pool_(host_threads),
      device_(std::move(device)),
      math_(MakeCudaFlatMath(device_.get())),
      vocab_(
          VocabShardOf(config.vocab, config.padded_vocab, options.slice.tp, options.slice.tp_rank)),
      release_state_(options.release_state),
      release_compute_(options.release_compute_copy) {
  frozen_format_ = options.frozen;
}

CudaModel::~CudaModel() {
  // Nothing may still write into the buffers about to be freed.
  if (device_ != nullptr) device_->compute_stream().Synchronize().IgnoreError();
}

absl::Status CudaModel::Init() {
  if (absl::Status s = KernelContext::Create(stream(), compute(), &kernels_); !s.ok()) return s;
  const size_t n = layout().num_params();
  const int64_t BT = int64_t{max_batch()} * max_seq_len();
  auto alloc = [&](size_t count, DataType dt, std::unique_ptr<Buffer>* out) -> absl::Status {
    absl::StatusOr<std::unique_ptr<Buffer>> b = device_->Allocate(count, dt);
    if (!b.ok()) return b.status();
    *out = *std::move(b);
    return absl::OkStatus();
  };
  // ZeRO-2/3 give ranges of the fp32 master and gradients back.
  auto state = [&](std::unique_ptr<Buffer>* out) -> absl::Status {
    if (!release_state_) return alloc(n, DataType::kFloat32, out);
    absl::StatusOr<std::unique_ptr<Buffer>> b = device_->AllocateReleasable(n, DataType::kFloat32);
    if (!b.ok()) return b.status();
    *out = *std::move(b);
    return absl::OkStatus();
  };
  absl::Status s = state(&params_);
  if (s.ok()) s = state(&grads_);
  if (s.ok() && compute() != DataType::kFloat32) {
    if (release_compute_) {  // mapped unit by unit while in use (OnUnitUse)
      absl::StatusOr<std::unique_ptr<Buffer>> b = device_->AllocateReleasable(n, compute());
      if (!b.ok()) return b.status();
      compute_ = *std::move(b);
      compute_->Release(0, n);
    } else {
      s = alloc(n, compute(), &compute_);
    }
  }
  if (s.ok()) {
    s = alloc(static_cast<size_t>(activation_alloc_bytes() / 4), DataType::kFloat32, &acts_);
  }
  // Token ids and targets of every slot (int32, 4 bytes like fp32).
  if (s.ok()) s = alloc(static_cast<size_t>(2 * slots() * BT), DataType::kFloat32, &ids_);
  if (s.ok()) s = alloc(static_cast<size_t>(config().padded_vocab), DataType::kFloat32, &row_);
  if (s.ok() && config().moe.on()) {  // int32, 4 bytes like fp32
    s = alloc(static_cast<size_t>(BT * config().moe.top_k * layout().slice().ep),
              DataType::kFloat32, &moe_rows_);
  }
  if (s.ok() && ep() != nullptr && ep()->device_memory()) {
    s = alloc(size_t(2 * config().moe.experts), DataType::kFloat32, &ep_counts_);
  }
  const size_t io = StageIoElements();
  // The tp collectives convert a 16-bit compute type to fp32 here; in
  // device memory a reduce-scatter needs its whole input (BT·C at most) and
  // its output (BT·C / tp) at once.
  if (s.ok() && tp() != nullptr && compute() != DataType::kFloat32) {
    const size_t full = size_t(BT) * size_t(config().dim);
    s = alloc(full + (tp()->device_memory() ? full / size_t(tp()->size()) : 0), DataType::kFloat32,
              &tp_scratch_);
  }
  // The vocabulary-parallel cross-entropy's 3·BT floats, in device memory.
  if (s.ok() && tp() != nullptr && tp()->device_memory()) {
    s = alloc(size_t(3 * BT), DataType::kFloat32, &lse_scratch_);
  }
  // An interleaved slice's chunks send and receive on every stage.
  const bool chunked = chunks() > 1;
  if (s.ok() && compute() != DataType::kFloat32 && (!layout().slice().last_stage || chunked)) {
    s = alloc(io * size_t(slots()), DataType::kFloat32, &stage_out_);
  }
  if (s.ok() && compute() != DataType::kFloat32 && (!layout().slice().first_stage || chunked)) {
    s = alloc(io, DataType::kFloat32, &input_grad_);
  }
  // Rotary's table, once: every block of every slot rotates by it.
  if (s.ok() && config().positions == model::PositionKind::kRotary) {
    const std::vector<float>& table = rotary_table();
    if (table.empty()) return absl::InternalError("CudaModel: rotary positions without a table");
    s = alloc(table.size(), DataType::kFloat32, &rotary_table_);
    if (s.ok()) math_->CopyFromHost(rotary_table_->as<float>(), table.data(), table.size());
  }
  // Every cp rank's column positions, once (int32, 4 bytes like fp32).
  if (s.ok() && cp() != nullptr) {
    const int n_cp = cp()->size(), T = max_seq_len();
    s = alloc(size_t(n_cp) * size_t(T), DataType::kFloat32, &cp_positions_);
    for (int r = 0; s.ok() && r < n_cp; ++r) {
      CheckCuda(cudaMemcpy(cp_positions_->as<int>() + int64_t{r} * T, ModelEngine::CpPositions(r),
                           sizeof(int) * size_t(T), cudaMemcpyHostToDevice),
                "cudaMemcpy (cp positions)");
    }
  }
  if (s.ok() && layout().slice().first_stage) {
    s = alloc(size_t(3 * slots() * BT), DataType::kFloat32, &buckets_);
    bucket_counts_.assign(slots(), 0);
  }
  if (s.ok() && config().lora.on()) s = InitFrozen(frozen_format_);
  if (!s.ok()) return s;
  BindActivations(acts_->as<char>());
  host_losses_.resize(BT);
  return absl::OkStatus();
}

int64_t CudaModel::allocated_bytes() const {
  int64_t total = 0;
  for (const auto* b :
       {&params_, &grads_, &compute_, &acts_, &ids_, &row_, &stage_out_, &input_grad_, &tp_scratch_,
        &lse_scratch_, &rotary_table_, &cp_positions_, &buckets_, &frozen_dense_, &frozen_quant_,
        &frozen_tile_, &frozen_sink_, &dynamic_map_}) {
    if (*b != nullptr) total += int64_t((*b)->bytes());
  }
  return total;
}

cudaStream_t CudaModel::stream() const {
  return static_cast<cudaStream_t>(device_->compute_stream().native());
}

void CudaModel::Check(const absl::Status& s) const {
  if (!s.ok()) {
    std::fprintf(stderr, "CudaModel on %s: %s\n", device_->name().c_str(),
                 std::string(s.message()).c_str());
    std::abort();
  }
}

const void* CudaModel::param(int tensor) const {
  if (tensor < 0) return nullptr;
  if (layout().tensors()[tensor].frozen) return frozen_param(tensor);
  const Buffer& b = compute_ != nullptr ? *compute_ : *params_;
  return Bytes(b.data()) + layout().offset(tensor) * DataTypeSize(b.dtype());
}

float* CudaModel::grad(int tensor) const {
  if (tensor < 0 || layout().tensors()[tensor].frozen) return nullptr;
  return grads_->as<float>() + layout().offset(tensor);
}

int* CudaModel::DeviceTokens(int k) const {
  return ids_->as<int>() + int64_t{2} * k * max_batch() * max_seq_len();
}

TokenBuckets CudaModel::DeviceBuckets(int k) const {
  TokenBuckets b;
  b.data = buckets_->as<int>() + int64_t{3} * k * max_batch() * max_seq_len();
  b.count = bucket_counts_[k];
  return b;
}

int* CudaModel::DeviceTargets(int k) const {
  return DeviceTokens(k) + int64_t{max_batch()} * max_seq_len();
}

void CudaModel::InitParamsInto(uint64_t seed, size_t begin, size_t end, float* out) {
  std::vector<float> host(end - begin);
  InitSliceHost(seed, begin, end, host.data(), &pool_);
  math_->CopyFromHost(out, host.data(), host.size());
}

const float* CudaModel::AsFloat32(float* dst, const void* src, int64_t n) const {
  if (compute() == DataType::kFloat32) return static_cast<const float*>(src);
  Check(ConvertToFloat32(k(), dst, src, n));
  return dst;
}

const float* CudaModel::StageOutput(int k_slot) const {
  if (PipelineLast(slot(k_slot))) return nullptr;
  const int64_t n = static_cast<int64_t>(StageIoElements());
  float* dst = stage_out_ == nullptr ? nullptr : stage_out_->as<float>() + k_slot * n;
  return AsFloat32(dst, LastOutput(slot(k_slot)), n);
}

const float* CudaModel::InputGrad() const {
  if (!has_input_grad()) return nullptr;
  float* dst = input_grad_ == nullptr ? nullptr : input_grad_->as<float>();
  return AsFloat32(dst, dresidual(), static_cast<int64_t>(StageIoElements()));
}

void CudaModel::ZeroGrad() {
  CheckCuda(cudaMemsetAsync(grads_->data(), 0, grads_->bytes(), stream()),
            "cudaMemsetAsync (grads)");
}

void CudaModel::ReadLogits(int row, float* out) const {
  if (slot(0).dlogits_scale != 0.0f) {
    Fail(
        "CudaModel::ReadLogits: the last forward turned the logits into their gradient "
        "(ExpectBackward)");
  }
  // This rank's real columns (all of them without tp), as the CPU engine.
  const void* logits = Bytes(slot(0).logits) + int64_t{row} * vocab_.Vpt * DataTypeSize(compute());
  Check(ConvertToFloat32(k(), row_->as<float>(), logits, vocab_.real));
  CheckCuda(cudaMemcpyAsync(out, row_->data(), sizeof(float) * vocab_.real, cudaMemcpyDeviceToHost,
                            stream()),
            "cudaMemcpyAsync (logits)");
  CheckCuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize (logits)");
}

void CudaModel::OnUnitUse(int unit, bool backward) {
  if (compute_ == nullptr) return;  // fp32: the master is the compute copy
  // A copy kept since the forward is current in backward (half the
  // conversions of a step); one given back after use (ZeRO-3) is not.
  if (backward && !release_compute_) return;
  const model::UnitInfo& u = layout().units()[unit];
  if (release_compute_) compute_->Acquire(u.offset, u.numel);
  Check(ConvertFromFloat32(k(), compute_->as<char>() + u.offset * DataTypeSize(compute()),
                           params_->as<float>() + u.offset, static_cast<int64_t>(u.numel)));
}

void CudaModel::OnUnitDone(int unit) {
  if (compute_ == nullptr || !release_compute_) return;
  const model::UnitInfo& u = layout().units()[unit];
  compute_->Release(u.offset, u.numel);  // waits for the kernels reading it
}

// ---- the layers

void CudaModel::EncoderForward(SlotActs& s) {
  const int k_slot = SlotIndex(s);
  CheckCuda(cudaMemcpyAsync(DeviceTokens(k_slot), s.tokens.data(), sizeof(int) * s.b * s.t,
                            cudaMemcpyHostToDevice, stream()),
            "cudaMemcpyAsync (tokens)");
  // The rows grouped by token for EncoderBackward's wte gradient (this
  // rank's vocabulary rows only; the scan needs none).
  if (k().fused) {
    bucket_counts_[k_slot] = BuildTokenBuckets(s.tokens.data(), s.b * s.t, vocab_.v0, vocab_.real,
                                               &host_buckets_, &bucket_scratch_);
    CheckCuda(cudaMemcpyAsync(const_cast<int*>(DeviceBuckets(k_slot).data), host_buckets_.data(),
                              sizeof(int) * host_buckets_.size(), cudaMemcpyHostToDevice, stream()),
              "cudaMemcpyAsync (token buckets)");
  }
  // Without learned positions (rotary) wpe() is -1: param() gives null and
  // the embeddings are wte's rows alone.
  // Under cp the columns' positions are this rank's chunks (null: 0..T-1).
  const int* pos = DevicePositions();
  if (tp() == nullptr) {
    Check(cuda::EncoderForwardShard(k(), s.encoded, DeviceTokens(k_slot), param(layout().wte()),
                                    param(layout().wpe()), 0, std::numeric_limits<int>::max(), s.b,
                                    s.t, config().dim, pos));
    return;
  }
  const int C = config().dim, N = s.b * s.t;
  if (sequence_parallel() && pos != nullptr) {
    // Under cp the rows' positions are not (first + r) mod T: wpe goes in
    // before the reduce-scatter, added by tp rank 0 only (the sum is exact).
    Check(cuda::EncoderForwardShard(k(), sp_full(), DeviceTokens(k_slot), param(layout().wte()),
                                    tp()->rank() == 0 ? param(layout().wpe()) : nullptr, vocab_.v0,
                                    vocab_.real, s.b, s.t, C, pos));
    TpReduceScatter(s.encoded, sp_full(), int64_t{LocalRows(N)} * C);
    return;
  }
  if (sequence_parallel()) {
    // This rank's rows of wte for all N rows into sp_full, reduce-scattered
    // to its LocalRows(N) rows [rank·N/tp, +N/tp), then their positions.
    Check(cuda::EncoderForwardShard(k(), sp_full(), DeviceTokens(k_slot), param(layout().wte()),
                                    nullptr, vocab_.v0, vocab_.real, s.b, s.t, C));
    const int rows = LocalRows(N);
    TpReduceScatter(s.encoded, sp_full(), int64_t{rows} * C);
    if (layout().wpe() >= 0) {
      Check(cuda::AddPositionRows(k(), s.encoded, param(layout().wpe()),
                                  int64_t{rows} * tp()->rank(), rows, s.t, C));
    }
    return;
  }
  // Vocabulary-parallel: this rank's rows (wpe added by tp rank 0 only),
  // summed over tp (one rank holds each token's row: the sum is exact).
  Check(cuda::EncoderForwardShard(k(), s.encoded, DeviceTokens(k_slot), param(layout().wte()),
                                  tp()->rank() == 0 ? param(layout().wpe()) : nullptr, vocab_.v0,
                                  vocab_.real, s.b, s.t, C, pos));
  TpAllReduceSum(s.encoded, int64_t{N} * C);
}

// dwpe is null without learned positions (grad(-1)): wte's gradient alone.
void CudaModel::EncoderBackward(const SlotActs& s, const void* dout) {
  if (grad(layout().wte()) == nullptr) return;  // frozen embeddings (LoRA)
  const TokenBuckets buckets = DeviceBuckets(SlotIndex(s));
  Check(cuda::EncoderBackwardShard(
      k(), grad(layout().wte()), grad(layout().wpe()), dout, DeviceTokens(SlotIndex(s)), vocab_.v0,
      vocab_.real, s.b, s.t, config().dim, DevicePositions(), k().fused ? &buckets : nullptr));
}

void CudaModel::CopyFromFloat32(void* dst, const float* src, int64_t n) {
  Check(ConvertFromFloat32(k(), dst, src, n));
}

void CudaModel::Zero(void* p, int64_t n) {
  CheckCuda(cudaMemsetAsync(p, 0, n * DataTypeSize(compute()), stream()), "cudaMemsetAsync");
}

void CudaModel::LayerNormForward(void* out, float* mean, float* rstd, const void* inp, int weight,
                                 int bias, int N, int C) {
  Check(cuda::LayerNormForward(k(), out, mean, rstd, inp, param(weight), param(bias), N, C));
}

void CudaModel::LayerNormBackward(void* dinp, const void* dout, const void* inp, const float* mean,
                                  const float* rstd, int weight, int bias, int N, int C) {
  Check(cuda::LayerNormBackward(k(), dinp, norm_grad(weight), norm_grad(bias), dout, inp,
                                param(weight), mean, rstd, N, C));
}

void CudaModel::MatmulForward(void* out, const void* inp, int weight, int bias, int N, int IC,
                              int OC, int ld_out) {
  if (const DeviceQuantWeight* q = quantized(weight); q != nullptr) {
    QuantMatmulForward(out, inp, *q, bias, N, ld_out);
    return;
  }
  Check(cuda::MatmulForward(k(), out, inp, param(weight), bias < 0 ? nullptr : param(bias), N, IC,
                            OC, ld_out));
}

void CudaModel::MatmulBackward(void* dinp, const void* dout, int ld_dout, const void* inp,
                               int weight, int bias, int N, int IC, int OC) {
  if (const DeviceQuantWeight* q = quantized(weight); q != nullptr) {
    QuantMatmulBackward(dinp, dout, ld_dout, *q, N, /*overwrite=*/false);
    return;
  }
  Check(cuda::MatmulBackward(k(), dinp, grad(weight), bias < 0 ? nullptr : grad(bias), dout,
                             ld_dout, inp, param(weight), N, IC, OC));
}

// The GEMM writes dinp (beta 0): no zeros written first.
void CudaModel::MatmulBackwardOverwrite(void* dinp, const void* dout, int ld_dout, const void* inp,
                                        int weight, int bias, int N, int IC, int OC) {
  if (const DeviceQuantWeight* q = quantized(weight); q != nullptr) {
    QuantMatmulBackward(dinp, dout, ld_dout, *q, N, /*overwrite=*/true);
    return;
  }
  Check(cuda::MatmulBackward(k(), dinp, grad(weight), bias < 0 ? nullptr : grad(bias), dout,
                             ld_dout, inp, param(weight), N, IC, OC, /*overwrite_dinp=*/true));
}

void CudaModel::AddBias(void* out, int bias, int N, int OC) {
  if (bias < 0) return;  // a recipe without biases
  Check(cuda::AddBias(k(), out, param(bias), N, OC));
}

void CudaModel::RmsNormForward(void* out, float* rstd, const void* inp, int weight, int N, int C) {
  Check(cuda::RmsNormForward(k(), out, rstd, inp, param(weight),
                             static_cast<float>(config().norm_eps), N, C));
}

void CudaModel::RmsNormBackward(void* dinp, const void* dout, const void* inp, const float* rstd,
                                int weight, int N, int C) {
  Check(cuda::RmsNormBackward(k(), dinp, norm_grad(weight), dout, inp, param(weight), rstd, N, C));
}

// q's NHt and k's KVHt heads, side by side from column 0 of the qkv rows of
// (NHt + 2·KVHt)·hs; v's heads after them are not rotated.
void CudaModel::RotaryForward(void* qkv, int b, int t, int NHt, int KVHt, bool inverse) {
  if (rotary_table_ == nullptr) Fail("CudaModel: RotaryForward without rotary positions");
  const int hs = config().head_dim();
  Check(cuda::RotaryForward(k(), qkv, rotary_table_->as<float>(), b, t, NHt + KVHt, hs,
                            (NHt + 2 * KVHt) * hs, inverse, DevicePositions()));
}

// Qwen3's q/k norms: q's NHt heads and k's KVHt, side by side from column 0
// of the qkv rows; their saved values share one buffer of NHt + KVHt heads.
void CudaModel::QkNormForward(void* qkv, void* pre, float* rstd, int wq, int wk, int N, int NHt,
                              int KVHt) {
  const int hs = config().head_dim(), ld = (NHt + 2 * KVHt) * hs, heads = NHt + KVHt;
  const float eps = static_cast<float>(config().norm_eps);
  const size_t es = DataTypeSize(compute());
  char* x = static_cast<char*>(qkv);
  char* p = static_cast<char*>(pre);
  Check(cuda::HeadRmsNormForward(k(), x, ld, p, rstd, heads, param(wq), eps, N, NHt, hs));
  Check(cuda::HeadRmsNormForward(k(), x + NHt * hs * es, ld, p + NHt * hs * es, rstd + NHt, heads,
                                 param(wk), eps, N, KVHt, hs));
}

void CudaModel::QkNormBackward(void* dqkv, const void* pre, const float* rstd, int wq, int wk,
                               int N, int NHt, int KVHt) {
  const int hs = config().head_dim(), ld = (NHt + 2 * KVHt) * hs, heads = NHt + KVHt;
  const size_t es = DataTypeSize(compute());
  char* d = static_cast<char*>(dqkv);
  const char* p = static_cast<const char*>(pre);
  Check(
      cuda::HeadRmsNormBackward(k(), d, ld, norm_grad(wq), p, rstd, heads, param(wq), N, NHt, hs));
  Check(cuda::HeadRmsNormBackward(k(), d + NHt * hs * es, ld, norm_grad(wk), p + NHt * hs * es,
                                  rstd + NHt, heads, param(wk), N, KVHt, hs));
}

// Flash attention where the table says so (policy().flash_attention: att
// and scratch are then fp32 rows); the materialized kernels otherwise.
void CudaModel::AttentionForward(void* out, void* att, void* scratch, const void* qkv, int b, int t,
                                 int Ct, int NHt, int KVHt) {
  if (policy().flash_attention) {
    Check(
        cuda::FlashAttentionForward(k(), out, static_cast<float*>(att), qkv, b, t, Ct, NHt, KVHt));
    return;
  }
  Check(cuda::AttentionForward(k(), out, att, scratch, qkv, b, t, Ct, NHt, KVHt));
}

void CudaModel::AttentionBackward(void* dqkv, void* scratch, const void* dout, const void* qkv,
                                  const void* out, const void* att, int b, int t, int Ct, int NHt,
                                  int KVHt) {
  if (policy().flash_attention) {
    Check(cuda::FlashAttentionBackward(k(), dqkv, static_cast<float*>(scratch), dout, qkv, out,
                                       static_cast<const float*>(att), b, t, Ct, NHt, KVHt));
    return;
  }
  Check(cuda::AttentionBackward(k(), dqkv, scratch, dout, qkv, att, b, t, Ct, NHt, KVHt));
}

void CudaModel::SwiGluForward(void* out, const void* inp, int N, int H) {
  Check(cuda::SwiGluForward(k(), out, inp, N, H));
}

void CudaModel::SwiGluBackward(void* dinp, const void* inp, const void* dout, int N, int H) {
  Check(cuda::SwiGluBackward(k(), dinp, inp, dout, N, H));
}

void CudaModel::GeluForward(void* out, const void* inp, int64_t n) {
  Check(cuda::GeluForward(k(), out, inp, n));
}

void CudaModel::GeluBackward(void* dinp, const void* inp, const void* dout, int64_t n) {
  Check(cuda::GeluBackward(k(), dinp, inp, dout, n));
}

// The GELU in the GEMMs' epilogues under a 16-bit compute type (fp32 keeps
// the separate kernels: equal to the CPU engine to rounding); false where
// cuBLASLt has no such algorithm (UNIMPLEMENTED: nothing ran).
bool CudaModel::MatmulGeluForward(void* act, void* pre, const void* inp, int weight, int bias,
                                  int N, int IC, int OC) {
  if (compute() == DataType::kFloat32 || quantized(weight) != nullptr) return false;
  const absl::Status s = cuda::MatmulGeluForward(k(), act, pre, inp, param(weight),
                                                 bias < 0 ? nullptr : param(bias), N, IC, OC);
  if (absl::IsUnimplemented(s)) return false;
  Check(s);
  return true;
}

bool CudaModel::MatmulDGeluBackward(void* dpre, const void* dout, int ld_dout, const void* act,
                                    const void* pre, int weight, int bias, int N, int IC, int OC) {
  if (compute() == DataType::kFloat32 || quantized(weight) != nullptr) return false;
  const absl::Status s =
      cuda::MatmulDGeluBackward(k(), dpre, grad(weight), bias < 0 ? nullptr : grad(bias), dout,
                                ld_dout, act, pre, param(weight), N, IC, OC);
  if (absl::IsUnimplemented(s)) return false;
  Check(s);
  return true;
}

void CudaModel::ResidualForward(void* out, const void* inp1, const void* inp2, int64_t n) {
  Check(cuda::ResidualForward(k(), out, inp1, inp2, n));
}

// The LM head's weight is layout().lm_head(): wte when tied, the final
// unit's lm_head (Vp, C), split over tp by rows like wte, when not. It runs
// over all Vpt rows of this rank's head (Vp without tp), not its real ones:
// GEMMs whose m is a multiple of 8 get Hopper's fast kernels (V = 50257
// fell back to align-1 ones, 10% of a GPT-2 step). The padding rows stay
// zero (their gradient is 0: CrossEntropyBackward zeroes the padding
// columns of dlogits), and no one reads the padding logits.
void CudaModel::LmHeadForward(SlotActs& s) {
  Check(cuda::MatmulForward(k(), s.logits, s.lnf, param(layout().lm_head()), nullptr, s.b * s.t,
                            config().dim, vocab_.Vpt, vocab_.Vpt));
}

double CudaModel::CrossEntropyForward(SlotActs& s) { return LossForward(s, 0.0f); }

// The fused classifier under a 16-bit compute type (fp32 keeps the separate
// kernels, equal to the CPU engine); the engine asks only without tp.
bool CudaModel::CrossEntropyForwardBackward(SlotActs& s, float dloss, double* loss_sum) {
  if (compute() == DataType::kFloat32 || !k().fused || tp() != nullptr) return false;
  *loss_sum = LossForward(s, dloss);
  return true;
}

double CudaModel::LossForward(SlotActs& s, float dloss) {
  const int N = s.b * s.t, k_slot = SlotIndex(s);
  // The targets as columns of this rank's logits (v0 = 0 without tp): one
  // held by another tp rank matches none.
  shifted_targets_.resize(N);
  for (int i = 0; i < N; ++i) shifted_targets_[i] = s.targets[i] - vocab_.v0;
  CheckCuda(cudaMemcpyAsync(DeviceTargets(k_slot), shifted_targets_.data(), sizeof(int) * N,
                            cudaMemcpyHostToDevice, stream()),
            "cudaMemcpyAsync (targets)");
  host_losses_.assign(N, NAN);
  host_lse_.assign(N, -INFINITY);  // a rank holding no real column adds nothing
  if (vocab_.real > 0 && dloss != 0.0f) {
    Check(cuda::CrossEntropyForwardBackward(k(), s.losses, s.lse, s.logits, DeviceTargets(k_slot),
                                            dloss, N, vocab_.real, vocab_.Vpt));
  } else if (vocab_.real > 0) {
    Check(cuda::CrossEntropyForward(k(), s.losses, s.lse, s.logits, DeviceTargets(k_slot), N,
                                    vocab_.real, vocab_.Vpt));
  }
  if (vocab_.real > 0) {
    CheckCuda(cudaMemcpyAsync(host_losses_.data(), s.losses, sizeof(float) * N,
                              cudaMemcpyDeviceToHost, stream()),
              "cudaMemcpyAsync (losses)");
    if (tp() != nullptr) {
      CheckCuda(cudaMemcpyAsync(host_lse_.data(), s.lse, sizeof(float) * N, cudaMemcpyDeviceToHost,
                                stream()),
                "cudaMemcpyAsync (lse)");
    }
    CheckCuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize (losses)");
  }
  if (tp() != nullptr) CombineVocabShards(s, N);
  double sum = 0;
  for (int i = 0; i < N; ++i) sum += host_losses_[i];
  return sum;
}

void CudaModel::CrossEntropyBackward(SlotActs& s, float dloss) {
  const int N = s.b * s.t;
  if (vocab_.real == 0) {  // no real column here: the gradient is 0
    Zero(s.logits, int64_t{N} * vocab_.Vpt);
    return;
  }
  Check(cuda::CrossEntropyBackward(k(), s.logits, s.lse, DeviceTargets(SlotIndex(s)), dloss, N,
                                   vocab_.real, vocab_.Vpt));
}

void CudaModel::LmHeadBackward(SlotActs& s, void* dln) {
  Check(cuda::MatmulBackward(k(), dln, grad(layout().lm_head()), nullptr, s.logits, vocab_.Vpt,
                             s.lnf, param(layout().lm_head()), s.b * s.t, config().dim,
                             vocab_.Vpt));
}

}  // namespace shardtrain::engine::cuda
