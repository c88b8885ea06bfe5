#include "worker/engine/cpu/layers.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace shardtrain::engine::cpu {
namespace {

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

// -------------------------------------------------------------- attention

template <typename F>
void AttentionForward(F* out, F* att, const F* qkv, int B, int T, int C, int NH, int KVH,
                      ThreadPool* pool) {
  // Per (b, h): S = scale Q K^T (full T x T by gemm; the upper triangle is
  // then masked), row-wise causal softmax in place, out_h = att V.
  const int hs = C / NH, group = NH / KVH, KV = KVH * hs;
  const int W = C + 2 * KV;  // a row of qkv
  const F scale = F(1) / std::sqrt(F(hs));
  ParallelFor(pool, int64_t{B} * NH, [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      const int b = static_cast<int>(u / NH), h = static_cast<int>(u % NH);
      const F* row = qkv + int64_t{b} * T * W;
      const F* q = row + h * hs;
      const F* k = row + C + (h / group) * hs;
      const F* v = k + KV;
      F* a = att + u * T * T;
      GemmSerial(false, true, T, T, hs, scale, q, W, k, W, F(0), a, T);
      for (int t = 0; t < T; ++t) {
        F* r = a + int64_t{t} * T;
        F maxv = r[0];
        for (int t2 = 1; t2 <= t; ++t2) maxv = std::max(maxv, r[t2]);
        F sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int t2 = 0; t2 <= t; ++t2) {
          r[t2] = Exp(r[t2] - maxv);
          sum += r[t2];
        }
        const F inv = F(1) / sum;
#pragma omp simd
        for (int t2 = 0; t2 <= t; ++t2) r[t2] *= inv;
        for (int t2 = t + 1; t2 < T; ++t2) r[t2] = 0;
      }
      GemmSerial(false, false, T, hs, T, F(1), a, T, v, W, F(0), out + int64_t{b} * T * C + h * hs,
                 C);
    }
  });
}

template <typename F>
void AttentionBackward(F* dqkv, const F* dout, const F* qkv, const F* att, F* scratch, int B, int T,
                       int C, int NH, int KVH, ThreadPool* pool) {
  const int hs = C / NH, group = NH / KVH, KV = KVH * hs;
  const int W = C + 2 * KV;
  const F scale = F(1) / std::sqrt(F(hs));
  // Per (b, key/value head): its group's query heads in order, so that the
  // heads sharing dK and dV add into them from one thread.
  ParallelFor(pool, int64_t{B} * KVH, [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      const int b = static_cast<int>(u / KVH), j = static_cast<int>(u % KVH);
      const int64_t off = int64_t{b} * T * W;
      const F* k = qkv + off + C + j * hs;
      const F* v = k + KV;
      F* dk = dqkv + off + C + j * hs;
      F* dv = dk + KV;
      for (int h = j * group; h < (j + 1) * group; ++h) {
        const int64_t bh = int64_t{b} * NH + h;
        const F* q = qkv + off + h * hs;
        F* dq = dqkv + off + h * hs;
        const F* a = att + bh * T * T;
        const F* d = dout + int64_t{b} * T * C + h * hs;
        F* g = scratch + bh * T * T;  // datt, then dpre (T, T)
        // out = att v: datt = dout v^T, dv += att^T dout
        GemmSerial(false, true, T, T, hs, F(1), d, C, v, W, F(0), g, T);
        GemmSerial(true, false, T, hs, T, F(1), a, T, d, C, F(1), dv, W);
        // softmax backward (causal rows), folding in the 1/sqrt(hs) scale
        for (int t = 0; t < T; ++t) {
          const F* ar = a + int64_t{t} * T;
          F* gr = g + int64_t{t} * T;
          F s = 0;
#pragma omp simd reduction(+ : s)
          for (int t2 = 0; t2 <= t; ++t2) s += ar[t2] * gr[t2];
#pragma omp simd
          for (int t2 = 0; t2 <= t; ++t2) gr[t2] = ar[t2] * (gr[t2] - s) * scale;
          for (int t2 = t + 1; t2 < T; ++t2) gr[t2] = 0;
        }
        // pre = q k^T: dq += dpre k, dk += dpre^T q
        GemmSerial(false, false, T, hs, T, F(1), g, T, k, W, F(1), dq, W);
        GemmSerial(true, false, T, hs, T, F(1), g, T, q, W, F(1), dk, W);
      }
    }
  });
}

// ------------------------------------------- attention by blocks (context parallelism)

