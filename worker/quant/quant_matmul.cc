#include "worker/quant/quant_matmul.h"

#include <algorithm>
#include <cstring>

#include "worker/engine/cpu/layers.h"

namespace shardtrain::quant {

void QuantMatmulForward(float* out, int ld_out, const float* inp, const QuantWeightView& w,
                        const float* bias, int N, float* scratch, int tile_rows,
                        engine::ThreadPool* pool) {
  const int IC = static_cast<int>(w.cols), OC = static_cast<int>(w.rows);
  for (int r0 = 0; r0 < OC; r0 += tile_rows) {
    const int rows = std::min(tile_rows, OC - r0);
    DequantizeRows(w, r0, r0 + rows, scratch);
    float beta = 0.0f;
    if (bias != nullptr) {
      for (int n = 0; n < N; ++n)
        std::memcpy(out + int64_t{n} * ld_out + r0, bias + r0, sizeof(float) * rows);
      beta = 1.0f;
    }
    // out[:, r0:r0+rows] = inp · tile^T
    engine::cpu::Gemm<float>(false, true, N, rows, IC, 1.0f, inp, IC, scratch, IC, beta, out + r0,
                             ld_out, pool);
  }
}

void QuantMatmulBackwardInput(float* dinp, const float* dout, int ld_dout, const QuantWeightView& w,
                              int N, float* scratch, int tile_rows, engine::ThreadPool* pool) {
  const int IC = static_cast<int>(w.cols), OC = static_cast<int>(w.rows);
  for (int r0 = 0; r0 < OC; r0 += tile_rows) {
    const int rows = std::min(tile_rows, OC - r0);
    DequantizeRows(w, r0, r0 + rows, scratch);
    // dinp += dout[:, r0:r0+rows] · tile
    engine::cpu::Gemm<float>(false, false, N, IC, rows, 1.0f, dout + r0, ld_dout, scratch, IC, 1.0f,
                             dinp, IC, pool);
  }
}

}  // namespace shardtrain::quant
