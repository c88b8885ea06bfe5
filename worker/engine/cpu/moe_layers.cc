#include "worker/engine/cpu/moe_layers.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "worker/engine/cpu/layers.h"

namespace shardtrain::engine::cpu {
namespace {

// The row's probabilities over the experts that the auxiliary loss averages:
// the scores for softmax, the scores over their row sum for sigmoid. Returns
// the divisor (1 for softmax).
template <typename F>
F RowProbDivisor(const F* s, int E, RouterScoring scoring) {
  if (scoring == RouterScoring::kSoftmax) return F(1);
  F sum = 0;
  for (int e = 0; e < E; ++e) sum += s[e];
  return sum;
}

template <typename F>
F LogSumExp(const F* l, int E) {
  F maxv = l[0];
  for (int e = 1; e < E; ++e) maxv = std::max(maxv, l[e]);
  F sum = 0;
  for (int e = 0; e < E; ++e) sum += std::exp(l[e] - maxv);
  return maxv + std::log(sum);
}

}  // namespace

// ----------------------------------------------------------------- router

template <typename F>
void RouterForward(F* logits, F* scores, int* experts, F* gates, const F* x, const F* wr,
                   const float* bias, int N, int C, int E, int K, RouterScoring scoring,
                   bool norm_topk_prob, ThreadPool* pool) {
  MatmulForward<F>(logits, x, wr, nullptr, N, C, E, E, pool);
  ParallelFor(
      pool, N,
      [&](int64_t r0, int64_t r1) {
        std::vector<F> key(E);
        std::vector<int> order(E);
        for (int64_t r = r0; r < r1; ++r) {
          const F* l = logits + r * E;
          F* s = scores + r * E;
          if (scoring == RouterScoring::kSoftmax) {
            const F lse = LogSumExp(l, E);
            for (int e = 0; e < E; ++e) s[e] = std::exp(l[e] - lse);
          } else {
            for (int e = 0; e < E; ++e) s[e] = F(1) / (F(1) + std::exp(-l[e]));
          }
          for (int e = 0; e < E; ++e) {
            key[e] = bias == nullptr ? s[e] : s[e] + F(bias[e]);
            order[e] = e;
          }
          // A strict total order: the larger key first, then the lower index.
          std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int a, int b) {
            return key[a] > key[b] || (key[a] == key[b] && a < b);
          });
          int* ex = experts + r * K;
          F* g = gates + r * K;
          F sum = 0;
          for (int k = 0; k < K; ++k) {
            ex[k] = order[k];
            g[k] = s[order[k]];
            sum += g[k];
          }
          if (norm_topk_prob)
            for (int k = 0; k < K; ++k) g[k] /= sum;
        }
      },
      16);
}

template <typename F>
void RouterBackward(F* dx, F* dwr, F* dscores, F* dlogits, const F* dgates, const F* x, const F* wr,
                    const F* scores, const int* experts, int N, int C, int E, int K,
                    RouterScoring scoring, bool norm_topk_prob, ThreadPool* pool) {
  ParallelFor(
      pool, N,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const F* s = scores + r * E;
          const int* ex = experts + r * K;
          const F* dg = dgates + r * K;
          F* ds = dscores + r * E;
          // gates: g_k = s_k / S (S = Σ_k s_k) when normalised, so
          // ds_k = (dg_k − Σ_j dg_j g_j) / S; else ds_k = dg_k.
          if (norm_topk_prob) {
            F sum = 0, dot = 0;
            for (int k = 0; k < K; ++k) sum += s[ex[k]];
            for (int k = 0; k < K; ++k) dot += dg[k] * s[ex[k]] / sum;
            for (int k = 0; k < K; ++k) ds[ex[k]] += (dg[k] - dot) / sum;
          } else {
            for (int k = 0; k < K; ++k) ds[ex[k]] += dg[k];
          }
          F* dl = dlogits + r * E;
          if (scoring == RouterScoring::kSoftmax) {
            F dot = 0;
            for (int e = 0; e < E; ++e) dot += s[e] * ds[e];
            for (int e = 0; e < E; ++e) dl[e] += s[e] * (ds[e] - dot);
          } else {
            for (int e = 0; e < E; ++e) dl[e] += ds[e] * s[e] * (F(1) - s[e]);
          }
        }
      },
      16);
  MatmulBackward<F>(dx, dwr, nullptr, dlogits, E, x, wr, N, C, E, pool);
}

