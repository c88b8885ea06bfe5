#include "worker/engine/cpu/layers.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "worker/engine/cpu/layers_internal.h"

namespace shardtrain::engine::cpu {
namespace {

using internal::Exp;
using internal::GemmSerial;
using internal::Tanh;

constexpr double kGeluScale = 0.7978845608028654;  // sqrt(2/pi)

}  // namespace

template <typename F>
void Gemm(bool ta, bool tb, int M, int N, int K, F alpha, const F* A, int lda, const F* B, int ldb,
          F beta, F* C, int ldc, ThreadPool* pool) {
  if (M <= 0 || N <= 0) return;
  const int threads = pool == nullptr ? 1 : pool->size();
  // Small problems: threading costs more than it saves.
  if (threads == 1 || static_cast<double>(M) * N * K < 2e5) {
    GemmSerial(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  constexpr int kAlign = 16;
  if (N >= M) {  // split columns of C (rows of op(B)^T)
    pool->Run([&](int tid) {
      int n0 = static_cast<int>(int64_t{N} * tid / threads) / kAlign * kAlign;
      int n1 = tid + 1 == threads
                   ? N
                   : static_cast<int>(int64_t{N} * (tid + 1) / threads) / kAlign * kAlign;
      if (n1 <= n0) return;
      const F* b = tb ? B + static_cast<int64_t>(n0) * ldb : B + n0;
      GemmSerial(ta, tb, M, n1 - n0, K, alpha, A, lda, b, ldb, beta, C + n0, ldc);
    });
  } else {  // split rows of C
    pool->Run([&](int tid) {
      int m0 = static_cast<int>(int64_t{M} * tid / threads) / kAlign * kAlign;
      int m1 = tid + 1 == threads
                   ? M
                   : static_cast<int>(int64_t{M} * (tid + 1) / threads) / kAlign * kAlign;
      if (m1 <= m0) return;
      const F* a = ta ? A + m0 : A + static_cast<int64_t>(m0) * lda;
      GemmSerial(ta, tb, m1 - m0, N, K, alpha, a, lda, B, ldb, beta,
                 C + static_cast<int64_t>(m0) * ldc, ldc);
    });
  }
}

// ---------------------------------------------------------------- encoder

template <typename F>
void EncoderForward(F* out, const int* inp, const F* wte, const F* wpe, int B, int T, int C,
                    ThreadPool* pool, const int* pos) {
  ParallelFor(
      pool, int64_t{B} * T,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const int t = pos == nullptr ? static_cast<int>(r % T) : pos[r % T];
          const F* e = wte + static_cast<int64_t>(inp[r]) * C;
          F* o = out + r * C;
          if (wpe == nullptr) {
            std::copy(e, e + C, o);
            continue;
          }
          const F* p = wpe + static_cast<int64_t>(t) * C;
          for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
        }
      },
      16);
}

template <typename F>
void EncoderBackward(F* dwte, F* dwpe, const F* dout, const int* inp, int B, int T, int C,
                     const int* pos) {
  for (int64_t r = 0; r < int64_t{B} * T; ++r) {
    const int t = pos == nullptr ? static_cast<int>(r % T) : pos[r % T];
    F* de = dwte + static_cast<int64_t>(inp[r]) * C;
    const F* d = dout + r * C;
    for (int c = 0; c < C; ++c) de[c] += d[c];
    if (dwpe == nullptr) continue;
    F* dp = dwpe + static_cast<int64_t>(t) * C;
    for (int c = 0; c < C; ++c) dp[c] += d[c];
  }
}

// -------------------------------------------------------------- layernorm

template <typename F>
void LayerNormForward(F* out, F* mean, F* rstd, const F* inp, const F* weight, const F* bias, int N,
                      int C, ThreadPool* pool) {
  const F eps = F(1e-5);
  ParallelFor(
      pool, N,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const F* x = inp + r * C;
          F m = 0;
#pragma omp simd reduction(+ : m)
          for (int c = 0; c < C; ++c) m += x[c];
          m /= C;
          F v = 0;
#pragma omp simd reduction(+ : v)
          for (int c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
          v /= C;
          const F s = F(1) / std::sqrt(v + eps);
          F* o = out + r * C;
#pragma omp simd
          for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * s * weight[c] + bias[c];
          mean[r] = m;
          rstd[r] = s;
        }
      },
      8);
}

