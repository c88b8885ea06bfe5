// FrozenWeights: the frozen model of a LoRA engine in host memory, held as
// its format says (model::FrozenFormat, finetune.base_dtype): every tensor in
// fp32, or the blocks' linear weights quantized (int8 per row, or NF4) and
// the rest in fp32 (model::QuantizedFrozenTensor says which). The CPU
// engine's layers read it: an fp32 tensor by pointer, a quantized one by its
// view, dequantized a tile at a time by the matmuls
// (engine/cpu/quant_matmul.h) into tile().
//
// Tensors are the frozen layout's (ParamLayout(BaseConfig(config), slice)):
// index i of layout(). It starts as the zero model; Set stores weights.
// Not thread-safe.
#ifndef SHARDTRAIN_WORKER_QUANT_FROZEN_WEIGHTS_H_
#define SHARDTRAIN_WORKER_QUANT_FROZEN_WEIGHTS_H_

#include <cstdint>
#include <vector>

#include "common/model/param_layout.h"
#include "common/model/weight_quant.h"
#include "worker/engine/thread_pool.h"
#include "worker/quant/weight_quant.h"

namespace shardtrain::quant {

class FrozenWeights {
 public:
  // format.compute_bytes must be 4 (this class holds fp32).
  FrozenWeights(const model::ParamLayout& layout, const model::FrozenFormat& format,
                engine::ThreadPool* pool);

  const model::ParamLayout& layout() const { return layout_; }
  const model::FrozenFormat& format() const { return format_; }
  // Stores the model's weights, values (layout().num_params() fp32, in the
  // layout's order): the fp32 tensors copied, the others quantized.
  void Set(const float* values, engine::ThreadPool* pool);
  // values (layout().num_params() fp32) = the model as held: the quantized
  // tensors dequantized (so Set(Get()) changes nothing).
  void Get(float* values, engine::ThreadPool* pool) const;
  // Tensor i's values in fp32; null for a quantized tensor.
  const float* fp32(int i) const {
    return fp32_offset_[i] < 0 ? nullptr : fp32_.data() + fp32_offset_[i];
  }
  // Tensor i's quantized weight; null for an fp32 tensor.
  const QuantWeightView* quantized(int i) const {
    return quant_index_[i] < 0 ? nullptr : &views_[quant_index_[i]];
  }
  // The matmuls' dequantization scratch: model::kDequantTileRows rows of the
  // widest quantized input (empty without quantized tensors).
  float* tile() { return tile_.data(); }
  // Bytes held: model::FrozenModelBytes(layout(), format()).
  int64_t bytes() const;

 private:
  const model::ParamLayout& layout_;
  const model::FrozenFormat format_;
  std::vector<float> fp32_;
  std::vector<int64_t> fp32_offset_;  // per tensor; -1: quantized
  std::vector<int> quant_index_;      // per tensor: into quant_ / views_; -1: fp32
  std::vector<QuantizedWeight> quant_;
  std::vector<QuantWeightView> views_;
  std::vector<float> tile_;
};

}  // namespace shardtrain::quant

#endif  // SHARDTRAIN_WORKER_QUANT_FROZEN_WEIGHTS_H_
