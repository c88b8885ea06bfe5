// The GPU's FlatMath (cuda_model.h MakeCudaFlatMath): the optimizer side's
// arithmetic as kernels.h's launchers on the device's compute stream.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "worker/engine/cuda/cuda_model.h"
#include "worker/engine/cuda/cuda_model_internal.h"
#include "worker/engine/cuda/kernels.h"

namespace shardtrain::engine::cuda {
namespace {

// The GPU's optimizer-side arithmetic (kernels.h), ordered on the compute
// stream; reads back to the host synchronise it.
class CudaFlatMath final : public FlatMath {
 public:
  explicit CudaFlatMath(CudaDevice* device) : device_(device) {}
  double SquaredNorm(const float* x, size_t n) override {
    if (n == 0) return 0;
    const int blocks = SquaredNormBlocks(static_cast<int64_t>(n));
    if (partial_ == nullptr || partial_->count() < size_t(blocks) * 2) {
      partial_ = Alloc(size_t(blocks) * 2);  // doubles as pairs of floats
    }
    Check(SquaredNormPartial(stream(), partial_->as<double>(), x, static_cast<int64_t>(n)));
    std::vector<double> host(blocks);
    CheckCuda(cudaMemcpyAsync(host.data(), partial_->data(), sizeof(double) * blocks,
                              cudaMemcpyDeviceToHost, stream()),
              "cudaMemcpyAsync (norm partials)");
    CheckCuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize (norm)");
    double total = 0;
    for (double d : host) total += d;  // in order: deterministic
    return total;
  }
  void Scale(float* x, size_t n, float s) override {
    Check(ScaleFloat32(stream(), x, static_cast<int64_t>(n), s));
  }
  void AdamWUpdate(float* p, float* g, float* m, float* v, size_t n, const AdamWCoefficients& c,
                   bool zero_grads) override {
    Check(cuda::AdamWUpdate(stream(), p, g, m, v, static_cast<int64_t>(n), Args(c, c.decay)));
    if (zero_grads) {
      CheckCuda(cudaMemsetAsync(g, 0, n * sizeof(float), stream()), "cudaMemsetAsync (grads)");
    }
  }
  // The multi-tensor update: every range in one launch (per 128 ranges).
  void AdamWUpdateRanges(float* p, float* g, float* m, float* v,
                         const std::vector<AdamWRange>& ranges, const AdamWCoefficients& c,
                         bool zero_grads) override {
    std::vector<AdamWRangeArgs> args(ranges.size());
    for (size_t k = 0; k < ranges.size(); ++k) {
      args[k].begin = static_cast<int64_t>(ranges[k].begin);
      args[k].end = static_cast<int64_t>(ranges[k].end);
      args[k].weight_decay = Args(c, ranges[k].decay).weight_decay;
    }
    Check(cuda::AdamWUpdateRanges(stream(), p, g, m, v, args.data(), static_cast<int>(args.size()),
                                  Args(c, 1.0f), zero_grads));
  }
  void CopyToHost(float* host, const float* x, size_t n) override {
    CheckCuda(cudaMemcpyAsync(host, x, n * sizeof(float), cudaMemcpyDeviceToHost, stream()),
              "cudaMemcpyAsync (to host)");
    CheckCuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize (to host)");
  }
  void CopyFromHost(float* x, const float* host, size_t n) override {
    CheckCuda(cudaMemcpyAsync(x, host, n * sizeof(float), cudaMemcpyHostToDevice, stream()),
              "cudaMemcpyAsync (from host)");
    CheckCuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize (from host)");
  }
  void Accumulate(float* dst, const float* src, size_t n, bool add) override {
    if (n == 0) return;
    if (!add) {
      CheckCuda(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream()),
                "cudaMemcpyAsync (device to device)");
      return;
    }
    KernelCtx ctx;
    ctx.stream = stream();
    ctx.dtype = DataType::kFloat32;
    Check(AddInPlace(ctx, dst, src, static_cast<int64_t>(n)));
  }
  void CopyToHostAsync(float* host, const float* x, size_t n) override {
    CheckCuda(cudaMemcpyAsync(host, x, n * sizeof(float), cudaMemcpyDeviceToHost, stream()),
              "cudaMemcpyAsync (to host, queued)");
  }
  void CopyFromHostAsync(float* x, const float* host, size_t n) override {
    CheckCuda(cudaMemcpyAsync(x, host, n * sizeof(float), cudaMemcpyHostToDevice, stream()),
              "cudaMemcpyAsync (from host, queued)");
  }
  void ToBFloat16(uint16_t* dst, const float* src, size_t n) override {
    Check(ConvertFromFloat32(Bf16Ctx(), dst, src, static_cast<int64_t>(n)));
  }
  void FromBFloat16(float* dst, const uint16_t* src, size_t n) override {
    Check(ConvertToFloat32(Bf16Ctx(), dst, src, static_cast<int64_t>(n)));
  }
  void AdamW8bitUpdate(float* p, float* g, uint8_t* m, float* m_absmax, uint8_t* v, float* v_absmax,
                       size_t n, const uint32_t* ranges, int num_ranges, const AdamWCoefficients& c,
                       const float* m_map, const float* v_map, bool zero_grads) override {
    AdamW8bitArgs a;
    a.beta1 = c.beta1;
    a.beta2 = c.beta2;
    a.eps = c.eps;
    a.decay = c.decay;
    a.step_size = c.step_size;
    a.inv_sqrt_bc2 = c.inv_sqrt_bc2;
    a.grad_scale = c.grad_scale;
    std::copy(m_map, m_map + 256, a.m_map);
    std::copy(v_map, v_map + 256, a.v_map);
    Check(cuda::AdamW8bitUpdate(stream(), p, g, m, m_absmax, v, v_absmax, static_cast<int64_t>(n),
                                ranges, num_ranges, a, zero_grads));
  }
  void CopyToHostAsyncOn(Stream& on, float* host, const float* x, size_t n) override {
    CheckCuda(cudaMemcpyAsync(host, x, n * sizeof(float), cudaMemcpyDeviceToHost,
                              static_cast<cudaStream_t>(on.native())),
              "cudaMemcpyAsync (to host, on a copy stream)");
  }
  std::unique_ptr<Buffer> Allocate(size_t n) override { return Alloc(n); }
  DeviceKind kind() const override { return DeviceKind::kCuda; }