template <typename F>
void LayerNormBackward(F* dinp, F* dweight, F* dbias, const F* dout, const F* inp, const F* weight,
                       const F* mean, const F* rstd, int N, int C, ThreadPool* pool) {
  // dweight, dbias: reductions over rows, split over channels (no races,
  // result independent of the thread count). Null: a frozen norm.
  if (dweight != nullptr)
    ParallelFor(
        pool, C,
        [&](int64_t c0, int64_t c1) {
          for (int r = 0; r < N; ++r) {
            const F* x = inp + int64_t{r} * C;
            const F* d = dout + int64_t{r} * C;
            const F m = mean[r], s = rstd[r];
#pragma omp simd
            for (int64_t c = c0; c < c1; ++c) {
              dweight[c] += (x[c] - m) * s * d[c];
              dbias[c] += d[c];
            }
          }
        },
        64);
  // dinp: rows are independent.
  ParallelFor(
      pool, N,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const F* x = inp + r * C;
          const F* d = dout + r * C;
          F* di = dinp + r * C;
          const F m = mean[r], s = rstd[r];
          F dnorm_mean = 0, dnorm_norm_mean = 0;
#pragma omp simd reduction(+ : dnorm_mean, dnorm_norm_mean)
          for (int c = 0; c < C; ++c) {
            const F dn = weight[c] * d[c];
            dnorm_mean += dn;
            dnorm_norm_mean += dn * (x[c] - m) * s;
          }
          dnorm_mean /= C;
          dnorm_norm_mean /= C;
#pragma omp simd
          for (int c = 0; c < C; ++c) {
            const F norm = (x[c] - m) * s;
            const F dn = weight[c] * d[c];
            di[c] += (dn - dnorm_mean - norm * dnorm_norm_mean) * s;
          }
        }
      },
      8);
}

// ---------------------------------------------------------------- rmsnorm

template <typename F>
void RmsNormForward(F* out, F* rstd, const F* inp, const F* weight, F eps, int N, int C,
                    ThreadPool* pool) {
  ParallelFor(
      pool, N,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const F* x = inp + r * C;
          F ss = 0;
#pragma omp simd reduction(+ : ss)
          for (int c = 0; c < C; ++c) ss += x[c] * x[c];
          const F s = F(1) / std::sqrt(ss / C + eps);
          F* o = out + r * C;
#pragma omp simd
          for (int c = 0; c < C; ++c) o[c] = x[c] * s * weight[c];
          rstd[r] = s;
        }
      },
      8);
}

template <typename F>
void RmsNormBackward(F* dinp, F* dweight, const F* dout, const F* inp, const F* weight,
                     const F* rstd, int N, int C, ThreadPool* pool) {
  // dweight: a reduction over rows, split over channels (as LayerNorm's).
  // Null: a frozen norm.
  if (dweight != nullptr)
    ParallelFor(
        pool, C,
        [&](int64_t c0, int64_t c1) {
          for (int r = 0; r < N; ++r) {
            const F* x = inp + int64_t{r} * C;
            const F* d = dout + int64_t{r} * C;
            const F s = rstd[r];
#pragma omp simd
            for (int64_t c = c0; c < c1; ++c) dweight[c] += x[c] * s * d[c];
          }
        },
        64);
  // dinp = s·(w⊙d) - x·s³·mean(x ⊙ w ⊙ d): rows are independent.
  ParallelFor(
      pool, N,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const F* x = inp + r * C;
          const F* d = dout + r * C;
          F* di = dinp + r * C;
          const F s = rstd[r];
          F dot = 0;
#pragma omp simd reduction(+ : dot)
          for (int c = 0; c < C; ++c) dot += weight[c] * d[c] * x[c];
          const F k = dot / C * s * s * s;
#pragma omp simd
          for (int c = 0; c < C; ++c) di[c] += weight[c] * d[c] * s - x[c] * k;
        }
      },
      8);
}

// ----------------------------------------------------------------- rotary

template <typename F>
void RotaryForward(F* x, const float* table, int B, int T, int heads, int hs, int ld, bool inverse,
                   ThreadPool* pool, const int* pos) {
  const int half = hs / 2;
  const F sign = inverse ? F(-1) : F(1);
  ParallelFor(
      pool, int64_t{B} * T,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const int64_t t = pos == nullptr ? r % T : pos[r % T];
          const float* angle = table + t * half * 2;  // position t of row r
          F* row = x + r * ld;
          for (int h = 0; h < heads; ++h) {
            F* v = row + h * hs;
            for (int i = 0; i < half; ++i) {
              const F c = angle[2 * i], sn = sign * F(angle[2 * i + 1]);
              const F x0 = v[2 * i], x1 = v[2 * i + 1];
              v[2 * i] = x0 * c - x1 * sn;
              v[2 * i + 1] = x0 * sn + x1 * c;
            }
          }
        }
      },
      16);
}