template <typename F>
void CopyKv(F* kv, const F* qkv, int B, int T, int C, int KV, ThreadPool* pool) {
  const int W = C + 2 * KV;
  ParallelFor(
      pool, int64_t{B} * T,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          std::copy(qkv + r * W + C, qkv + (r + 1) * W, kv + r * 2 * KV);
        }
      },
      64);
}

template <typename F>
void AddKvGrad(F* dqkv, const F* dkv, int B, int T, int C, int KV, ThreadPool* pool) {
  const int W = C + 2 * KV;
  ParallelFor(
      pool, int64_t{B} * T,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          F* d = dqkv + r * W + C;
          const F* g = dkv + r * 2 * KV;
          for (int c = 0; c < 2 * KV; ++c) d[c] += g[c];
        }
      },
      64);
}

template <typename F>
void AttentionBlockForward(F* out, F* lse, F* blk_out, F* blk_lse, const F* qkv, const F* kv,
                           const int* pos_q, const int* pos_k, int B, int Tq, int Tk, int C, int NH,
                           int KVH, bool first, F* scores, ThreadPool* pool) {
  const int hs = C / NH, group = NH / KVH, KV = KVH * hs;
  const int W = C + 2 * KV;
  const F scale = F(1) / std::sqrt(F(hs));
  const F kNegInf = -std::numeric_limits<F>::infinity();
  // The block's own result goes to blk_out / blk_lse (to out / lse itself
  // for the first block), then merges.
  F* const bo = first ? out : blk_out;
  F* const bl = first ? lse : blk_lse;
  ParallelFor(pool, int64_t{B} * NH, [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      const int b = static_cast<int>(u / NH), h = static_cast<int>(u % NH);
      const F* q = qkv + int64_t{b} * Tq * W + h * hs;
      const F* k = kv + int64_t{b} * Tk * 2 * KV + (h / group) * hs;
      const F* v = k + KV;
      F* s = scores + u * Tq * Tk;
      F* l = lse + u * Tq;
      F* row_lse = bl + u * Tq;
      GemmSerial(false, true, Tq, Tk, hs, scale, q, W, k, 2 * KV, F(0), s, Tk);
      for (int i = 0; i < Tq; ++i) {
        F* r = s + int64_t{i} * Tk;
        F maxv = kNegInf;
        for (int j = 0; j < Tk; ++j) {
          if (pos_k[j] <= pos_q[i]) maxv = std::max(maxv, r[j]);
        }
        if (maxv == kNegInf) {  // no key of this block is visible to the row
          std::fill(r, r + Tk, F(0));
          row_lse[i] = kNegInf;
          continue;
        }
        F sum = 0;
        for (int j = 0; j < Tk; ++j) {
          r[j] = pos_k[j] <= pos_q[i] ? Exp(r[j] - maxv) : F(0);
          sum += r[j];
        }
        const F inv = F(1) / sum;
        for (int j = 0; j < Tk; ++j) r[j] *= inv;
        row_lse[i] = maxv + std::log(sum);
      }
      F* const o_blk = bo + int64_t{b} * Tq * C + h * hs;  // row stride C
      GemmSerial(false, false, Tq, hs, Tk, F(1), s, Tk, v, 2 * KV, F(0), o_blk, C);
      if (first) continue;
      for (int i = 0; i < Tq; ++i) {
        F* o = out + (int64_t{b} * Tq + i) * C + h * hs;
        const F* n = o_blk + int64_t{i} * C;
        if (row_lse[i] == kNegInf) continue;  // nothing to merge
        // out, lse := the softmax over both key sets: weights by logsumexp.
        const F m = std::max(l[i], row_lse[i]);
        const F merged = m + std::log(Exp(l[i] - m) + Exp(row_lse[i] - m));
        const F w_old = Exp(l[i] - merged), w_new = Exp(row_lse[i] - merged);
        for (int c = 0; c < hs; ++c) o[c] = w_old * o[c] + w_new * n[c];
        l[i] = merged;
      }
    }
  });
}

template <typename F>
void AttentionRowDot(F* D, const F* dout, const F* out, int B, int T, int C, int NH,
                     ThreadPool* pool) {
  const int hs = C / NH;
  ParallelFor(
      pool, int64_t{B} * NH,
      [&](int64_t u0, int64_t u1) {
        for (int64_t u = u0; u < u1; ++u) {
          const int b = static_cast<int>(u / NH), h = static_cast<int>(u % NH);
          for (int i = 0; i < T; ++i) {
            const int64_t at = (int64_t{b} * T + i) * C + h * hs;
            F d = 0;
            for (int c = 0; c < hs; ++c) d += dout[at + c] * out[at + c];
            D[u * T + i] = d;
          }
        }
      },
      1);
}