// ------------------------------------------------- load, balancing losses

// Σ_e load[e]: the (token, slot) pairs the load counts (N·K of one rank's
// tokens, more when summed over ranks); at least 1.
template <typename F>
F LoadTotal(const int* load, int E) {
  int64_t total = 0;
  for (int e = 0; e < E; ++e) total += load[e];
  return F(std::max<int64_t>(total, 1));
}

void ExpertLoad(int* load, const int* experts, int N, int K, int E) {
  std::fill(load, load + E, 0);
  for (int64_t i = 0; i < int64_t{N} * K; ++i) ++load[experts[i]];
}

template <typename F>
F AuxLossForward(const F* scores, const int* load, int N, int E, int K, RouterScoring scoring,
                 F coef) {
  std::vector<F> P(E, F(0));  // Σ_t p[t,e]; divided by N below
  for (int64_t r = 0; r < N; ++r) {
    const F* s = scores + r * E;
    const F div = RowProbDivisor(s, E, scoring);
    for (int e = 0; e < E; ++e) P[e] += s[e] / div;
  }
  const F pairs = LoadTotal<F>(load, E);
  F sum = 0;
  for (int e = 0; e < E; ++e) sum += F(load[e]) / pairs * (P[e] / N);
  return coef * E * sum;
}

template <typename F>
void AuxLossBackward(F* dscores, const F* scores, const int* load, int N, int E, int K,
                     RouterScoring scoring, F coef, F dloss, ThreadPool* pool) {
  // d aux / d p[t,e] = coef · E · f_e / N, the same for every token.
  std::vector<F> c(E);
  const F pairs = LoadTotal<F>(load, E);
  for (int e = 0; e < E; ++e) c[e] = dloss * coef * E * (F(load[e]) / pairs) / N;
  ParallelFor(
      pool, N,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const F* s = scores + r * E;
          F* ds = dscores + r * E;
          if (scoring == RouterScoring::kSoftmax) {
            for (int e = 0; e < E; ++e) ds[e] += c[e];
            continue;
          }
          // p_e = s_e / S: ds_j = (c_j − Σ_e c_e p_e) / S.
          const F S = RowProbDivisor(s, E, scoring);
          F dot = 0;
          for (int e = 0; e < E; ++e) dot += c[e] * s[e] / S;
          for (int e = 0; e < E; ++e) ds[e] += (c[e] - dot) / S;
        }
      },
      64);
}

template <typename F>
F ZLossForward(const F* logits, int N, int E, F coef) {
  F sum = 0;
  for (int64_t r = 0; r < N; ++r) {
    const F lse = LogSumExp(logits + r * E, E);
    sum += lse * lse;
  }
  return coef * sum / N;
}

template <typename F>
void ZLossBackward(F* dlogits, const F* logits, int N, int E, F coef, F dloss, ThreadPool* pool) {
  ParallelFor(
      pool, N,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const F* l = logits + r * E;
          const F lse = LogSumExp(l, E);
          const F scale = dloss * coef * F(2) * lse / N;  // times softmax(l)
          F* dl = dlogits + r * E;
          for (int e = 0; e < E; ++e) dl[e] += scale * std::exp(l[e] - lse);
        }
      },
      64);
}

void AuxFreeBiasUpdate(float* bias, const int* load, int E, float rate) {
  double mean_load = 0;
  for (int e = 0; e < E; ++e) mean_load += load[e];
  mean_load /= E;
  double mean_bias = 0;
  for (int e = 0; e < E; ++e) {
    const double gap = mean_load - load[e];
    bias[e] += rate * static_cast<float>((gap > 0) - (gap < 0));
    mean_bias += bias[e];
  }
  mean_bias /= E;
  for (int e = 0; e < E; ++e) bias[e] -= static_cast<float>(mean_bias);
}

// --------------------------------------------------------------- dispatch

