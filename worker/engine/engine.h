// Engine: the GPT's forward and backward on one device, as the rest of the
// worker sees it — the trainer, the data-parallel strategies (DDP, ZeRO),
// checkpoints and generation. Implementations: engine/cpu (fp32, OpenBLAS);
// a GPU engine slots in beside it.
//
// What every engine promises:
//   - parameters and gradients are one flat buffer each on device(), laid
//     out by layout() (common/model/param_layout.h), so strategies and
//     checkpoints work on ranges of them;
//   - activations are allocated once, from activations() (the table the
//     planner accounts with), for micro-batches of up to (max_batch(),
//     max_seq_len()); Forward/Backward allocate nothing;
//   - the hooks below are called on the caller's thread, in the documented
//     order, so ZeRO can gather parameters before a unit is used and reduce
//     gradients as soon as a unit's are final.
//
// Not thread-safe: one caller at a time.
#ifndef SHARDTRAIN_WORKER_ENGINE_ENGINE_H_
#define SHARDTRAIN_WORKER_ENGINE_ENGINE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "common/model/activations.h"
#include "common/model/config.h"
#include "common/model/param_layout.h"
#include "worker/engine/device.h"
#include "worker/engine/flat_math.h"
#include "worker/engine/thread_pool.h"

namespace shardtrain::engine {

// What an engine's MoE layers did since the last TakeMoeStats: per MoE
// layer of the slice (in order) every expert's (token, slot) pairs summed
// over the forwards (before drops), and over all of them the balancing
// losses' sum (with their coefficients), the pairs and those dropped.
struct MoeStats {
  int forwards = 0;                        // micro-batch forwards counted
  std::vector<std::vector<int64_t>> load;  // [moe layer][expert]
  double aux_loss = 0, z_loss = 0;
  int64_t pairs = 0, dropped = 0;
};

class Engine {
 public:
  virtual ~Engine() = default;

  virtual const model::ParamLayout& layout() const = 0;
  const model::ModelConfig& config() const { return layout().config(); }
  virtual int max_batch() const = 0;    // B
  virtual int max_seq_len() const = 0;  // T
  virtual Device& device() = 0;

  // The flat parameter and gradient buffers (layout() order).
  virtual Buffer& param_buffer() = 0;
  virtual Buffer& grad_buffer() = 0;
  FlatView params() { return param_buffer().view(); }
  FlatView grads() { return grad_buffer().view(); }

  // The table the activation buffers were allocated from, and those
  // buffers' bytes: allocated, and held now (measured where the device can).
  virtual const model::ActivationTable& activations() const = 0;
  virtual int64_t activation_bytes() const = 0;
  virtual int64_t ResidentActivationBytes() const = 0;

  // Host threads for host-side math over the flat buffers (the optimizer
  // step, gradient norms).
  virtual ThreadPool* host_pool() = 0;
  // The optimizer side's arithmetic over the flat fp32 buffers, where they
  // live (device()): norms, scaling, AdamW, copies for checkpoints.
  virtual FlatMath& math() = 0;

  // GPT-2 init, a pure function of (seed, layout): weights N(0, 0.02), the
  // residual projections N(0, 0.02 / sqrt(2L)), biases 0, LayerNorm weights
  // 1, padded wte rows 0. Element i of tensor k depends only on (seed, k, i),
  // so every rank and every shard computes the same values. Writes the fp32
  // values of flat elements [begin, end) to out[0, end - begin) (memory of
  // device()); InitParams writes the whole parameter buffer, which holds the
  // fp32 values (the master copy, also under mixed precision).
  virtual void InitParamsInto(uint64_t seed, size_t begin, size_t end, float* out) = 0;
  void InitParams(uint64_t seed) {
    InitParamsInto(seed, 0, layout().num_params(), param_buffer().as<float>());
  }

  // Forward over b sequences of t tokens. tokens, targets: (b, t) row-major
  // host arrays of ids in [0, vocab); 1 <= b <= max_batch(), 1 <= t <=
  // max_seq_len() (violations are programming errors: the engine aborts with
  // a message). Returns the mean cross-entropy loss, or 0 when targets is
  // null (inference: only the logits are meaningful).
  virtual float Forward(const int* tokens, const int* targets, int b, int t) = 0;
  float Forward(const int* tokens, const int* targets) {
    return Forward(tokens, targets, max_batch(), max_seq_len());
  }
  // Backward of the last Forward, which must have had targets and not been
  // backpropagated yet. ACCUMULATES dL/dparams · loss_scale into the
  // gradients (1/accumulation for gradient accumulation).
  virtual void Backward(float loss_scale = 1.0f) = 0;
  // Sets every gradient to 0.
  virtual void ZeroGrad() = 0;
  // The logits of position `row` (= b·t index) of the last Forward into
  // host memory out[0, vocab). Not after a forward ExpectBackward announced.
  virtual void ReadLogits(int row, float* out) const = 0;
  // The next Forward / StageForward with targets (of the last stage) will
  // be followed by its Backward / StageBackward with this loss_scale: an
  // engine may compute the loss's gradient in the forward's own pass over
  // the logits (a fused classifier; the logits then hold that gradient, so
  // ReadLogits fails), and a backward with another scale is then a
  // precondition failure. For that one forward only. Default: ignored.
  virtual void ExpectBackward(float loss_scale) { (void)loss_scale; }