template <typename F>
void AttentionBlockBackward(F* dqkv, F* dkv, const F* dout, const F* qkv, const F* kv, const F* lse,
                            const F* D, const int* pos_q, const int* pos_k, int B, int Tq, int Tk,
                            int C, int NH, int KVH, F* scores, F* dscores, ThreadPool* pool) {
  const int hs = C / NH, group = NH / KVH, KV = KVH * hs;
  const int W = C + 2 * KV;
  const F scale = F(1) / std::sqrt(F(hs));
  // Per (b, key/value head), its group's query heads in order: the heads
  // sharing dK and dV add into them from one thread.
  ParallelFor(pool, int64_t{B} * KVH, [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      const int b = static_cast<int>(u / KVH), j = static_cast<int>(u % KVH);
      const F* k = kv + int64_t{b} * Tk * 2 * KV + j * hs;
      const F* v = k + KV;
      F* dk = dkv + int64_t{b} * Tk * 2 * KV + j * hs;
      F* dv = dk + KV;
      for (int h = j * group; h < (j + 1) * group; ++h) {
        const int64_t bh = int64_t{b} * NH + h;
        const F* q = qkv + int64_t{b} * Tq * W + h * hs;
        F* dq = dqkv + int64_t{b} * Tq * W + h * hs;
        const F* d = dout + int64_t{b} * Tq * C + h * hs;
        F* p = scores + bh * Tq * Tk;
        F* g = dscores + bh * Tq * Tk;
        // P = exp(scale Q K^T - lse), 0 where the key is not visible.
        GemmSerial(false, true, Tq, Tk, hs, scale, q, W, k, 2 * KV, F(0), p, Tk);
        for (int i = 0; i < Tq; ++i) {
          F* r = p + int64_t{i} * Tk;
          const F l = lse[bh * Tq + i];
          for (int t2 = 0; t2 < Tk; ++t2) {
            r[t2] = pos_k[t2] <= pos_q[i] ? Exp(r[t2] - l) : F(0);
          }
        }
        // out = P V: dV += P^T dout, dP = dout V^T
        GemmSerial(true, false, Tk, hs, Tq, F(1), p, Tk, d, C, F(1), dv, 2 * KV);
        GemmSerial(false, true, Tq, Tk, hs, F(1), d, C, v, 2 * KV, F(0), g, Tk);
        // softmax backward with the whole row's D = rowsum(dout ∘ out):
        // dS = P ∘ (dP − D), folding in the scale.
        for (int i = 0; i < Tq; ++i) {
          const F* pr = p + int64_t{i} * Tk;
          F* gr = g + int64_t{i} * Tk;
          const F di = D[bh * Tq + i];
          for (int t2 = 0; t2 < Tk; ++t2) gr[t2] = pr[t2] * (gr[t2] - di) * scale;
        }
        // S = Q K^T: dQ += dS K, dK += dS^T Q
        GemmSerial(false, false, Tq, hs, Tk, F(1), g, Tk, k, 2 * KV, F(1), dq, W);
        GemmSerial(true, false, Tk, hs, Tq, F(1), g, Tk, q, W, F(1), dk, 2 * KV);
      }
    }
  });
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
  template void CopyKv<F>(F*, const F*, int, int, int, int, ThreadPool*);                          \
  template void AddKvGrad<F>(F*, const F*, int, int, int, int, ThreadPool*);                       \
  template void AttentionBlockForward<F>(F*, F*, F*, F*, const F*, const F*, const int*,           \
                                         const int*, int, int, int, int, int, int, bool, F*,       \
                                         ThreadPool*);                                             \
  template void AttentionRowDot<F>(F*, const F*, const F*, int, int, int, int, ThreadPool*);       \
  template void AttentionBlockBackward<F>(F*, F*, const F*, const F*, const F*, const F*,          \
                                          const F*, const int*, const int*, int, int, int, int,    \
                                          int, int, F*, F*, ThreadPool*);                          \
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
  template void AttentionForward<F>(F*, F*, const F*, int, int, int, int, int, ThreadPool*);       \
  template void AttentionBackward<F>(F*, const F*, const F*, const F*, F*, int, int, int, int,     \
                                     int, ThreadPool*);                                            \
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
