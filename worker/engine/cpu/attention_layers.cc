// The CPU's causal self-attention (layers.h): whole, and by blocks of keys
// for context parallelism's ring, forward and backward.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "worker/engine/cpu/layers.h"
#include "worker/engine/cpu/layers_internal.h"

namespace shardtrain::engine::cpu {

using internal::Exp;
using internal::GemmSerial;

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

#define SHARDTRAIN_INSTANTIATE_ATTENTION(F)                                                     \
  template void CopyKv<F>(F*, const F*, int, int, int, int, ThreadPool*);                       \
  template void AddKvGrad<F>(F*, const F*, int, int, int, int, ThreadPool*);                    \
  template void AttentionBlockForward<F>(F*, F*, F*, F*, const F*, const F*, const int*,        \
                                         const int*, int, int, int, int, int, int, bool, F*,    \
                                         ThreadPool*);                                          \
  template void AttentionRowDot<F>(F*, const F*, const F*, int, int, int, int, ThreadPool*);    \
  template void AttentionBlockBackward<F>(F*, F*, const F*, const F*, const F*, const F*,       \
                                          const F*, const int*, const int*, int, int, int, int, \
                                          int, int, F*, F*, ThreadPool*);                       \
  template void AttentionForward<F>(F*, F*, const F*, int, int, int, int, int, ThreadPool*);    \
  template void AttentionBackward<F>(F*, const F*, const F*, const F*, F*, int, int, int, int,  \
                                     int, ThreadPool*);

SHARDTRAIN_INSTANTIATE_ATTENTION(float)
SHARDTRAIN_INSTANTIATE_ATTENTION(double)
#undef SHARDTRAIN_INSTANTIATE_ATTENTION

}  // namespace shardtrain::engine::cpu
