// OffHostEngine: a CPU engine that poses as a GPU one. Its parameter and
// gradient buffers say they live on a GPU (DeviceKind::kCuda), and every
// pointer into its memory that it hands out — the buffers' data, pipeline
// outputs and input gradients, what its math() allocates — is "device"
// address: the host address plus kTag, which the host cannot dereference
// (a direct read or write faults, as on a real GPU rank, where such a read
// crashed Ddp::Step on an H100). Its FlatMath (norms, scaling, AdamW, the
// copies to and from the host) and its own entry points (InitParamsInto,
// StageForward's input, StageBackward's doutput) take device addresses and
// translate them. So a data-parallel strategy or a pipeline executor that
// runs with it reaches the engine's memory only as it must on a GPU:
// through math() and the engine — and its buffers' Release/Acquire
// protocol (see DeviceLabelled).
//
// Tests run the GPU path's logic (host staging) with it and compare it with
// the plain CPU path.
#ifndef SHARDTRAIN_TESTS_UNIT_WORKER_PARALLEL_OFF_HOST_ENGINE_H_
#define SHARDTRAIN_TESTS_UNIT_WORKER_PARALLEL_OFF_HOST_ENGINE_H_

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "worker/engine/engine.h"
#include "worker/engine/flat_math.h"

namespace shardtrain::parallel::testing {

// Device address of host memory p, and back (null stays null). kTag puts it
// outside any mapping of a 47-bit user address space.
inline constexpr uintptr_t kTag = uintptr_t{1} << 62;
template <typename T>
T* ToDevice(T* p) {
  return p == nullptr ? nullptr : reinterpret_cast<T*>(reinterpret_cast<uintptr_t>(p) + kTag);
}
template <typename T>
T* ToHost(T* p) {
  return p == nullptr ? nullptr : reinterpret_cast<T*>(reinterpret_cast<uintptr_t>(p) - kTag);
}

// A host buffer under a GPU's label and at its device address; owns the
// buffer it wraps or refers to one. Like a GPU's memory given back, a
// Released range must be Acquired before it is used again: until then it
// holds NaN (fp32 buffers), so a read of it or an accumulation into it shows
// in every result; Acquire zeroes it.
class DeviceLabelled final : public engine::Buffer {
 public:
  explicit DeviceLabelled(engine::Buffer& inner)
      : Buffer(ToDevice(static_cast<char*>(inner.data())), inner.count(), inner.dtype(),
               DeviceKind::kCuda),
        inner_(inner) {}
  explicit DeviceLabelled(std::unique_ptr<engine::Buffer> owned) : DeviceLabelled(*owned) {
    owned_ = std::move(owned);
  }
  void Release(size_t begin, size_t n) override {
    inner_.Release(begin, n);
    if (inner_.dtype() != DataType::kFloat32) return;
    std::fill_n(inner_.as<float>() + begin, n, std::numeric_limits<float>::quiet_NaN());
    released_.resize(count(), false);
    std::fill_n(released_.begin() + begin, n, true);
  }
  // Aborts when [p, p + n elements) (device addresses) overlaps a range
  // given back and not acquired since: on a GPU that memory is unmapped.
  void CheckHeld(const void* p, size_t n, const char* who) const {
    if (released_.empty()) return;
    const char* lo = static_cast<const char*>(data());
    const char* at = static_cast<const char*>(p);
    const size_t esz = DataTypeSize(dtype());
    if (at < lo || at >= lo + count() * esz) return;
    const size_t first = size_t(at - lo) / esz;
    for (size_t i = first; i < first + n && i < count(); ++i) {
      if (released_[i]) {
        std::fprintf(stderr, "OffHostEngine: %s touches element %zu, released and not acquired\n",
                     who, i);
        std::abort();
      }
    }
  }
  // Only what was given back comes back zeroed; what is held keeps its data.
  void Acquire(size_t begin, size_t n) override {
    if (released_.empty()) return;
    for (size_t i = begin; i < begin + n; ++i) {
      if (!released_[i]) continue;
      inner_.as<float>()[i] = 0.0f;
      released_[i] = false;
    }
  }
  int64_t ResidentBytes(size_t begin, size_t n) const override {
    return inner_.ResidentBytes(begin, n);
  }
  void SetReleaseBoundary(size_t offset) override { inner_.SetReleaseBoundary(offset); }

