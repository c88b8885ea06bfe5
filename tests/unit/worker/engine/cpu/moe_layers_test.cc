// The Mixture-of-Experts layers: finite-difference checks (in double) of the
// router with its balancing losses, the dispatch and the grouped experts,
// the composed block against a naive per-token loop, and float-vs-double
// forward agreement.
#include "worker/engine/cpu/moe_layers.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "tests/unit/worker/engine/cpu/fd_test_util.h"

namespace shardtrain::engine::cpu {
namespace {

using model::MlpKind;
using Vec = std::vector<double>;
using Ints = std::vector<int>;

using namespace fd;  // NOLINT: the finite-difference helpers (fd_test_util.h)

template <typename T>
const T* Ptr(const std::vector<T>& v) {
  return v.empty() ? nullptr : v.data();
}

// ---------------------------------------------------------------- router

// L = Σ g·gates + aux + z through the router; FD of dx and dwr.
void CheckRouterGrad(const char* name, RouterScoring scoring, bool norm,
                     const std::vector<float>& bias, uint64_t seed) {
  const int N = 6, C = 5, E = 6, K = 2;
  const double aux_coef = 0.3, z_coef = 0.2;
  std::mt19937_64 rng(seed);
  Vec x = RandomVec(N * C, rng), wr = RandomVec(E * C, rng), g = RandomVec(N * K, rng);
  Vec logits(N * E), scores(N * E), gates(N * K);
  Ints experts(N * K), load(E);
  auto loss = [&] {
    RouterForward<double>(logits.data(), scores.data(), experts.data(), gates.data(), x.data(),
                          wr.data(), Ptr(bias), N, C, E, K, scoring, norm, nullptr);
    ExpertLoad(load.data(), experts.data(), N, K, E);
    return Dot(g, gates) +
           AuxLossForward<double>(scores.data(), load.data(), N, E, K, scoring, aux_coef) +
           ZLossForward<double>(logits.data(), N, E, z_coef);
  };
  loss();
  const Ints chosen = experts;
  Vec dx(x.size()), dwr(wr.size()), dscores(N * E), dlogits(N * E);
  AuxLossBackward<double>(dscores.data(), scores.data(), load.data(), N, E, K, scoring, aux_coef,
                          1.0, nullptr);
  ZLossBackward<double>(dlogits.data(), logits.data(), N, E, z_coef, 1.0, nullptr);
  RouterBackward<double>(dx.data(), dwr.data(), dscores.data(), dlogits.data(), g.data(), x.data(),
                         wr.data(), scores.data(), experts.data(), N, C, E, K, scoring, norm,
                         nullptr);
  ExpectGradClose(name, "x", dx, NumericGrad(x, loss));
  ExpectGradClose(name, "wr", dwr, NumericGrad(wr, loss));
  loss();
  EXPECT_EQ(experts, chosen) << "the finite differences changed the choice";
}

TEST(MoeLayersTest, RouterGradients) {
  const std::vector<float> none, bias = {0.f, 0.3f, -0.2f, 0.f, 0.1f, -0.4f};
  CheckRouterGrad("router-sm", RouterScoring::kSoftmax, false, none, 11);
  CheckRouterGrad("router-sm-norm", RouterScoring::kSoftmax, true, none, 12);
  CheckRouterGrad("router-sig", RouterScoring::kSigmoid, false, none, 13);
  CheckRouterGrad("router-sig-norm", RouterScoring::kSigmoid, true, none, 14);
  CheckRouterGrad("router-sm-bias", RouterScoring::kSoftmax, true, bias, 15);
  CheckRouterGrad("router-sig-bias", RouterScoring::kSigmoid, true, bias, 16);
}

// The bias changes which experts are chosen, never how they are weighed.
TEST(MoeLayersTest, RouterBiasChoosesButDoesNotWeigh) {
  const int N = 8, C = 5, E = 4, K = 2;
  for (RouterScoring scoring : {RouterScoring::kSoftmax, RouterScoring::kSigmoid}) {
    for (bool norm : {false, true}) {
      std::mt19937_64 rng(21);
      Vec x = RandomVec(N * C, rng), wr = RandomVec(E * C, rng);
      Vec logits(N * E), scores(N * E), gates(N * K), gates_b(N * K);
      Ints experts(N * K), experts_b(N * K);
      const std::vector<float> bias = {0.f, 0.f, 0.f, 2.f};  // forces expert 3 in
      RouterForward<double>(logits.data(), scores.data(), experts.data(), gates.data(), x.data(),
                            wr.data(), nullptr, N, C, E, K, scoring, norm, nullptr);
      RouterForward<double>(logits.data(), scores.data(), experts_b.data(), gates_b.data(),
                            x.data(), wr.data(), bias.data(), N, C, E, K, scoring, norm, nullptr);
      int lacked_3 = 0;  // tokens whose unbiased choice lacks expert 3
      for (int t = 0; t < N; ++t) lacked_3 += experts[t * K] != 3 && experts[t * K + 1] != 3;
      EXPECT_GT(lacked_3, 0);
      for (int t = 0; t < N; ++t) {
        const int* ex = &experts_b[t * K];
        EXPECT_EQ(ex[0], 3) << "token " << t;
        double sum = 0;
        for (int k = 0; k < K; ++k) sum += scores[t * E + ex[k]];
        for (int k = 0; k < K; ++k) {
          const double want = scores[t * E + ex[k]] / (norm ? sum : 1.0);
          EXPECT_DOUBLE_EQ(gates_b[t * K + k], want) << "token " << t << " slot " << k;
        }
      }
    }
  }
}

// Equal keys go to the lower expert index; the losses' values at a uniform
// router: aux = coef, z = coef · (log E)².
TEST(MoeLayersTest, RouterTiesGoToTheLowerIndex) {
  const int N = 3, C = 4, E = 5;
  Vec x(N * C, 0.0), wr(E * C, 0.5), logits(N * E), scores(N * E), gates(N * 3);
  Ints experts(N * 3), load(E);
  for (RouterScoring scoring : {RouterScoring::kSoftmax, RouterScoring::kSigmoid}) {
    RouterForward<double>(logits.data(), scores.data(), experts.data(), gates.data(), x.data(),
                          wr.data(), nullptr, N, C, E, 3, scoring, true, nullptr);
    for (int t = 0; t < N; ++t) {
      EXPECT_EQ(Ints(experts.begin() + t * 3, experts.begin() + t * 3 + 3), (Ints{0, 1, 2}));
      for (int k = 0; k < 3; ++k) EXPECT_DOUBLE_EQ(gates[t * 3 + k], 1.0 / 3);
    }
    ExpertLoad(load.data(), experts.data(), N, 3, E);
    EXPECT_EQ(load, (Ints{3, 3, 3, 0, 0}));
    EXPECT_NEAR(AuxLossForward<double>(scores.data(), load.data(), N, E, 3, scoring, 0.01), 0.01,
                1e-15);
    EXPECT_NEAR(ZLossForward<double>(logits.data(), N, E, 0.1), 0.1 * std::log(5.0) * std::log(5.0),
                1e-14);
    // A bias that ties experts 1 and 3 above the rest, then 0, 2, 4 tie.
    const std::vector<float> bias = {0.f, 0.25f, 0.f, 0.25f, 0.f};
    RouterForward<double>(logits.data(), scores.data(), experts.data(), gates.data(), x.data(),
                          wr.data(), bias.data(), N, C, E, 3, scoring, false, nullptr);
    for (int t = 0; t < N; ++t)
      EXPECT_EQ(Ints(experts.begin() + t * 3, experts.begin() + t * 3 + 3), (Ints{1, 3, 0}));
  }
}

TEST(MoeLayersTest, AuxFreeBiasUpdateByHand) {
  // experts (4,2) -> load {3, 1, 2, 2}, mean 2: signs -1, +1, 0, 0.
  const Ints experts = {0, 1, 0, 2, 3, 0, 2, 3};
  Ints load(4);
  ExpertLoad(load.data(), experts.data(), 4, 2, 4);
  EXPECT_EQ(load, (Ints{3, 1, 2, 2}));
  std::vector<float> bias = {0.1f, -0.2f, 0.0f, 0.3f};
  AuxFreeBiasUpdate(bias.data(), load.data(), 4, 0.01f);
  // {0.09, -0.19, 0, 0.3} less their mean 0.05.
  const std::vector<float> want = {0.04f, -0.24f, -0.05f, 0.25f};
  for (int e = 0; e < 4; ++e) EXPECT_NEAR(bias[e], want[e], 1e-6) << "expert " << e;
}

// -------------------------------------------------------------- dispatch

// Builds the permutation of experts (N,K), checks it against its contract,
// then FD of permute (dx) and combine (dy, dgates).
void CheckDispatch(const char* name, const Ints& experts, int N, int K, int E, int capacity,
                   int want_dropped) {
  const int C = 3;
  Ints counts(E), offsets(E + 1), pair_of_row(N * K), row_of_pair(N * K);
  const int dropped = BuildPermutation(counts.data(), offsets.data(), pair_of_row.data(),
                                       row_of_pair.data(), experts.data(), N, K, E, capacity);
  const int M = offsets[E];
  EXPECT_EQ(dropped, want_dropped);
  EXPECT_EQ(M, N * K - dropped);
  // Each expert keeps its first `capacity` pairs in pair order, stably.
  Ints seen(E, 0);
  for (int i = 0; i < N * K; ++i) {
    const int e = experts[i];
    const bool kept = capacity <= 0 || seen[e] < capacity;
    if (!kept) {
      EXPECT_EQ(row_of_pair[i], -1) << name << " pair " << i;
      continue;
    }
    EXPECT_EQ(row_of_pair[i], offsets[e] + seen[e]++) << name << " pair " << i;
    EXPECT_EQ(pair_of_row[row_of_pair[i]], i);
  }
  for (int e = 0; e < E; ++e) {
    EXPECT_EQ(counts[e], seen[e]) << name << " expert " << e;
    EXPECT_EQ(offsets[e + 1] - offsets[e], counts[e]);
  }

  std::mt19937_64 rng(31);
  Vec x = RandomVec(N * C, rng), wp = RandomVec(M * C, rng), xp(M * C);
  auto permute_loss = [&] {
    PermuteForward<double>(xp.data(), x.data(), pair_of_row.data(), M, K, C, nullptr);
    return Dot(xp, wp);
  };
  permute_loss();
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < C; ++c) EXPECT_EQ(xp[r * C + c], x[pair_of_row[r] / K * C + c]);
  Vec dx(x.size());
  PermuteBackward<double>(dx.data(), wp.data(), row_of_pair.data(), N, K, C, nullptr);
  ExpectGradClose(name, "x", dx, NumericGrad(x, permute_loss));

