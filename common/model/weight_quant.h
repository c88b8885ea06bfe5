// How a frozen base weight is stored when fine-tuning with adapters
// (finetune.base_dtype): the formats' constants and their sizes in bytes, the
// one place the planner and the workers' quantizers (worker/quant) read them.
//
//   int8  per output channel (LLM.int8's vector-wise absmax): each row of an
//         (out, in) weight keeps one fp32 absmax and each element the int8
//         round(w · 127 / absmax);
//   nf4   QLoRA's 4-bit NormalFloat (Dettmers et al. 2023): the weight
//         flattened row-major in blocks of kNf4BlockSize elements, each with
//         an fp32 absmax, each element the index of the nearest of the 16
//         kNf4Levels to w / absmax, two elements per byte (the even element in
//         the high nibble, as bitsandbytes packs them). Double quantization
//         stores the blocks' absmax in 8 bits too: their mean subtracted, then
//         block-wise in blocks of kNf4AbsmaxBlockSize with bitsandbytes'
//         signed dynamic map (worker/optim/quant8.h) and an fp32 absmax each
//         — bitsandbytes' compress_statistics.
//
// Which tensors of a frozen model are quantized, and the bytes the whole
// frozen model takes in each format (FrozenModelBytes), are here too: the
// planner's figure and the engines' allocation are the same function.
//
// Pure: constants and arithmetic.
#ifndef SHARDTRAIN_COMMON_MODEL_WEIGHT_QUANT_H_
#define SHARDTRAIN_COMMON_MODEL_WEIGHT_QUANT_H_

#include <array>
#include <cstdint>

#include "common/model/param_layout.h"

namespace shardtrain::model {

inline constexpr int64_t kNf4BlockSize = 64;
inline constexpr int64_t kNf4AbsmaxBlockSize = 256;

// The 16 NF4 levels, ascending: the QLoRA paper's Appendix E table (and
// bitsandbytes' NF4 code book), the quantiles of N(0, 1) normalised to
// [-1, 1] with an exact 0 (7 negative levels, 8 positive ones).
inline constexpr std::array<float, 16> kNf4Levels = {-1.0f,
                                                     -0.6961928009986877f,
                                                     -0.5250730514526367f,
                                                     -0.39491748809814453f,
                                                     -0.28444138169288635f,
                                                     -0.18477343022823334f,
                                                     -0.09105003625154495f,
                                                     0.0f,
                                                     0.07958029955625534f,
                                                     0.16093020141124725f,
                                                     0.24611230194568634f,
                                                     0.33791524171829224f,
                                                     0.44070982933044434f,
                                                     0.5626170039176941f,
                                                     0.7229568362236023f,
                                                     1.0f};

// Blocks of kNf4BlockSize in n elements.
inline int64_t Nf4Blocks(int64_t n) { return (n + kNf4BlockSize - 1) / kNf4BlockSize; }

// Bytes of an NF4 weight of n elements: ceil(n / 2) of codes, and per block
// an fp32 absmax (4 bytes), or with double quantization a 1-byte code per
// block plus an fp32 absmax per kNf4AbsmaxBlockSize blocks and the fp32 mean.
// 0.5 + 4/64 = 0.5625 bytes per element, or 0.5 + 1/64 + 4/16384 ≈ 0.5159.
inline int64_t Nf4Bytes(int64_t n, bool double_quant) {
  const int64_t blocks = Nf4Blocks(n);
  if (!double_quant) return (n + 1) / 2 + 4 * blocks;
  return (n + 1) / 2 + blocks + 4 * ((blocks + kNf4AbsmaxBlockSize - 1) / kNf4AbsmaxBlockSize) + 4;
}

// Bytes of an int8 weight of (rows, cols): a byte per element and an fp32
// absmax per row.
inline int64_t Int8RowsBytes(int64_t rows, int64_t cols) { return rows * cols + 4 * rows; }

// Rows of a quantized weight a matmul dequantizes at once (its fp32 tile:
// kDequantTileRows rows of the weight's input width).
inline constexpr int kDequantTileRows = 64;

// How a frozen model is held (finetune.base_dtype): every tensor in the
// engine's compute type, or its linear layers' weights in int8 or NF4.
enum class FrozenQuant { kNone, kInt8, kNf4 };
struct FrozenFormat {
  FrozenQuant quant = FrozenQuant::kNone;
  bool double_quant = true;  // NF4's absmax in 8 bits too
  int compute_bytes = 4;     // an unquantized element (fp32 on CPU workers)
};

// Whether tensor i of a frozen model's layout (ParamLayout(BaseConfig(c),
// slice): the model without adapters) is quantized under `quant`: the
// blocks' linear weights — attn.qkv, attn.proj, mlp.fc and mlp.proj, the
// layers bitsandbytes replaces in a QLoRA model. Embeddings, norms, biases
// and the LM head keep the compute type.
bool QuantizedFrozenTensor(const ParamLayout& base, int i, FrozenQuant quant);

// Bytes of tensor i held in `format`: Int8RowsBytes of its (rows, cols),
// Nf4Bytes of its elements, or compute_bytes each.
int64_t FrozenTensorBytes(const ParamLayout& base, int i, const FrozenFormat& format);

// Bytes of the frozen model held in `format`: its tensors' and, when one is
// quantized, the matmuls' dequantization tile (kDequantTileRows rows of the
// widest quantized input in the compute type).
int64_t FrozenModelBytes(const ParamLayout& base, const FrozenFormat& format);

}  // namespace shardtrain::model

#endif  // SHARDTRAIN_COMMON_MODEL_WEIGHT_QUANT_H_
