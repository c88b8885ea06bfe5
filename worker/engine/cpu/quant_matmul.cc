#include "worker/engine/cpu/quant_matmul.h"

#include <algorithm>
#include <cstring>

#include "worker/engine/cpu/layers.h"

namespace shardtrain::engine::cpu {
namespace {

// Rows [r0, r0 + rows) of w into tile, the rows split over the pool.
void DequantizeTile(const quant::QuantWeightView& w, int r0, int rows, float* tile,
                    ThreadPool* pool) {
  ParallelFor(
      pool, rows,
      [&](int64_t a, int64_t b) { quant::DequantizeRows(w, r0 + a, r0 + b, tile + a * w.cols); },
      4);
}

}  // namespace

void QuantMatmulForward(float* out, int ld_out, const float* inp, const quant::QuantWeightView& w,
                        const float* bias, int N, float* scratch, int tile_rows, ThreadPool* pool) {
  const int IC = static_cast<int>(w.cols), OC = static_cast<int>(w.rows);
  for (int r0 = 0; r0 < OC; r0 += tile_rows) {
    const int rows = std::min(tile_rows, OC - r0);
    DequantizeTile(w, r0, rows, scratch, pool);
    float beta = 0.0f;
    if (bias != nullptr) {
      for (int n = 0; n < N; ++n)
        std::memcpy(out + int64_t{n} * ld_out + r0, bias + r0, sizeof(float) * rows);
      beta = 1.0f;
    }
    // out[:, r0:r0+rows] = inp · tile^T
    Gemm<float>(false, true, N, rows, IC, 1.0f, inp, IC, scratch, IC, beta, out + r0, ld_out, pool);
  }
}

void QuantMatmulBackwardInput(float* dinp, const float* dout, int ld_dout,
                              const quant::QuantWeightView& w, int N, float* scratch, int tile_rows,
                              ThreadPool* pool) {
  const int IC = static_cast<int>(w.cols), OC = static_cast<int>(w.rows);
  for (int r0 = 0; r0 < OC; r0 += tile_rows) {
    const int rows = std::min(tile_rows, OC - r0);
    DequantizeTile(w, r0, rows, scratch, pool);
    // dinp += dout[:, r0:r0+rows] · tile
    Gemm<float>(false, false, N, IC, rows, 1.0f, dout + r0, ld_dout, scratch, IC, 1.0f, dinp, IC,
                pool);
  }
}

}  // namespace shardtrain::engine::cpu