  Vec y = RandomVec(M * C, rng), gates = RandomVec(N * K, rng), w = RandomVec(N * C, rng);
  Vec out(N * C);
  auto combine_loss = [&] {
    CombineForward<double>(out.data(), y.data(), gates.data(), row_of_pair.data(), N, K, C,
                           nullptr);
    return Dot(out, w);
  };
  combine_loss();
  Vec dy(y.size()), dgates(gates.size());
  CombineBackward<double>(dy.data(), dgates.data(), w.data(), y.data(), gates.data(),
                          row_of_pair.data(), N, K, C, nullptr);
  if (M > 0) ExpectGradClose(name, "y", dy, NumericGrad(y, combine_loss));
  ExpectGradClose(name, "gates", dgates, NumericGrad(gates, combine_loss));
  for (int t = 0; t < N; ++t) {
    bool any = false;
    for (int k = 0; k < K; ++k) {
      if (row_of_pair[t * K + k] >= 0) {
        any = true;
      } else {
        EXPECT_EQ(dgates[t * K + k], 0.0) << name << " dropped pair gets no gradient";
      }
    }
    if (any) continue;
    for (int c = 0; c < C; ++c) EXPECT_EQ(out[t * C + c], 0.0) << name << " token " << t;
  }
}

TEST(MoeLayersTest, DispatchWithAnEmptyExpert) {
  // Expert 2 of 4 receives no token.
  CheckDispatch("dispatch-empty", {0, 1, 3, 0, 1, 3, 0, 3, 1, 0}, 5, 2, 4, 0, 0);
}

TEST(MoeLayersTest, DispatchEveryTokenToOneExpert) {
  CheckDispatch("dispatch-one", {3, 3, 3, 3, 3, 3}, 6, 1, 4, 0, 0);
  CheckDispatch("dispatch-one-k2", {1, 0, 1, 2, 1, 3, 1, 0}, 4, 2, 4, 0, 0);
}

TEST(MoeLayersTest, DispatchCapacityDrops) {
  // Capacity 3: expert 0 has 5 pairs (drops tokens 4 and 5's), expert 1 has
  // 4 (drops token 5's), expert 2 has 3. Token 5 loses both of its pairs.
  const Ints experts = {0, 1, 0, 2, 1, 0, 2, 1, 2, 0, 0, 1};
  CheckDispatch("dispatch-cap", experts, 6, 2, 3, 3, 3);
  Ints counts(3), offsets(4), pair_of_row(12), row_of_pair(12);
  EXPECT_EQ(BuildPermutation(counts.data(), offsets.data(), pair_of_row.data(), row_of_pair.data(),
                             experts.data(), 6, 2, 3, 3),
            3);
  EXPECT_EQ(counts, (Ints{3, 3, 3}));
  EXPECT_EQ(row_of_pair, (Ints{0, 3, 1, 6, 4, 2, 7, 5, 8, -1, -1, -1}));
}

// ---------------------------------------------------------------- experts

void CheckExperts(const char* name, MlpKind mlp, bool biases) {
  const int E = 3, C = 4, H = 5, F1 = mlp == MlpKind::kSwiGlu ? 2 * H : H;
  const Ints offsets = {0, 3, 3, 7};  // expert 1 is empty
  const int M = offsets[E];
  std::mt19937_64 rng(41);
  Vec xp = RandomVec(M * C, rng), w1 = RandomVec(E * F1 * C, rng, 0.5);
  Vec w2 = RandomVec(E * C * H, rng, 0.5), w = RandomVec(M * C, rng);
  Vec b1 = biases ? RandomVec(E * F1, rng) : Vec(), b2 = biases ? RandomVec(E * C, rng) : Vec();
  Vec y(M * C), h_pre(M * F1), h(M * H);
  auto loss = [&] {
    ExpertsForward<double>(y.data(), h_pre.data(), h.data(), xp.data(), w1.data(), Ptr(b1),
                           w2.data(), Ptr(b2), offsets.data(), E, C, H, mlp, nullptr);
    return Dot(y, w);
  };
  loss();
  Vec dxp(xp.size()), dw1(w1.size()), dw2(w2.size()), db1(b1.size()), db2(b2.size());
  Vec dh(M * H), dh_pre(M * F1);
  ExpertsBackward<double>(dxp.data(), dw1.data(), biases ? db1.data() : nullptr, dw2.data(),
                          biases ? db2.data() : nullptr, dh.data(), dh_pre.data(), w.data(),
                          xp.data(), w1.data(), w2.data(), h_pre.data(), h.data(), offsets.data(),
                          E, C, H, mlp, nullptr);
  ExpectGradClose(name, "xp", dxp, NumericGrad(xp, loss));
  ExpectGradClose(name, "w1", dw1, NumericGrad(w1, loss));
  ExpectGradClose(name, "w2", dw2, NumericGrad(w2, loss));
  if (biases) {
    ExpectGradClose(name, "b1", db1, NumericGrad(b1, loss));
    ExpectGradClose(name, "b2", db2, NumericGrad(b2, loss));
  }
  for (int i = 0; i < F1 * C; ++i) EXPECT_EQ(dw1[F1 * C + i], 0.0) << "empty expert's dw1";
}

TEST(MoeLayersTest, GroupedExpertsGelu) { CheckExperts("experts-gelu", MlpKind::kGelu, true); }
TEST(MoeLayersTest, GroupedExpertsSwiGlu) {
  CheckExperts("experts-swiglu", MlpKind::kSwiGlu, false);
}

// --------------------------------------------------- the composed block

struct MoeConfig {
  int N = 7, C = 6, E = 4, K = 2, H = 5;
  RouterScoring scoring = RouterScoring::kSoftmax;
  bool norm = true;
  MlpKind mlp = MlpKind::kSwiGlu;
  int capacity = 0;
  std::vector<float> bias;  // empty: none
  double aux_coef = 0.1, z_coef = 0.05;
  int F1() const { return mlp == MlpKind::kSwiGlu ? 2 * H : H; }
};

// router -> permute -> experts -> combine, with its saved activations, and
// its backward from dout with the balancing losses (each of weight 1).
template <typename F>
struct MoeBlock {
  MoeConfig cfg;
  ThreadPool* pool = nullptr;
  std::vector<F> x, wr, w1, b1, w2, b2;  // b1, b2 empty: no biases
  std::vector<F> logits, scores, gates, xp, h_pre, h, y, out;
  Ints experts, load, counts, offsets, pair_of_row, row_of_pair;
  int M = 0;
  F aux = 0, z = 0;
  std::vector<F> dx, dwr, dw1, db1, dw2, db2;

