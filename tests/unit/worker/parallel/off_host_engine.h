// OffHostEngine: a CPU engine whose parameter and gradient buffers say they
// live on a GPU (DeviceKind::kCuda). The memory is the host's, so the
// engine computes as usual, but a data-parallel strategy that views them as
// host memory (FlatView::f32) aborts as it would on a real GPU rank — where
// such a view is a crash (seen on an H100: Ddp::Step's tp sum). Strategies
// must reach the buffers through engine().math() (copies, norms, AdamW),
// which here is the host's and works on the real pointers.
//
// Tests run the GPU path's logic (host staging) with it and compare it with
// the plain CPU path.
#ifndef SHARDTRAIN_TESTS_UNIT_WORKER_PARALLEL_OFF_HOST_ENGINE_H_
#define SHARDTRAIN_TESTS_UNIT_WORKER_PARALLEL_OFF_HOST_ENGINE_H_

#include <functional>
#include <memory>
#include <utility>

#include "worker/engine/engine.h"

namespace shardtrain::parallel::testing {

class OffHostEngine final : public engine::Engine {
 public:
  explicit OffHostEngine(std::unique_ptr<engine::Engine> inner)
      : inner_(std::move(inner)), params_(inner_->param_buffer()), grads_(inner_->grad_buffer()) {}

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
  engine::FlatMath& math() override { return inner_->math(); }
  void InitParamsInto(uint64_t seed, size_t begin, size_t end, float* out) override {
    inner_->InitParamsInto(seed, begin, end, out);
  }
  using Engine::Forward;
  float Forward(const int* tokens, const int* targets, int b, int t) override {
    return inner_->Forward(tokens, targets, b, t);
  }
  void Backward(float loss_scale) override { inner_->Backward(loss_scale); }
  void ZeroGrad() override { inner_->ZeroGrad(); }
  void ReadLogits(int row, float* out) const override { inner_->ReadLogits(row, out); }
  void set_grads_ready_hook(std::function<void(size_t)> hook) override {
    inner_->set_grads_ready_hook(std::move(hook));
  }
  void set_param_hook(std::function<void(int, bool)> hook) override {
    inner_->set_param_hook(std::move(hook));
  }

 private:
  // The inner buffer under a GPU's label.
  class Labelled final : public engine::Buffer {
   public:
    explicit Labelled(engine::Buffer& inner)
        : Buffer(inner.data(), inner.count(), inner.dtype(), DeviceKind::kCuda), inner_(inner) {}
    void Release(size_t begin, size_t n) override { inner_.Release(begin, n); }
    int64_t ResidentBytes(size_t begin, size_t n) const override {
      return inner_.ResidentBytes(begin, n);
    }
    void SetReleaseBoundary(size_t offset) override { inner_.SetReleaseBoundary(offset); }

   private:
    engine::Buffer& inner_;
  };

  std::unique_ptr<engine::Engine> inner_;
  Labelled params_, grads_;
};

}  // namespace shardtrain::parallel::testing

#endif  // SHARDTRAIN_TESTS_UNIT_WORKER_PARALLEL_OFF_HOST_ENGINE_H_
