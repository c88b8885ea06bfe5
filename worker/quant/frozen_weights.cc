#include "worker/quant/frozen_weights.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace shardtrain::quant {
FrozenWeights::FrozenWeights(const model::ParamLayout& layout, const model::FrozenFormat& format,
                             engine::ThreadPool* pool)
    : layout_(layout), format_(format) {
  if (format.compute_bytes != 4) {
    std::fprintf(stderr, "FrozenWeights holds fp32 (compute_bytes %d)\n", format.compute_bytes);
    std::abort();
  }
  const std::vector<model::TensorInfo>& tensors = layout.tensors();
  fp32_offset_.assign(tensors.size(), -1);
  quant_index_.assign(tensors.size(), -1);
  int64_t fp32 = 0, widest = 0;
  size_t largest = 0;
  for (int i = 0; i < static_cast<int>(tensors.size()); ++i) {
    if (model::QuantizedFrozenTensor(layout, i, format.quant)) {
      quant_index_[i] = static_cast<int>(quant_.size());
      quant_.emplace_back();
      widest = std::max(widest, tensors[i].shape[1]);
      largest = std::max(largest, tensors[i].numel);
    } else {
      fp32_offset_[i] = fp32;
      fp32 += static_cast<int64_t>(tensors[i].numel);
    }
  }
  fp32_.assign(fp32, 0.0f);
  tile_.assign(size_t(model::kDequantTileRows) * widest, 0.0f);
  // The zero model: every quantized tensor the quantization of zeros.
  const std::vector<float> zeros(largest, 0.0f);
  views_.resize(quant_.size());
  for (int i = 0; i < static_cast<int>(tensors.size()); ++i) {
    if (quant_index_[i] < 0) continue;
    const model::TensorInfo& t = tensors[i];
    quant_[quant_index_[i]] = QuantizeFrozen(format, zeros.data(), t.shape[0], t.shape[1], pool);
    views_[quant_index_[i]] = quant_[quant_index_[i]].view();
  }
}

void FrozenWeights::Set(const float* values, engine::ThreadPool* pool) {
  const std::vector<model::TensorInfo>& tensors = layout_.tensors();
  for (int i = 0; i < static_cast<int>(tensors.size()); ++i) {
    const model::TensorInfo& t = tensors[i];
    if (quant_index_[i] < 0) {
      std::memcpy(fp32_.data() + fp32_offset_[i], values + t.offset, sizeof(float) * t.numel);
    } else {
      quant_[quant_index_[i]] =
          QuantizeFrozen(format_, values + t.offset, t.shape[0], t.shape[1], pool);
      views_[quant_index_[i]] = quant_[quant_index_[i]].view();
    }
  }
}

void FrozenWeights::Get(float* values, engine::ThreadPool* pool) const {
  const std::vector<model::TensorInfo>& tensors = layout_.tensors();
  for (int i = 0; i < static_cast<int>(tensors.size()); ++i) {
    const model::TensorInfo& t = tensors[i];
    if (quant_index_[i] < 0) {
      std::memcpy(values + t.offset, fp32_.data() + fp32_offset_[i], sizeof(float) * t.numel);
      continue;
    }
    const QuantWeightView& w = views_[quant_index_[i]];
    float* out = values + t.offset;
    engine::ParallelFor(
        pool, w.rows, [&](int64_t r0, int64_t r1) { DequantizeRows(w, r0, r1, out + r0 * w.cols); },
        16);
  }
}

int64_t FrozenWeights::bytes() const {
  int64_t b = static_cast<int64_t>(sizeof(float) * (fp32_.size() + tile_.size()));
  for (const QuantizedWeight& q : quant_) b += q.bytes();
  return b;
}

}  // namespace shardtrain::quant