  void Forward() {
    const MoeConfig& c = cfg;
    const int NK = c.N * c.K;
    logits.resize(c.N * c.E), scores.resize(c.N * c.E), gates.resize(NK), experts.resize(NK);
    load.resize(c.E), counts.resize(c.E), offsets.resize(c.E + 1);
    pair_of_row.resize(NK), row_of_pair.resize(NK);
    xp.resize(NK * c.C), h_pre.resize(NK * c.F1()), h.resize(NK * c.H), y.resize(NK * c.C);
    out.resize(c.N * c.C);
    RouterForward<F>(logits.data(), scores.data(), experts.data(), gates.data(), x.data(),
                     wr.data(), Ptr(c.bias), c.N, c.C, c.E, c.K, c.scoring, c.norm, pool);
    ExpertLoad(load.data(), experts.data(), c.N, c.K, c.E);
    aux = AuxLossForward<F>(scores.data(), load.data(), c.N, c.E, c.K, c.scoring, F(c.aux_coef));
    z = ZLossForward<F>(logits.data(), c.N, c.E, F(c.z_coef));
    BuildPermutation(counts.data(), offsets.data(), pair_of_row.data(), row_of_pair.data(),
                     experts.data(), c.N, c.K, c.E, c.capacity);
    M = offsets[c.E];
    PermuteForward<F>(xp.data(), x.data(), pair_of_row.data(), M, c.K, c.C, pool);
    ExpertsForward<F>(y.data(), h_pre.data(), h.data(), xp.data(), w1.data(), Ptr(b1), w2.data(),
                      Ptr(b2), offsets.data(), c.E, c.C, c.H, c.mlp, pool);
    CombineForward<F>(out.data(), y.data(), gates.data(), row_of_pair.data(), c.N, c.K, c.C, pool);
  }