 private:
  engine::Buffer& inner_;
  std::unique_ptr<engine::Buffer> owned_;
  std::vector<bool> released_;  // per element: given back, not acquired since
};

// The inner engine's math over device addresses; every access to a watched
// buffer must be to memory it holds (DeviceLabelled::CheckHeld).
class DeviceMath final : public engine::FlatMath {
 public:
  explicit DeviceMath(engine::FlatMath& inner) : inner_(inner) {}
  void Watch(const DeviceLabelled* b) { watched_.push_back(b); }
  void Check(const void* p, size_t n, const char* who) const {
    for (const DeviceLabelled* b : watched_) b->CheckHeld(p, n, who);
  }
  double SquaredNorm(const float* x, size_t n) override {
    Check(x, n, "SquaredNorm");
    return inner_.SquaredNorm(ToHost(x), n);
  }
  void Scale(float* x, size_t n, float s) override {
    Check(x, n, "Scale");
    inner_.Scale(ToHost(x), n, s);
  }
  void Accumulate(float* dst, const float* src, size_t n, bool add) override {
    Check(dst, n, "Accumulate");
    Check(src, n, "Accumulate");
    inner_.Accumulate(ToHost(dst), ToHost(src), n, add);
  }
  void AdamWUpdate(float* p, float* g, float* m, float* v, size_t n,
                   const engine::AdamWCoefficients& c, bool zero_grads) override {
    for (const float* x : {p, g, m, v}) Check(x, n, "AdamWUpdate");
    inner_.AdamWUpdate(ToHost(p), ToHost(g), ToHost(m), ToHost(v), n, c, zero_grads);
  }
  void CopyToHost(float* host, const float* x, size_t n) override {
    Check(x, n, "CopyToHost");
    inner_.CopyToHost(host, ToHost(x), n);
  }
  void CopyFromHost(float* x, const float* host, size_t n) override {
    Check(x, n, "CopyFromHost");
    inner_.CopyFromHost(ToHost(x), host, n);
  }
  void ToBFloat16(uint16_t* dst, const float* src, size_t n) override {
    Check(src, n, "ToBFloat16");
    inner_.ToBFloat16(ToHost(dst), ToHost(src), n);
  }
  void FromBFloat16(float* dst, const uint16_t* src, size_t n) override {
    Check(dst, n, "FromBFloat16");
    inner_.FromBFloat16(ToHost(dst), ToHost(src), n);
  }
  std::unique_ptr<engine::Buffer> Allocate(size_t n) override {
    return std::make_unique<DeviceLabelled>(inner_.Allocate(n));
  }
  DeviceKind kind() const override { return DeviceKind::kCuda; }

 private:
  engine::FlatMath& inner_;
  std::vector<const DeviceLabelled*> watched_;
};

class OffHostEngine final : public engine::Engine {
 public:
  explicit OffHostEngine(std::unique_ptr<engine::Engine> inner)
      : inner_(std::move(inner)),
        params_(inner_->param_buffer()),
        grads_(inner_->grad_buffer()),
        math_(inner_->math()) {
    math_.Watch(&params_);
    math_.Watch(&grads_);
  }

  // The wrapped engine, whose buffers are plainly the host's (for checks).
  engine::Engine& inner() { return *inner_; }

  const model::ParamLayout& layout() const override { return inner_->layout(); }
  int max_batch() const override { return inner_->max_batch(); }
  int max_seq_len() const override { return inner_->max_seq_len(); }
  engine::Device& device() override { return inner_->device(); }
  engine::Buffer& param_buffer() override { return params_; }
  engine::Buffer& grad_buffer() override { return grads_; }
  const model::ActivationTable& activations() const override { return inner_->activations(); }
  int64_t activation_bytes() const override { return inner_->activation_bytes(); }
  int64_t ResidentActivationBytes() const override { return inner_->ResidentActivationBytes(); }
  engine::ThreadPool* host_pool() override { return inner_->host_pool(); }
  engine::FlatMath& math() override { return math_; }
  void InitParamsInto(uint64_t seed, size_t begin, size_t end, float* out) override {
    math_.Check(out, end - begin, "InitParamsInto");
    inner_->InitParamsInto(seed, begin, end, ToHost(out));
  }
  using Engine::Forward;
  float Forward(const int* tokens, const int* targets, int b, int t) override {
    return inner_->Forward(tokens, targets, b, t);
  }
  void Backward(float loss_scale) override { inner_->Backward(loss_scale); }
  void ExpectBackward(float loss_scale) override { inner_->ExpectBackward(loss_scale); }
  void ZeroGrad() override { inner_->ZeroGrad(); }
  void ReadLogits(int row, float* out) const override { inner_->ReadLogits(row, out); }
  void set_grads_ready_hook(std::function<void(size_t)> hook) override {
    inner_->set_grads_ready_hook(std::move(hook));
  }
  void set_param_hook(std::function<void(int, bool)> hook) override {
    inner_->set_param_hook(std::move(hook));
  }
  // Pipeline stages: what the engine reads and gives is device memory too.
  int slots() const override { return inner_->slots(); }
  float StageForward(int slot, const int* tokens, const int* targets, const float* input, int b,
                     int t) override {
    return inner_->StageForward(slot, tokens, targets, ToHost(input), b, t);
  }
  const float* StageOutput(int slot) const override { return ToDevice(inner_->StageOutput(slot)); }
  void StageBackward(int slot, float loss_scale, const float* doutput) override {
    inner_->StageBackward(slot, loss_scale, ToHost(doutput));
  }
  const float* InputGrad() const override { return ToDevice(inner_->InputGrad()); }
  size_t StageIoElements() const override { return inner_->StageIoElements(); }

 private:
  std::unique_ptr<engine::Engine> inner_;
  DeviceLabelled params_, grads_;
  DeviceMath math_;
};

}  // namespace shardtrain::parallel::testing

#endif  // SHARDTRAIN_TESTS_UNIT_WORKER_PARALLEL_OFF_HOST_ENGINE_H_
