// FlatMath: the optimizer side's arithmetic over flat fp32 arrays in one
// device's memory — the gradient norm, scaling, the AdamW update, and copies
// to and from the host for checkpoints. Data-parallel strategies and the
// optimizer call it on ranges of an engine's flat buffers, so the same
// strategy code steps a model held by the host or by a GPU.
//
// HostFlatMath is the host's, on a ThreadPool; engine/cuda has the GPU's.
// Results are deterministic: SquaredNorm sums in double over a fixed
// decomposition of [0, n), whatever the threads.
// Thread-compatible.
#ifndef SHARDTRAIN_WORKER_ENGINE_FLAT_MATH_H_
#define SHARDTRAIN_WORKER_ENGINE_FLAT_MATH_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "worker/engine/device.h"
#include "worker/engine/thread_pool.h"

namespace shardtrain::engine {

// One AdamW update's coefficients, computed once per step by the optimizer
// (optim/adamw.h): per element, with g = grad · grad_scale (the clip
// factor, applied in the update's pass instead of a pass of its own)
//   m = b1 m + (1-b1) g ;  v = b2 v + (1-b2) g²
//   p = p · decay - step_size · m / (sqrt(v) · inv_sqrt_bc2 + eps)
struct AdamWCoefficients {
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float decay = 1.0f;      // 1 - lr · weight_decay, or 1 for tensors without decay
  float step_size = 0.0f;  // lr / (1 - b1^t)
  float inv_sqrt_bc2 = 1.0f;
  float grad_scale = 1.0f;  // g = grad · grad_scale (the stored gradient is not changed)
};

// One range [begin, end) of the optimizer's arrays and its decay (the
// AdamWCoefficients' decay of that range: tensors with and without weight
// decay alternate in a model's flat buffer).
struct AdamWRange {
  size_t begin = 0, end = 0;
  float decay = 1.0f;
};

class FlatMath {
 public:
  virtual ~FlatMath() = default;
  // Sum of x[i]² over [0, n), in double.
  virtual double SquaredNorm(const float* x, size_t n) = 0;
  // x[i] *= s over [0, n).
  virtual void Scale(float* x, size_t n, float s) = 0;
  // dst[i] += src[i] over [0, n) (add), or dst = src (both in this math's
  // memory, not overlapping).
  virtual void Accumulate(float* dst, const float* src, size_t n, bool add) = 0;
  // The AdamW update of n elements; when zero_grads, g is set to 0 in the
  // same pass.
  virtual void AdamWUpdate(float* p, float* g, float* m, float* v, size_t n,
                           const AdamWCoefficients& c, bool zero_grads) = 0;
  // AdamWUpdate of every range (p, g, m, v offset by its begin; c.decay
  // replaced by the range's): one pass where a device can do them in one
  // launch (a GPU: a few launches instead of one per tensor). Default:
  // AdamWUpdate range by range. Either way the same bits.
  virtual void AdamWUpdateRanges(float* p, float* g, float* m, float* v,
                                 const std::vector<AdamWRange>& ranges, const AdamWCoefficients& c,
                                 bool zero_grads) {
    for (const AdamWRange& r : ranges) {
      AdamWCoefficients rc = c;
      rc.decay = r.decay;
      AdamWUpdate(p + r.begin, g + r.begin, m + r.begin, v + r.begin, r.end - r.begin, rc,
                  zero_grads);
    }
  }
  // 8-bit AdamW (optim/adamw8bit.h's update, the same bits as the host's)
  // of n elements whose moments m and v are block-wise codes (n bytes each)
  // and absmax (one per 2048 elements, each), every array in this math's
  // memory. ranges: num_ranges triples of uint32 words (begin, end,
  // decayed), sorted, in this math's memory; elements outside them take no
  // decay, decayed ones c.decay. m_map, v_map: the signed and unsigned code
  // maps (256 floats each, host memory). zero_grads: g is set to 0 once
  // read. Default: aborts (the host's optimizer updates its 8-bit state
  // itself, optim/adamw8bit.h).
  virtual void AdamW8bitUpdate(float* p, float* g, uint8_t* m, float* m_absmax, uint8_t* v,
                               float* v_absmax, size_t n, const uint32_t* ranges, int num_ranges,
                               const AdamWCoefficients& c, const float* m_map, const float* v_map,
                               bool zero_grads);
  // host[0, n) = x[0, n) and back (host memory is the caller's).
  virtual void CopyToHost(float* host, const float* x, size_t n) = 0;
  virtual void CopyFromHost(float* x, const float* host, size_t n) = 0;
  // The same, queued on the device's compute stream: they may return before
  // the copy is done (from page-locked host memory, Device::PinHost); an
  // Event recorded on that stream afterwards marks its end. The host memory
  // must stay untouched until then. Defaults: the synchronous copies.
  virtual void CopyToHostAsync(float* host, const float* x, size_t n) { CopyToHost(host, x, n); }
  virtual void CopyFromHostAsync(float* x, const float* host, size_t n) {
    CopyFromHost(x, host, n);
  }
  // CopyToHostAsync queued on `stream`, another stream of the same device
  // (a copy stream beside the compute stream, so the copy runs while the
  // kernels do); the caller orders it after the work that wrote x (an
  // Event). Default: CopyToHostAsync (the same result, without overlap).
  virtual void CopyToHostAsyncOn(Stream& stream, float* host, const float* x, size_t n) {
    (void)stream;
    CopyToHostAsync(host, x, n);
  }
  // bf16 copies of fp32 values (round to nearest even) and back, both
  // arrays in this math's memory: a reduction in bf16 (half the bytes).
  virtual void ToBFloat16(uint16_t* dst, const float* src, size_t n) = 0;
  virtual void FromBFloat16(float* dst, const uint16_t* src, size_t n) = 0;
  // n zero fp32 elements in this math's memory (aborts when it cannot).
  virtual std::unique_ptr<Buffer> Allocate(size_t n) = 0;
  // Where this math's arrays live.
  virtual DeviceKind kind() const = 0;
};

// The host's, on `pool` (null: serial). Allocate gives plain host memory.
class HostFlatMath final : public FlatMath {
 public:
  explicit HostFlatMath(ThreadPool* pool) : pool_(pool) {}
  ThreadPool* pool() const { return pool_; }
  double SquaredNorm(const float* x, size_t n) override;
  void Scale(float* x, size_t n, float s) override;
  void Accumulate(float* dst, const float* src, size_t n, bool add) override;
  void AdamWUpdate(float* p, float* g, float* m, float* v, size_t n, const AdamWCoefficients& c,
                   bool zero_grads) override;
  void CopyToHost(float* host, const float* x, size_t n) override;
  void CopyFromHost(float* x, const float* host, size_t n) override;
  void ToBFloat16(uint16_t* dst, const float* src, size_t n) override;
  void FromBFloat16(float* dst, const uint16_t* src, size_t n) override;
  std::unique_ptr<Buffer> Allocate(size_t n) override;
  DeviceKind kind() const override { return DeviceKind::kCpu; }

 private:
  ThreadPool* const pool_;
};

}  // namespace shardtrain::engine

#endif  // SHARDTRAIN_WORKER_ENGINE_FLAT_MATH_H_