  // Overwrites dx, dwr, dw1, db1, dw2, db2 with the gradients of
  // dout · out + aux + z: combine -> experts -> permute -> router.
  void Backward(const std::vector<F>& dout) {
    const MoeConfig& c = cfg;
    const int NK = c.N * c.K;
    std::vector<F> dy(NK * c.C), dgates(NK), dxp(NK * c.C), dh(NK * c.H), dh_pre(NK * c.F1());
    std::vector<F> dscores(c.N * c.E), dlogits(c.N * c.E);
    dx.assign(x.size(), 0), dwr.assign(wr.size(), 0), dw1.assign(w1.size(), 0);
    db1.assign(b1.size(), 0), dw2.assign(w2.size(), 0), db2.assign(b2.size(), 0);
    CombineBackward<F>(dy.data(), dgates.data(), dout.data(), y.data(), gates.data(),
                       row_of_pair.data(), c.N, c.K, c.C, pool);
    ExpertsBackward<F>(dxp.data(), dw1.data(), db1.empty() ? nullptr : db1.data(), dw2.data(),
                       db2.empty() ? nullptr : db2.data(), dh.data(), dh_pre.data(), dy.data(),
                       xp.data(), w1.data(), w2.data(), h_pre.data(), h.data(), offsets.data(), c.E,
                       c.C, c.H, c.mlp, pool);
    PermuteBackward<F>(dx.data(), dxp.data(), row_of_pair.data(), c.N, c.K, c.C, pool);
    AuxLossBackward<F>(dscores.data(), scores.data(), load.data(), c.N, c.E, c.K, c.scoring,
                       F(c.aux_coef), F(1), pool);
    ZLossBackward<F>(dlogits.data(), logits.data(), c.N, c.E, F(c.z_coef), F(1), pool);
    RouterBackward<F>(dx.data(), dwr.data(), dscores.data(), dlogits.data(), dgates.data(),
                      x.data(), wr.data(), scores.data(), experts.data(), c.N, c.C, c.E, c.K,
                      c.scoring, c.norm, pool);
  }
};

MoeBlock<double> RandomBlock(const MoeConfig& c, uint64_t seed, bool biases) {
  std::mt19937_64 rng(seed);
  MoeBlock<double> b;
  b.cfg = c;
  b.x = RandomVec(c.N * c.C, rng), b.wr = RandomVec(c.E * c.C, rng);
  b.w1 = RandomVec(c.E * c.F1() * c.C, rng, 0.5), b.w2 = RandomVec(c.E * c.C * c.H, rng, 0.5);
  if (biases) b.b1 = RandomVec(c.E * c.F1(), rng), b.b2 = RandomVec(c.E * c.C, rng);
  return b;
}

// The naive loop: per token, the router by hand (a stable sort keeps the
// lower index first on ties), the capacity by counting, each chosen expert's
// MLP on the token, weighed by its gate.
Vec NaiveMoe(const MoeBlock<double>& b) {
  const MoeConfig& c = b.cfg;
  Vec out(c.N * c.C, 0.0);
  Ints taken(c.E, 0);
  for (int t = 0; t < c.N; ++t) {
    Vec s(c.E), key(c.E);
    double sum = 0;
    for (int e = 0; e < c.E; ++e) {
      double l = 0;
      for (int i = 0; i < c.C; ++i) l += b.x[t * c.C + i] * b.wr[e * c.C + i];
      s[e] = c.scoring == RouterScoring::kSoftmax ? std::exp(l) : 1 / (1 + std::exp(-l));
      sum += s[e];
    }
    for (int e = 0; e < c.E; ++e) {
      if (c.scoring == RouterScoring::kSoftmax) s[e] /= sum;
      key[e] = s[e] + (c.bias.empty() ? 0.0 : c.bias[e]);
    }
    Ints order(c.E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int e) { return key[a] > key[e]; });
    double gsum = 0;
    for (int k = 0; k < c.K; ++k) gsum += s[order[k]];
    for (int k = 0; k < c.K; ++k) {
      const int e = order[k];
      if (c.capacity > 0 && taken[e]++ >= c.capacity) continue;
      const double gate = s[e] / (c.norm ? gsum : 1.0);
      Vec act(c.H);
      for (int j = 0; j < c.H; ++j) {
        auto pre = [&](int row) {
          double v = b.b1.empty() ? 0.0 : b.b1[e * c.F1() + row];
          for (int i = 0; i < c.C; ++i) v += b.w1[(e * c.F1() + row) * c.C + i] * b.x[t * c.C + i];
          return v;
        };
        if (c.mlp == MlpKind::kSwiGlu) {
          const double g = pre(j), u = pre(c.H + j);
          act[j] = g / (1 + std::exp(-g)) * u;
        } else {
          const double v = pre(j);
          act[j] = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
        }
      }
      for (int o = 0; o < c.C; ++o) {
        double v = b.b2.empty() ? 0.0 : b.b2[e * c.C + o];
        for (int j = 0; j < c.H; ++j) v += b.w2[(e * c.C + o) * c.H + j] * act[j];
        out[t * c.C + o] += gate * v;
      }
    }
  }
  return out;
}

