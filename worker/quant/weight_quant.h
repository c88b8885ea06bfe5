// A frozen weight in 8 or 4 bits (common/model/weight_quant.h describes the
// formats): quantized once when the base model is loaded, dequantized a tile
// of rows at a time inside the matmul (quant_matmul.h), never kept whole in
// full precision.
//
// QuantizedWeight owns host memory; QuantWeightView is the same weight as
// pointers, which a device fills with its own copies (a GPU kernel reads a
// view of device memory). Every function here is pure and deterministic;
// pools only split the work.
#ifndef SHARDTRAIN_WORKER_QUANT_WEIGHT_QUANT_H_
#define SHARDTRAIN_WORKER_QUANT_WEIGHT_QUANT_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "common/model/weight_quant.h"
#include "worker/engine/thread_pool.h"

namespace shardtrain::quant {

enum class WeightFormat { kInt8, kNf4 };

// A quantized (rows, cols) weight, row-major (torch.nn.Linear's (out, in)).
struct QuantWeightView {
  WeightFormat format = WeightFormat::kNf4;
  int64_t rows = 0, cols = 0;
  // int8: rows·cols int8 codes (as bytes); nf4: ceil(rows·cols / 2) bytes,
  // element 2i in the high nibble of byte i, element 2i+1 in the low one.
  const uint8_t* codes = nullptr;
  // int8: one per row; nf4 without double quantization: one per block.
  const float* absmax = nullptr;
  // nf4 with double quantization (absmax null): per block the code of its
  // absmax minus absmax_offset in SignedDynamicMap, and per
  // kNf4AbsmaxBlockSize blocks the fp32 scale of those codes.
  const uint8_t* absmax_codes = nullptr;
  const float* absmax_scale = nullptr;
  float absmax_offset = 0;
  bool double_quant() const { return absmax_codes != nullptr; }
  int64_t numel() const { return rows * cols; }
};

struct QuantizedWeight {
  WeightFormat format = WeightFormat::kNf4;
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> codes;
  std::vector<float> absmax;
  std::vector<uint8_t> absmax_codes;  // double quantization only
  std::vector<float> absmax_scale;    // double quantization only
  float absmax_offset = 0;

  QuantWeightView view() const;
  // What it holds (its arrays' bytes): model::Int8RowsBytes or
  // model::Nf4Bytes of its shape, which the tests check.
  int64_t bytes() const;
};

// Per-row int8: absmax_r = max |w[r, :]|, code = round(w · 127 / absmax_r)
// (ties away from zero), a zero row all zero codes.
QuantizedWeight QuantizeInt8Rows(const float* w, int64_t rows, int64_t cols,
                                 engine::ThreadPool* pool);
// NF4 in blocks of kNf4BlockSize of the flattened weight: absmax_b = max |w|
// over the block, each element the level nearest to w / absmax_b (ties to the
// lower level; a zero block codes 0's level). double_quant: the blocks'
// absmax stored in 8 bits as the header says.
QuantizedWeight QuantizeNf4(const float* w, int64_t rows, int64_t cols, bool double_quant,
                            engine::ThreadPool* pool);

// A frozen tensor in `format`'s quantization (int8 rows or NF4 with its
// double_quant); format.quant must not be kNone.
QuantizedWeight QuantizeFrozen(const model::FrozenFormat& format, const float* w, int64_t rows,
                               int64_t cols, engine::ThreadPool* pool);

// The index of the NF4 level nearest to y (a value divided by its absmax;
// ties to the lower level).
uint8_t Nf4Code(float y);

// Block b's absmax (nf4): absmax[b], or with double quantization
// SignedDynamicMap()[absmax_codes[b]] · absmax_scale[b / 256] + offset.
float Nf4BlockAbsmax(const QuantWeightView& w, int64_t b);

// Rows [r0, r1) of the weight, dequantized into out ((r1 - r0) · cols,
// fp32): int8 code · absmax_r / 127; nf4 kNf4Levels[code] · absmax of the
// element's block.
void DequantizeRows(const QuantWeightView& w, int64_t r0, int64_t r1, float* out);

}  // namespace shardtrain::quant

#endif  // SHARDTRAIN_WORKER_QUANT_WEIGHT_QUANT_H_
