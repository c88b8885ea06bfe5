// Matmuls on a frozen quantized weight (weight_quant.h), on the CPU: the
// weight is dequantized `tile_rows` rows at a time into a scratch of
// tile_rows · IC floats and multiplied from there, so a layer's weight is
// never held whole in fp32 (QLoRA's "dequantize per tile inside the
// matmul"). The frozen weight gets no gradient: the backward is the input's
// only. Results equal dequantizing the whole weight and calling
// MatmulForward/Backward (layers.h) to float rounding (the sums are split
// by tile, nothing else differs).
#ifndef SHARDTRAIN_WORKER_ENGINE_CPU_QUANT_MATMUL_H_
#define SHARDTRAIN_WORKER_ENGINE_CPU_QUANT_MATMUL_H_

#include "worker/engine/thread_pool.h"
#include "worker/quant/weight_quant.h"

namespace shardtrain::engine::cpu {

// out (N, OC) with row stride ld_out = inp (N, IC) · W^T, W = w (OC, IC)
// dequantized; bias (OC, fp32) added when not null. scratch: tile_rows · IC
// floats (tile_rows >= 1).
void QuantMatmulForward(float* out, int ld_out, const float* inp, const quant::QuantWeightView& w,
                        const float* bias, int N, float* scratch, int tile_rows, ThreadPool* pool);

// dinp (N, IC) += dout (N, OC, row stride ld_dout) · W. scratch as above.
void QuantMatmulBackwardInput(float* dinp, const float* dout, int ld_dout,
                              const quant::QuantWeightView& w, int N, float* scratch, int tile_rows,
                              ThreadPool* pool);

}  // namespace shardtrain::engine::cpu

#endif  // SHARDTRAIN_WORKER_ENGINE_CPU_QUANT_MATMUL_H_