// ----------------------------------------------------------------- matmul

template <typename F>
void MatmulForward(F* out, const F* inp, const F* weight, const F* bias, int N, int C, int OC,
                   int ld_out, ThreadPool* pool) {
  F beta = 0;
  if (bias != nullptr) {
    ParallelFor(
        pool, N,
        [&](int64_t r0, int64_t r1) {
          for (int64_t r = r0; r < r1; ++r) std::memcpy(out + r * ld_out, bias, sizeof(F) * OC);
        },
        16);
    beta = 1;
  }
  Gemm<F>(false, true, N, OC, C, F(1), inp, C, weight, C, beta, out, ld_out, pool);
}

template <typename F>
void MatmulBackward(F* dinp, F* dweight, F* dbias, const F* dout, int ld_dout, const F* inp,
                    const F* weight, int N, int C, int OC, ThreadPool* pool) {
  // dinp (N,C) += dout (N,OC) · weight (OC,C)
  Gemm<F>(false, false, N, C, OC, F(1), dout, ld_dout, weight, C, F(1), dinp, C, pool);
  // dweight (OC,C) += dout^T (OC,N) · inp (N,C); null: a frozen weight.
  if (dweight != nullptr) {
    Gemm<F>(true, false, OC, C, N, F(1), dout, ld_dout, inp, C, F(1), dweight, C, pool);
  }
  if (dbias != nullptr) {
    ParallelFor(
        pool, OC,
        [&](int64_t o0, int64_t o1) {
          for (int r = 0; r < N; ++r) {
            const F* d = dout + int64_t{r} * ld_dout;
#pragma omp simd
            for (int64_t o = o0; o < o1; ++o) dbias[o] += d[o];
          }
        },
        64);
  }
}

// ------------------------------------------------------------------- gelu

template <typename F>
void GeluForward(F* out, const F* inp, int64_t N, ThreadPool* pool) {
  ParallelFor(
      pool, N,
      [&](int64_t i0, int64_t i1) {
#pragma omp simd
        for (int64_t i = i0; i < i1; ++i) {
          const F x = inp[i];
          const F u = F(kGeluScale) * (x + F(0.044715) * x * x * x);
          out[i] = F(0.5) * x * (F(1) + Tanh(u));
        }
      },
      4096);
}

template <typename F>
void GeluBackward(F* dinp, const F* inp, const F* dout, int64_t N, ThreadPool* pool) {
  ParallelFor(
      pool, N,
      [&](int64_t i0, int64_t i1) {
#pragma omp simd
        for (int64_t i = i0; i < i1; ++i) {
          const F x = inp[i];
          const F u = F(kGeluScale) * (x + F(0.044715) * x * x * x);
          const F th = Tanh(u);
          const F sech2 = F(1) - th * th;
          const F grad = F(0.5) * (F(1) + th) +
                         F(0.5) * x * sech2 * F(kGeluScale) * (F(1) + F(3 * 0.044715) * x * x);
          dinp[i] += grad * dout[i];
        }
      },
      4096);
}

// --------------------------------------------------------------- residual

template <typename F>
void ResidualForward(F* out, const F* inp1, const F* inp2, int64_t N, ThreadPool* pool) {
  ParallelFor(
      pool, N,
      [&](int64_t i0, int64_t i1) {
#pragma omp simd
        for (int64_t i = i0; i < i1; ++i) out[i] = inp1[i] + inp2[i];
      },
      8192);
}

template <typename F>
void ResidualBackward(F* dinp1, F* dinp2, const F* dout, int64_t N, ThreadPool* pool) {
  ParallelFor(
      pool, N,
      [&](int64_t i0, int64_t i1) {
#pragma omp simd
        for (int64_t i = i0; i < i1; ++i) {
          dinp1[i] += dout[i];
          dinp2[i] += dout[i];
        }
      },
      8192);
}

// ----------------------------------------------------------------- swiglu

template <typename F>
void SwiGluForward(F* out, const F* inp, int N, int H, ThreadPool* pool) {
  ParallelFor(
      pool, N,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const F* gate = inp + r * 2 * H;
          const F* up = gate + H;
          F* o = out + r * H;
#pragma omp simd
          for (int i = 0; i < H; ++i) o[i] = gate[i] / (F(1) + Exp(-gate[i])) * up[i];
        }
      },
      16);
}