  // Called by Backward each time the gradients of a whole unit became final,
  // with the unit's first element `offset`: every gradient in [offset,
  // num_params) is final. Units finish in reverse layout order (final,
  // block.L-1, ..., block.0, then embeddings at offset 0, since wte also
  // collects a tied LM head's gradient). Null: off.
  virtual void set_grads_ready_hook(std::function<void(size_t offset)> hook) = 0;
  // Called around every computation that reads a unit's parameters:
  // hook(unit, true) before, hook(unit, false) after (unit indexes
  // layout().units()). Order — Forward: embeddings (encoder), block.0 ..
  // block.L-1, final, embeddings (a tied LM head, which reads wte);
  // Backward: embeddings (a tied LM head), final, block.L-1 .. block.0 (the
  // encoder's backward reads no parameter); an untied head is read within
  // final's use. The same as parallel::UnitUseOrder (common/shard_range.h).
  // Null: off.
  virtual void set_param_hook(std::function<void(int unit, bool begin)> hook) = 0;
  // ---- LoRA (config().lora.on()): the model itself is frozen, held by the
  // engine apart from the adapters (frozen_layout(): the model without
  // adapters, this slice) in the compute type or with its linear layers
  // quantized (ModelEngineOptions::frozen), read by the layers and never
  // updated; param_buffer(), grad_buffer() and layout()'s flat buffer are
  // then the adapters alone. It starts as the zero model.
  virtual bool has_frozen() const { return false; }
  virtual const model::ParamLayout& frozen_layout() const { return layout(); }
  // Stores the frozen model: host (frozen_layout().num_params() fp32, host
  // memory), quantized where the format says.
  virtual void SetFrozen(const float* host) {}
  // host (frozen_layout().num_params() fp32) = the frozen model as held
  // (quantized tensors dequantized).
  virtual void GetFrozen(float* host) {}
  // Bytes the frozen model takes (model::FrozenModelBytes); 0 without LoRA.
  virtual int64_t frozen_bytes() const { return 0; }
  // The frozen model's init (InitParamsInto's, of the model without
  // adapters: what a plain engine's InitParams gives) of frozen elements
  // [begin, end) into host memory out[0, end - begin).
  virtual void InitFrozenInto(uint64_t seed, size_t begin, size_t end, float* out) {}

  // The MoE layers' figures since the last call (MoeStats), which starts
  // the next count. Empty without MoE layers.
  virtual MoeStats TakeMoeStats() { return {}; }

  // ---- Pipeline stages. An engine runs the part of the model in
  // layout().slice() (common/model/slice.h): under pipeline parallelism one
  // stage, which takes its input from the previous stage and hands its output
  // to the next. It keeps the saved activations of up to slots() micro-batches
  // at once (one per micro-batch between its forward and its backward); the
  // scratch tensors are shared. The whole-model Forward/Backward above are
  // slot 0 of a whole slice; the defaults here serve engines that only run
  // whole models.
  virtual int slots() const { return 1; }
  // Forward of one micro-batch into `slot` (in [0, slots())): the first stage
  // reads `tokens`, the others `input` ((b, t, C) activations of the previous
  // stage, copied in); the last stage computes the mean loss over `targets`
  // (null: inference) and returns it, the others return 0.
  virtual float StageForward(int slot, const int* tokens, const int* targets, const float* input,
                             int b, int t);
  // The (b, t, C) output of `slot`'s forward, for the next stage (null on
  // the last stage); valid until the slot's next StageForward.
  virtual const float* StageOutput(int slot) const;
  // Backward of `slot`'s forward: the last stage starts from its loss
  // (doutput null) times loss_scale, the others from `doutput`, the gradient
  // of StageOutput(slot) — already scaled, so they ignore loss_scale.
  // Accumulates into the gradients like Backward.
  virtual void StageBackward(int slot, float loss_scale, const float* doutput);
  // The (b, t, C) gradient of the last StageBackward's input, for the
  // previous stage (null on the first stage); valid until the next
  // StageBackward.
  virtual const float* InputGrad() const { return nullptr; }
  // ---- Interleaved pipelines (layout().slice().chunks = v > 1): the slice
  // is v model chunks, each a pipeline stage of its own (chunk c of stage s
  // is virtual stage c·pp + s). The slots are numbered chunk by chunk, chunk
  // c holding chunk_slots(c) of them, the k-th SlotOf(c, k); a slot's
  // StageForward and StageBackward run its chunk's layers — the encoder only
  // in chunk 0 of the first stage, the head and the loss only in the last
  // chunk of the last stage, every other chunk reading `input` and handing
  // StageOutput on (InputGrad back) like a stage in the middle.
  virtual int chunks() const { return 1; }
  virtual int chunk_slots(int chunk) const { return slots(); }
  int SlotOf(int chunk, int k) const {
    for (int c = 0; c < chunk; ++c) k += chunk_slots(c);
    return k;
  }
  // Elements of StageOutput and InputGrad (for the largest micro-batch): the
  // pipeline's exchange size. Default max_batch() · max_seq_len() · dim.
  virtual size_t StageIoElements() const {
    return size_t(max_batch()) * size_t(max_seq_len()) * size_t(config().dim);
  }
};

inline float Engine::StageForward(int slot, const int* tokens, const int* targets,
                                  const float* input, int b, int t) {
  (void)slot;
  (void)input;
  return Forward(tokens, targets, b, t);
}
inline const float* Engine::StageOutput(int) const { return nullptr; }
inline void Engine::StageBackward(int, float loss_scale, const float*) { Backward(loss_scale); }

}  // namespace shardtrain::engine

#endif  // SHARDTRAIN_WORKER_ENGINE_ENGINE_H_