 private:
  // kernels.h's AdamW: p -= lr·wd·p, then p -= lr·(m/bias1)/(sqrt(v/bias2)+eps).
  // The host's form (p·decay − step_size·m/(sqrt(v)·inv_sqrt_bc2 + eps)) is
  // the same update: lr·wd = 1 − decay, lr/bias1 = step_size, sqrt(bias2) =
  // 1/inv_sqrt_bc2. The kernel takes lr = step_size with bias1 = 1, and
  // weight_decay = (1 − decay)/step_size when step_size > 0.
  static AdamWArgs Args(const AdamWCoefficients& c, float decay) {
    AdamWArgs a;
    a.lr = c.step_size;
    a.beta1 = c.beta1;
    a.beta2 = c.beta2;
    a.eps = c.eps;
    a.weight_decay = c.step_size > 0 ? (1.0f - decay) / c.step_size : 0.0f;
    a.bias1 = 1.0f;
    a.bias2 = 1.0f / (c.inv_sqrt_bc2 * c.inv_sqrt_bc2);
    a.grad_scale = c.grad_scale;
    return a;
  }
  cudaStream_t stream() const {
    return static_cast<cudaStream_t>(device_->compute_stream().native());
  }
  // The conversion kernels' context: bf16 on the compute stream.
  KernelCtx Bf16Ctx() const {
    KernelCtx ctx;
    ctx.stream = stream();
    ctx.dtype = DataType::kBFloat16;
    return ctx;
  }
  std::unique_ptr<Buffer> Alloc(size_t n) {
    absl::StatusOr<std::unique_ptr<Buffer>> b = device_->Allocate(n, DataType::kFloat32);
    if (!b.ok()) {
      std::fprintf(stderr, "CudaFlatMath: %s\n", std::string(b.status().message()).c_str());
      std::abort();
    }
    return *std::move(b);
  }
  static void Check(const absl::Status& s) {
    if (!s.ok()) {
      std::fprintf(stderr, "CudaFlatMath: %s\n", std::string(s.message()).c_str());
      std::abort();
    }
  }
  CudaDevice* const device_;
  std::unique_ptr<Buffer> partial_;
};

}  // namespace

std::unique_ptr<FlatMath> MakeCudaFlatMath(CudaDevice* device) {
  return std::make_unique<CudaFlatMath>(device);
}

}  // namespace shardtrain::engine::cuda