int BuildPermutation(int* counts, int* offsets, int* pair_of_row, int* row_of_pair,
                     const int* experts, int N, int K, int E, int capacity) {
  // A counting sort over the pairs in index order (token, then slot) is
  // stable; the capacity cut keeps each expert's first pairs in that order.
  const int64_t pairs = int64_t{N} * K;
  std::fill(counts, counts + E, 0);
  for (int64_t i = 0; i < pairs; ++i) {
    int& n = counts[experts[i]];
    row_of_pair[i] = capacity > 0 && n >= capacity ? -1 : n++;  // rank within the expert
  }
  offsets[0] = 0;
  for (int e = 0; e < E; ++e) offsets[e + 1] = offsets[e] + counts[e];
  for (int64_t i = 0; i < pairs; ++i) {
    if (row_of_pair[i] < 0) continue;
    row_of_pair[i] += offsets[experts[i]];
    pair_of_row[row_of_pair[i]] = static_cast<int>(i);
  }
  return static_cast<int>(pairs - offsets[E]);
}

template <typename F>
void PermuteForward(F* xp, const F* x, const int* pair_of_row, int M, int K, int C,
                    ThreadPool* pool) {
  ParallelFor(
      pool, M,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const F* src = x + int64_t{pair_of_row[r] / K} * C;
          std::copy(src, src + C, xp + r * C);
        }
      },
      16);
}

template <typename F>
void PermuteBackward(F* dx, const F* dxp, const int* row_of_pair, int N, int K, int C,
                     ThreadPool* pool) {
  ParallelFor(
      pool, N,
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          F* d = dx + t * C;
          for (int k = 0; k < K; ++k) {
            const int row = row_of_pair[t * K + k];
            if (row < 0) continue;
            const F* src = dxp + int64_t{row} * C;
            for (int c = 0; c < C; ++c) d[c] += src[c];
          }
        }
      },
      16);
}

template <typename F>
void CombineForward(F* out, const F* y, const F* gates, const int* row_of_pair, int N, int K, int C,
                    ThreadPool* pool) {
  ParallelFor(
      pool, N,
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          F* o = out + t * C;
          std::fill(o, o + C, F(0));
          for (int k = 0; k < K; ++k) {
            const int row = row_of_pair[t * K + k];
            if (row < 0) continue;
            const F g = gates[t * K + k];
            const F* src = y + int64_t{row} * C;
            for (int c = 0; c < C; ++c) o[c] += g * src[c];
          }
        }
      },
      16);
}

template <typename F>
void CombineBackward(F* dy, F* dgates, const F* dout, const F* y, const F* gates,
                     const int* row_of_pair, int N, int K, int C, ThreadPool* pool) {
  ParallelFor(
      pool, N,
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          const F* d = dout + t * C;
          for (int k = 0; k < K; ++k) {
            const int row = row_of_pair[t * K + k];
            if (row < 0) continue;
            const F g = gates[t * K + k];
            const F* src = y + int64_t{row} * C;
            F* dst = dy + int64_t{row} * C;
            F dot = 0;
            for (int c = 0; c < C; ++c) {
              dst[c] += g * d[c];
              dot += d[c] * src[c];
            }
            dgates[t * K + k] += dot;
          }
        }
      },
      16);
}

// ---------------------------------------------------------------- experts

template <typename F>
void ExpertsForward(F* y, F* h_pre, F* h, const F* xp, const F* w1, const F* b1, const F* w2,
                    const F* b2, const int* offsets, int E, int C, int H, model::MlpKind mlp,
                    ThreadPool* pool) {
  const bool swiglu = mlp == model::MlpKind::kSwiGlu;
  const int F1 = swiglu ? 2 * H : H;
  const int M = offsets[E];
  for (int e = 0; e < E; ++e) {
    const int o = offsets[e], n = offsets[e + 1] - o;
    if (n == 0) continue;
    MatmulForward<F>(h_pre + int64_t{o} * F1, xp + int64_t{o} * C, w1 + int64_t{e} * F1 * C,
                     b1 == nullptr ? nullptr : b1 + int64_t{e} * F1, n, C, F1, F1, pool);
  }
  if (swiglu) {
    SwiGluForward<F>(h, h_pre, M, H, pool);
  } else {
    GeluForward<F>(h, h_pre, int64_t{M} * H, pool);
  }
  for (int e = 0; e < E; ++e) {
    const int o = offsets[e], n = offsets[e + 1] - o;
    if (n == 0) continue;
    MatmulForward<F>(y + int64_t{o} * C, h + int64_t{o} * H, w2 + int64_t{e} * C * H,
                     b2 == nullptr ? nullptr : b2 + int64_t{e} * C, n, H, C, C, pool);
  }
}