void CheckMoe(const char* name, const MoeConfig& c, bool biases, uint64_t seed) {
  MoeBlock<double> b = RandomBlock(c, seed, biases);
  std::mt19937_64 rng(seed + 1);
  const Vec w = RandomVec(c.N * c.C, rng);
  auto loss = [&] {
    b.Forward();
    return Dot(b.out, w) + b.aux + b.z;
  };
  loss();
  const Ints chosen = b.experts;
  const double naive_diff = MaxRelDiff(b.out, NaiveMoe(b));
  std::printf("[naive] %-16s out max rel diff %.3e (M = %d of %d)\n", name, naive_diff, b.M,
              c.N * c.K);
  EXPECT_LT(naive_diff, 1e-12) << name;

  b.Backward(w);
  ExpectGradClose(name, "x", b.dx, NumericGrad(b.x, loss));
  ExpectGradClose(name, "wr", b.dwr, NumericGrad(b.wr, loss));
  ExpectGradClose(name, "w1", b.dw1, NumericGrad(b.w1, loss));
  ExpectGradClose(name, "w2", b.dw2, NumericGrad(b.w2, loss));
  if (biases) {
    ExpectGradClose(name, "b1", b.db1, NumericGrad(b.b1, loss));
    ExpectGradClose(name, "b2", b.db2, NumericGrad(b.b2, loss));
  }
  loss();
  EXPECT_EQ(b.experts, chosen) << "the finite differences changed the choice";

  // float forward vs double
  MoeBlock<float> f;
  f.cfg = c;
  f.x = ToFloat(b.x), f.wr = ToFloat(b.wr), f.w1 = ToFloat(b.w1), f.w2 = ToFloat(b.w2);
  f.b1 = ToFloat(b.b1), f.b2 = ToFloat(b.b2);
  f.Forward();
  EXPECT_EQ(f.experts, b.experts) << name;
  ExpectFloatClose(name, f.out, b.out);
}

