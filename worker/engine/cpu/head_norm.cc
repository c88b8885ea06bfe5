// RMSNorm over each attention head (layers.h: HeadRmsNormForward/Backward).
#include <cmath>

#include "worker/engine/cpu/layers.h"

namespace shardtrain::engine::cpu {

template <typename F>
void HeadRmsNormForward(F* x, int ld, F* pre, F* rstd, int ld_stat, const F* weight, F eps, int N,
                        int heads, int hs, ThreadPool* pool) {
  ParallelFor(
      pool, N,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          for (int h = 0; h < heads; ++h) {
            F* v = x + r * ld + int64_t{h} * hs;
            F* p = pre + (r * ld_stat + h) * hs;
            F ss = 0;
            for (int c = 0; c < hs; ++c) {
              p[c] = v[c];
              ss += v[c] * v[c];
            }
            const F s = F(1) / std::sqrt(ss / hs + eps);
            for (int c = 0; c < hs; ++c) v[c] = p[c] * s * weight[c];
            rstd[r * ld_stat + h] = s;
          }
        }
      },
      8);
}

template <typename F>
void HeadRmsNormBackward(F* dx, int ld, F* dweight, const F* pre, const F* rstd, int ld_stat,
                         const F* weight, int N, int heads, int hs, ThreadPool* pool) {
  // dweight first (it reads dy before dx overwrites it): serial over rows in
  // order, so the sum is the same on every run. Null: frozen weights.
  for (int64_t r = 0; dweight != nullptr && r < N; ++r) {
    for (int h = 0; h < heads; ++h) {
      const F* d = dx + r * ld + int64_t{h} * hs;
      const F* p = pre + (r * ld_stat + h) * hs;
      const F s = rstd[r * ld_stat + h];
      for (int c = 0; c < hs; ++c) dweight[c] += d[c] * p[c] * s;
    }
  }
  // dx = s·w·dy − s³/hs · x · Σ_j dy_j w_j x_j, per (row, head).
  ParallelFor(
      pool, N,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          for (int h = 0; h < heads; ++h) {
            F* d = dx + r * ld + int64_t{h} * hs;
            const F* p = pre + (r * ld_stat + h) * hs;
            const F s = rstd[r * ld_stat + h];
            F dot = 0;
            for (int c = 0; c < hs; ++c) dot += d[c] * weight[c] * p[c];
            const F k = s * s * s * dot / hs;
            for (int c = 0; c < hs; ++c) d[c] = s * weight[c] * d[c] - k * p[c];
          }
        }
      },
      8);
}

#define SHARDTRAIN_INSTANTIATE_HEAD_NORM(F)                                                      \
  template void HeadRmsNormForward<F>(F*, int, F*, F*, int, const F*, F, int, int, int,          \
                                      ThreadPool*);                                              \
  template void HeadRmsNormBackward<F>(F*, int, F*, const F*, const F*, int, const F*, int, int, \
                                       int, ThreadPool*);

SHARDTRAIN_INSTANTIATE_HEAD_NORM(float)
SHARDTRAIN_INSTANTIATE_HEAD_NORM(double)

}  // namespace shardtrain::engine::cpu
