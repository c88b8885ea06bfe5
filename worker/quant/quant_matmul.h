// Matmuls on a frozen quantized weight (weight_quant.h), on the CPU: the
// weight is dequantized `tile_rows` rows at a time into a scratch of
// tile_rows · IC floats and multiplied from there, so a layer's weight is
// never held whole in fp32 (QLoRA's "dequantize per tile inside the
// matmul"). The frozen weight gets no gradient: the backward is the input's
// only. Results equal dequantizing the whole weight and calling
// engine::cpu::MatmulForward/Backward to float rounding (the sums are split
// by tile, nothing else differs).
#ifndef SHARDTRAIN_WORKER_QUANT_QUANT_MATMUL_H_
#define SHARDTRAIN_WORKER_QUANT_QUANT_MATMUL_H_

#include "worker/engine/thread_pool.h"
#include "worker/quant/weight_quant.h"

namespace shardtrain::quant {

// Rows of a tile when the caller has no preference: 64 (a 4096-wide layer's
// tile is 1 MiB of fp32).
inline constexpr int kDefaultTileRows = 64;

// out (N, OC) with row stride ld_out = inp (N, IC) · W^T, W = w (OC, IC)
// dequantized; bias (OC, fp32) added when not null. scratch: tile_rows · IC
// floats (tile_rows >= 1).
void QuantMatmulForward(float* out, int ld_out, const float* inp, const QuantWeightView& w,
                        const float* bias, int N, float* scratch, int tile_rows,
                        engine::ThreadPool* pool);

// dinp (N, IC) += dout (N, OC, row stride ld_dout) · W. scratch as above.
void QuantMatmulBackwardInput(float* dinp, const float* dout, int ld_dout, const QuantWeightView& w,
                              int N, float* scratch, int tile_rows, engine::ThreadPool* pool);

}  // namespace shardtrain::quant

#endif  // SHARDTRAIN_WORKER_QUANT_QUANT_MATMUL_H_