TEST(MoeLayersTest, ComposedSwiGluSoftmax) {
  MoeConfig c;  // Mixtral-like: softmax, top-2 renormalised, SwiGLU, no biases
  CheckMoe("moe-swiglu", c, false, 51);
}

TEST(MoeLayersTest, ComposedGeluSigmoidBiasCapacity) {
  MoeConfig c;  // DeepSeek-like router on GPT-2 experts, with a capacity cut
  c.scoring = RouterScoring::kSigmoid;
  c.mlp = MlpKind::kGelu;
  c.bias = {0.05f, -0.1f, 0.f, 0.08f};
  c.capacity = 3;
  CheckMoe("moe-gelu-cap", c, true, 52);
}

// The pool splits rows, never a sum: a pool of 3 gives the serial result
// bit for bit (the sizes keep every GEMM below Gemm's threading cut, so this
// exercises the MoE layers' own loops).
TEST(MoeLayersTest, ThreadedMatchesSerial) {
  MoeConfig c;
  c.N = 96, c.C = 16, c.E = 8, c.K = 2, c.H = 24;
  c.scoring = RouterScoring::kSigmoid;
  c.mlp = MlpKind::kGelu;
  c.capacity = 22;
  MoeBlock<double> b = RandomBlock(c, 61, true);
  std::mt19937_64 rng(62);
  const Vec dout = RandomVec(c.N * c.C, rng);
  b.Forward();
  b.Backward(dout);
  MoeBlock<double> t = b;
  ThreadPool pool(3);
  t.pool = &pool;
  t.Forward();
  t.Backward(dout);
  EXPECT_LT(b.M, c.N * c.K);  // the capacity drops some pairs
  EXPECT_EQ(t.experts, b.experts);
  EXPECT_EQ(t.out, b.out);
  EXPECT_EQ(t.aux, b.aux);
  EXPECT_EQ(t.dx, b.dx);
  EXPECT_EQ(t.dwr, b.dwr);
  EXPECT_EQ(t.dw1, b.dw1);
  EXPECT_EQ(t.db1, b.db1);
  EXPECT_EQ(t.dw2, b.dw2);
  EXPECT_EQ(t.db2, b.db2);
  std::printf("[threads] kept %d of %d pairs\n", b.M, c.N * c.K);
}

}  // namespace
}  // namespace shardtrain::engine::cpu
