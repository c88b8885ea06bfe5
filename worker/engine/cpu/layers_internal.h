// The CPU layers' shared helpers (layers.cc, attention_layers.cc): an exp
// that vectorises in float (exact in double), tanh through it, and one
// BLAS GEMM on the calling thread. Internal to engine/cpu.
#ifndef SHARDTRAIN_WORKER_ENGINE_CPU_LAYERS_INTERNAL_H_
#define SHARDTRAIN_WORKER_ENGINE_CPU_LAYERS_INTERNAL_H_

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace shardtrain::engine::cpu::internal {

// ---- elementwise math that vectorises (float) / is exact (double) ----

// Cephes-style expf: range reduction x = n ln2 + r, degree-6 polynomial,
// scale by 2^n through the exponent bits. Max rel error ~2 ulp over the
// clamped range; branch-free so loops over it vectorise.
inline float Exp(float x) {
  x = std::min(std::max(x, -87.3f), 88.3f);
  float fx = std::floor(x * 1.44269504088896341f + 0.5f);
  float r = x - fx * 0.693359375f;
  r = r + fx * 2.12194440e-4f;
  const float r2 = r * r;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r2 + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(fx) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return y * scale;
}
inline double Exp(double x) { return std::exp(x); }

// tanh(u) = 1 - 2 / (exp(2u) + 1); saturates correctly at both ends.
template <typename F>
inline F Tanh(F u) {
  return F(1) - F(2) / (Exp(F(2) * u) + F(1));
}

inline void GemmSerial(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
                       const float* B, int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
              K, alpha, A, lda, B, ldb, beta, C, ldc);
}
inline void GemmSerial(bool ta, bool tb, int M, int N, int K, double alpha, const double* A,
                       int lda, const double* B, int ldb, double beta, double* C, int ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
              K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace shardtrain::engine::cpu::internal

#endif  // SHARDTRAIN_WORKER_ENGINE_CPU_LAYERS_INTERNAL_H_
