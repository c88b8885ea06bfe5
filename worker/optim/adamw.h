// AdamW (decoupled weight decay) and gradient clipping; the learning-rate
// schedule is in lr_schedule.h.
//
// Weight-decay rule (from ParamLayout, TensorInfo::decay): decay applies only
// to 2-D tensors (matmul weights and the wte/wpe embeddings), never to
// biases or LayerNorm weights/biases — the same param groups as nanoGPT's
// `p.dim() >= 2`.
#ifndef SHARDTRAIN_WORKER_OPTIM_ADAMW_H_
#define SHARDTRAIN_WORKER_OPTIM_ADAMW_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/model/param_layout.h"
#include "worker/engine/flat_math.h"
#include "worker/engine/thread_pool.h"

namespace shardtrain::optim {

struct AdamWOptions {
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;  // applied only where TensorInfo::decay
  // m and v kept block-wise in 8 bits (adamw8bit.h: bitsandbytes'
  // AdamW8bit), where `math` keeps its arrays (a GPU's: updated there by
  // FlatMath::AdamW8bitUpdate, the same bits as the host's). The blocks of kQuant8BlockSize start
  // afresh at every shard unit of the layout and at every MoE block's
  // experts (ParamLayout::ExpertRanges), so a ZeRO shard of whole blocks of
  // a unit quantizes exactly as one rank holding the whole unit does.
  bool int8_state = false;
};

// AdamW over the sub-range [offset, offset + count) of a model's flat
// parameter buffer, owning m and v for exactly that range (ZeRO-1/2/3 create
// one per rank for their shard; unsharded training uses the whole buffer).
// Update per element (torch.optim.AdamW semantics, step t starting at 1):
//   p -= lr * wd * p                       (decayed tensors only)
//   m = b1 m + (1-b1) g ;  v = b2 v + (1-b2) g^2
//   p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)
// m and v live where `math` keeps its arrays (the host by default; a GPU
// engine's FlatMath keeps them in device memory), and every update runs
// there.
// Thread-compatible; the host Step() overloads use the given pool.
class AdamW {
 public:
  // InvalidArgument if the range is outside the layout. `math`: where m, v
  // and the update live (null: the host); it must outlive the optimizer.
  // With options.int8_state the range is stepped whole (UpdateRange
  // aborts); on a device's math its units must each hold under 2^32
  // elements (InvalidArgument otherwise).
  static absl::StatusOr<AdamW> Create(const model::ParamLayout& layout, size_t offset, size_t count,
                                      const AdamWOptions& options,
                                      engine::FlatMath* math = nullptr);
  AdamW(AdamW&&) noexcept;
  AdamW& operator=(AdamW&&) noexcept;
  ~AdamW();

  // One step with learning rate lr. params and grads hold exactly this
  // range (count elements; element i is flat index offset + i).
  void Step(absl::Span<float> params, absl::Span<const float> grads, float lr,
            engine::ThreadPool* pool);

  // Step() that also sets grads to 0 in the same pass (saves the separate
  // ZeroGrad() sweep over the gradient buffer before the next step).
  void StepAndZeroGrads(absl::Span<float> params, absl::Span<float> grads, float lr,
                        engine::ThreadPool* pool);
  // The same on the arrays of the optimizer's math (count elements each, in
  // its memory): the step of a device-held model. The update reads grads ·
  // grad_scale (the clip factor: the same bits as scaling the gradients
  // first, without a pass over them; grads themselves stay as they are).
  void Step(float* params, float* grads, float lr, bool zero_grads, float grad_scale = 1.0f);
  // One host step in pieces, so that copies of other pieces can overlap it:
  // Advance() once, then UpdateRange over disjoint [begin, end) covering
  // the range (indices and spans as Step's). Equal to Step.
  void Advance() { ++step_; }
  void UpdateRange(absl::Span<float> params, absl::Span<const float> grads, float lr, size_t begin,
                   size_t end, engine::ThreadPool* pool);

  size_t offset() const { return offset_; }
  size_t count() const { return count_; }
  int64_t step() const { return step_; }
  // Optimizer state for checkpoints (same indexing as params), as host
  // spans: only when the fp32 state is on the host (aborts otherwise, as
  // FlatView::f32, and for 8-bit state).
  absl::Span<float> m() { return m_->view().f32(); }
  absl::Span<float> v() { return v_->view().f32(); }
  absl::Span<const float> m() const { return m_->view().f32(); }
  absl::Span<const float> v() const { return v_->view().f32(); }
  // Elements [begin, end) of m or v copied to the host, and written back
  // from it: wherever the state lives. 8-bit state is dequantized on the
  // way out and quantized on the way in (the codes come back bit for bit
  // from what they dequantized to).
  std::vector<float> CopyM(size_t begin, size_t end) const;
  std::vector<float> CopyV(size_t begin, size_t end) const;
  void SetState(absl::Span<const float> m, absl::Span<const float> v);
  void set_step(int64_t step) { step_ = step; }
  const AdamWOptions& options() const { return options_; }
  // Bytes m and v take: 8 per element in fp32; 2 per element and 8 per
  // block (its two absmaxes) in 8 bits.
  int64_t state_bytes() const;

 private:
  struct Int8State;     // adamw.cc
  struct Segment {      // a piece of the range lying inside one tensor
    size_t begin, end;  // relative to offset_
    bool decay;
  };
  AdamW(size_t offset, size_t count, const AdamWOptions& options, std::vector<Segment> segments,
        engine::FlatMath* math);
  void StepImpl(float* params, float* grads, float lr, engine::FlatMath& math, bool zero_grads,
                float grad_scale = 1.0f);
  // The update (step_ already advanced) of [begin, end).
  void Update(float* params, float* grads, float lr, engine::FlatMath& math, bool zero_grads,
              size_t begin, size_t end, float grad_scale = 1.0f);
  engine::FlatMath& math() const;

  size_t offset_, count_;
  AdamWOptions options_;
  std::vector<Segment> segments_;
  engine::FlatMath* math_;                 // null: the host
  std::unique_ptr<engine::Buffer> m_, v_;  // fp32 state
  std::unique_ptr<Int8State> int8_;        // 8-bit state
  int64_t step_ = 0;
};

// Sum of squares of grads, accumulated in double over fixed 64Ki-element
// chunks (result independent of the thread count). For sharded gradients,
// all-reduce this across ranks before the sqrt.
double GradSquaredNorm(absl::Span<const float> grads, engine::ThreadPool* pool);

// Scales grads in place by `scale`.
void ScaleGrads(absl::Span<float> grads, float scale, engine::ThreadPool* pool);

// The factor global-norm clipping scales every gradient by, given the global
// norm: max_norm / (norm + 1e-6) when max_norm > 0 and norm > max_norm, else
// 1 (torch.nn.utils.clip_grad_norm_). Sharded strategies compute the norm
// over ranks and apply this to their shard.
float ClipScale(float norm, float max_norm);

// Global-norm clipping of a whole gradient buffer: computes the L2 norm and
// scales grads by ClipScale(norm, max_norm). Returns the norm before clipping.
float ClipGradNorm(absl::Span<float> grads, float max_norm, engine::ThreadPool* pool);

}  // namespace shardtrain::optim

#endif  // SHARDTRAIN_WORKER_OPTIM_ADAMW_H_