template <typename F>
void SwiGluBackward(F* dinp, const F* inp, const F* dout, int N, int H, ThreadPool* pool) {
  ParallelFor(
      pool, N,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const F* gate = inp + r * 2 * H;
          const F* up = gate + H;
          const F* d = dout + r * H;
          F* dgate = dinp + r * 2 * H;
          F* dup = dgate + H;
#pragma omp simd
          for (int i = 0; i < H; ++i) {
            const F g = gate[i];
            const F sig = F(1) / (F(1) + Exp(-g));
            const F silu = g * sig;
            dgate[i] += d[i] * up[i] * sig * (F(1) + g * (F(1) - sig));
            dup[i] += d[i] * silu;
          }
        }
      },
      16);
}

// ---------------------------------------------------- softmax + cross-entropy

template <typename F>
void CrossEntropyForward(F* losses, F* lse, const F* logits, const int* targets, int N, int V,
                         int Vp, ThreadPool* pool) {
  ParallelFor(pool, N, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const F* l = logits + r * Vp;
      F maxv = l[0];
#pragma omp simd reduction(max : maxv)
      for (int j = 0; j < V; ++j) maxv = std::max(maxv, l[j]);
      F sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int j = 0; j < V; ++j) sum += Exp(l[j] - maxv);
      const F row_lse = maxv + std::log(sum);
      lse[r] = row_lse;
      if (targets != nullptr) losses[r] = row_lse - l[targets[r]];
    }
  });
}

template <typename F>
void CrossEntropyBackwardInPlace(F* logits, const F* lse, const int* targets, F dloss, int N, int V,
                                 int Vp, ThreadPool* pool) {
  ParallelFor(pool, N, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      F* l = logits + r * Vp;
      const F m = lse[r];
#pragma omp simd
      for (int j = 0; j < V; ++j) l[j] = Exp(l[j] - m) * dloss;
      l[targets[r]] -= dloss;
    }
  });
}

// ------------------------------------------------------ instantiations

#define SHARDTRAIN_INSTANTIATE_LAYERS(F)                                                           \
  template void Gemm<F>(bool, bool, int, int, int, F, const F*, int, const F*, int, F, F*, int,    \
                        ThreadPool*);                                                              \
  template void EncoderForward<F>(F*, const int*, const F*, const F*, int, int, int, ThreadPool*,  \
                                  const int*);                                                     \
  template void EncoderBackward<F>(F*, F*, const F*, const int*, int, int, int, const int*);       \
  template void LayerNormForward<F>(F*, F*, F*, const F*, const F*, const F*, int, int,            \
                                    ThreadPool*);                                                  \
  template void LayerNormBackward<F>(F*, F*, F*, const F*, const F*, const F*, const F*, const F*, \
                                     int, int, ThreadPool*);                                       \
  template void MatmulForward<F>(F*, const F*, const F*, const F*, int, int, int, int,             \
                                 ThreadPool*);                                                     \
  template void MatmulBackward<F>(F*, F*, F*, const F*, int, const F*, const F*, int, int, int,    \
                                  ThreadPool*);                                                    \
  template void RmsNormForward<F>(F*, F*, const F*, const F*, F, int, int, ThreadPool*);           \
  template void RmsNormBackward<F>(F*, F*, const F*, const F*, const F*, const F*, int, int,       \
                                   ThreadPool*);                                                   \
  template void RotaryForward<F>(F*, const float*, int, int, int, int, int, bool, ThreadPool*,     \
                                 const int*);                                                      \
  template void SwiGluForward<F>(F*, const F*, int, int, ThreadPool*);                             \
  template void SwiGluBackward<F>(F*, const F*, const F*, int, int, ThreadPool*);                  \
  template void GeluForward<F>(F*, const F*, int64_t, ThreadPool*);                                \
  template void GeluBackward<F>(F*, const F*, const F*, int64_t, ThreadPool*);                     \
  template void ResidualForward<F>(F*, const F*, const F*, int64_t, ThreadPool*);                  \
  template void ResidualBackward<F>(F*, F*, const F*, int64_t, ThreadPool*);                       \
  template void CrossEntropyForward<F>(F*, F*, const F*, const int*, int, int, int, ThreadPool*);  \
  template void CrossEntropyBackwardInPlace<F>(F*, const F*, const int*, F, int, int, int,         \
                                               ThreadPool*);

SHARDTRAIN_INSTANTIATE_LAYERS(float)
SHARDTRAIN_INSTANTIATE_LAYERS(double)

}  // namespace shardtrain::engine::cpu