template <typename F>
void ExpertsBackward(F* dxp, F* dw1, F* db1, F* dw2, F* db2, F* dh, F* dh_pre, const F* dy,
                     const F* xp, const F* w1, const F* w2, const F* h_pre, const F* h,
                     const int* offsets, int E, int C, int H, model::MlpKind mlp,
                     ThreadPool* pool) {
  const bool swiglu = mlp == model::MlpKind::kSwiGlu;
  const int F1 = swiglu ? 2 * H : H;
  const int M = offsets[E];
  std::fill(dh, dh + int64_t{M} * H, F(0));
  std::fill(dh_pre, dh_pre + int64_t{M} * F1, F(0));
  for (int e = 0; e < E; ++e) {
    const int o = offsets[e], n = offsets[e + 1] - o;
    if (n == 0) continue;
    MatmulBackward<F>(dh + int64_t{o} * H, dw2 + int64_t{e} * C * H,
                      db2 == nullptr ? nullptr : db2 + int64_t{e} * C, dy + int64_t{o} * C, C,
                      h + int64_t{o} * H, w2 + int64_t{e} * C * H, n, H, C, pool);
  }
  if (swiglu) {
    SwiGluBackward<F>(dh_pre, h_pre, dh, M, H, pool);
  } else {
    GeluBackward<F>(dh_pre, h_pre, dh, int64_t{M} * H, pool);
  }
  for (int e = 0; e < E; ++e) {
    const int o = offsets[e], n = offsets[e + 1] - o;
    if (n == 0) continue;
    MatmulBackward<F>(dxp + int64_t{o} * C, dw1 + int64_t{e} * F1 * C,
                      db1 == nullptr ? nullptr : db1 + int64_t{e} * F1, dh_pre + int64_t{o} * F1,
                      F1, xp + int64_t{o} * C, w1 + int64_t{e} * F1 * C, n, C, F1, pool);
  }
}

// ------------------------------------------------------ instantiations

#define SHARDTRAIN_INSTANTIATE_MOE_LAYERS(F)                                                       \
  template void RouterForward<F>(F*, F*, int*, F*, const F*, const F*, const float*, int, int,     \
                                 int, int, RouterScoring, bool, ThreadPool*);                      \
  template void RouterBackward<F>(F*, F*, F*, F*, const F*, const F*, const F*, const F*,          \
                                  const int*, int, int, int, int, RouterScoring, bool,             \
                                  ThreadPool*);                                                    \
  template F AuxLossForward<F>(const F*, const int*, int, int, int, RouterScoring, F);             \
  template void AuxLossBackward<F>(F*, const F*, const int*, int, int, int, RouterScoring, F, F,   \
                                   ThreadPool*);                                                   \
  template F ZLossForward<F>(const F*, int, int, F);                                               \
  template void ZLossBackward<F>(F*, const F*, int, int, F, F, ThreadPool*);                       \
  template void PermuteForward<F>(F*, const F*, const int*, int, int, int, ThreadPool*);           \
  template void PermuteBackward<F>(F*, const F*, const int*, int, int, int, ThreadPool*);          \
  template void CombineForward<F>(F*, const F*, const F*, const int*, int, int, int, ThreadPool*); \
  template void CombineBackward<F>(F*, F*, const F*, const F*, const F*, const int*, int, int,     \
                                   int, ThreadPool*);                                              \
  template void ExpertsForward<F>(F*, F*, F*, const F*, const F*, const F*, const F*, const F*,    \
                                  const int*, int, int, int, model::MlpKind, ThreadPool*);         \
  template void ExpertsBackward<F>(F*, F*, F*, F*, F*, F*, F*, const F*, const F*, const F*,       \
                                   const F*, const F*, const F*, const int*, int, int, int,        \
                                   model::MlpKind, ThreadPool*);

SHARDTRAIN_INSTANTIATE_MOE_LAYERS(float)
SHARDTRAIN_INSTANTIATE_MOE_LAYERS(double)

}  // namespace shardtrain::engine::cpu
