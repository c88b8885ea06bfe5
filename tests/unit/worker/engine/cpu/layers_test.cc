// Finite-difference checks (in double) of every layer's backward, and
// float-vs-double forward agreement (checks the vectorised exp/tanh).
#include "worker/engine/cpu/layers.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <vector>

namespace shardtrain::engine::cpu {
namespace {

using Vec = std::vector<double>;

Vec RandomVec(size_t n, std::mt19937_64& rng, double scale = 1.0) {
  std::normal_distribution<double> d(0.0, scale);
  Vec v(n);
  for (double& x : v) x = d(rng);
  return v;
}

// max|a - b| / max(max|b|, 1e-12): relative to the tensor's scale.
double MaxRelDiff(const Vec& a, const Vec& b) {
  double diff = 0, scale = 1e-12;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return diff / scale;
}

// Central differences of loss() w.r.t. every element of x.
Vec NumericGrad(Vec& x, const std::function<double()>& loss) {
  constexpr double kEps = 1e-5;
  Vec g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double orig = x[i];
    x[i] = orig + kEps;
    const double lp = loss();
    x[i] = orig - kEps;
    const double lm = loss();
    x[i] = orig;
    g[i] = (lp - lm) / (2 * kEps);
  }
  return g;
}

double Dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

constexpr double kFdTol = 1e-6;

void ExpectGradClose(const char* layer, const char* input, const Vec& analytic,
                     const Vec& numeric) {
  const double rel = MaxRelDiff(analytic, numeric);
  std::printf("[FD] %-14s d%-8s max rel diff %.3e\n", layer, input, rel);
  EXPECT_LT(rel, kFdTol) << layer << " d" << input;
}

std::vector<float> ToFloat(const Vec& v) { return {v.begin(), v.end()}; }

void ExpectFloatClose(const char* layer, const std::vector<float>& f, const Vec& d,
                      double tol = 2e-6) {
  const double rel = MaxRelDiff(Vec(f.begin(), f.end()), d);
  std::printf("[f32 vs f64] %-14s forward max rel diff %.3e\n", layer, rel);
  EXPECT_LT(rel, tol) << layer;
}

TEST(LayersTest, Encoder) {
  const int B = 2, T = 3, C = 5, V = 7, ctx = 4;
  std::mt19937_64 rng(1);
  Vec wte = RandomVec(V * C, rng), wpe = RandomVec(ctx * C, rng);
  std::vector<int> tok = {1, 3, 1, 6, 0, 3};
  Vec w = RandomVec(B * T * C, rng), out(B * T * C);
  auto loss = [&] {
    EncoderForward<double>(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C, nullptr);
    return Dot(out, w);
  };
  Vec dwte(wte.size()), dwpe(wpe.size());
  EncoderBackward<double>(dwte.data(), dwpe.data(), w.data(), tok.data(), B, T, C);
  ExpectGradClose("encoder", "wte", dwte, NumericGrad(wte, loss));
  ExpectGradClose("encoder", "wpe", dwpe, NumericGrad(wpe, loss));
}

TEST(LayersTest, LayerNorm) {
  const int N = 6, C = 9;
  std::mt19937_64 rng(2);
  Vec inp = RandomVec(N * C, rng, 2.0), wt = RandomVec(C, rng), bs = RandomVec(C, rng);
  Vec w = RandomVec(N * C, rng), out(N * C), mean(N), rstd(N);
  auto loss = [&] {
    LayerNormForward<double>(out.data(), mean.data(), rstd.data(), inp.data(), wt.data(), bs.data(),
                             N, C, nullptr);
    return Dot(out, w);
  };
  loss();
  Vec dinp(inp.size()), dwt(C), dbs(C);
  LayerNormBackward<double>(dinp.data(), dwt.data(), dbs.data(), w.data(), inp.data(), wt.data(),
                            mean.data(), rstd.data(), N, C, nullptr);
  ExpectGradClose("layernorm", "inp", dinp, NumericGrad(inp, loss));
  ExpectGradClose("layernorm", "weight", dwt, NumericGrad(wt, loss));
  ExpectGradClose("layernorm", "bias", dbs, NumericGrad(bs, loss));
  // float forward vs double
  auto fi = ToFloat(inp), fw = ToFloat(wt), fb = ToFloat(bs);
  std::vector<float> fo(N * C), fm(N), fr(N);
  LayerNormForward<float>(fo.data(), fm.data(), fr.data(), fi.data(), fw.data(), fb.data(), N, C,
                          nullptr);
  loss();
  ExpectFloatClose("layernorm", fo, out);
}

TEST(LayersTest, Matmul) {
  // ld_out > OC exercises the padded-logits path.
  const int N = 5, C = 7, OC = 6, ld = 8;
  std::mt19937_64 rng(3);
  Vec inp = RandomVec(N * C, rng), wt = RandomVec(OC * C, rng), bs = RandomVec(OC, rng);
  Vec w = RandomVec(N * ld, rng), out(N * ld);
  for (int r = 0; r < N; ++r)
    for (int j = OC; j < ld; ++j) w[r * ld + j] = 0;  // padding is not output
  auto loss = [&] {
    MatmulForward<double>(out.data(), inp.data(), wt.data(), bs.data(), N, C, OC, ld, nullptr);
    return Dot(out, w);
  };
  Vec dinp(inp.size()), dwt(wt.size()), dbs(OC);
  MatmulBackward<double>(dinp.data(), dwt.data(), dbs.data(), w.data(), ld, inp.data(), wt.data(),
                         N, C, OC, nullptr);
  ExpectGradClose("matmul", "inp", dinp, NumericGrad(inp, loss));
  ExpectGradClose("matmul", "weight", dwt, NumericGrad(wt, loss));
  ExpectGradClose("matmul", "bias", dbs, NumericGrad(bs, loss));
}

TEST(LayersTest, MatmulThreadedMatchesSerial) {
  // Sizes large enough to take the threaded split on both axes.
  ThreadPool pool(2);
  for (auto [N, C, OC] : {std::tuple{64, 96, 200}, std::tuple{200, 96, 64}}) {
    std::mt19937_64 rng(4);
    Vec inp = RandomVec(N * C, rng), wt = RandomVec(OC * C, rng), bs = RandomVec(OC, rng);
    Vec o1(N * OC), o2(N * OC);
    MatmulForward<double>(o1.data(), inp.data(), wt.data(), bs.data(), N, C, OC, OC, nullptr);
    MatmulForward<double>(o2.data(), inp.data(), wt.data(), bs.data(), N, C, OC, OC, &pool);
    EXPECT_LT(MaxRelDiff(o2, o1), 1e-14);
    Vec dout = RandomVec(N * OC, rng);
    Vec di1(N * C), dw1(OC * C), db1(OC), di2(N * C), dw2(OC * C), db2(OC);
    MatmulBackward<double>(di1.data(), dw1.data(), db1.data(), dout.data(), OC, inp.data(),
                           wt.data(), N, C, OC, nullptr);
    MatmulBackward<double>(di2.data(), dw2.data(), db2.data(), dout.data(), OC, inp.data(),
                           wt.data(), N, C, OC, &pool);
    EXPECT_LT(MaxRelDiff(di2, di1), 1e-14);
    EXPECT_LT(MaxRelDiff(dw2, dw1), 1e-14);
    EXPECT_LT(MaxRelDiff(db2, db1), 1e-14);
  }
}

TEST(LayersTest, Attention) {
  const int B = 2, T = 4, C = 6, NH = 2;
  std::mt19937_64 rng(5);
  Vec qkv = RandomVec(B * T * 3 * C, rng), w = RandomVec(B * T * C, rng);
  Vec out(B * T * C), att(B * NH * T * T), scratch(B * NH * T * T);
  auto loss = [&] {
    AttentionForward<double>(out.data(), att.data(), qkv.data(), B, T, C, NH, nullptr);
    return Dot(out, w);
  };
  loss();
  Vec dqkv(qkv.size());
  AttentionBackward<double>(dqkv.data(), w.data(), qkv.data(), att.data(), scratch.data(), B, T, C,
                            NH, nullptr);
  ExpectGradClose("attention", "qkv", dqkv, NumericGrad(qkv, loss));
  ThreadPool pool(2);
  auto fq = ToFloat(qkv);
  std::vector<float> fo(out.size()), fa(att.size());
  AttentionForward<float>(fo.data(), fa.data(), fq.data(), B, T, C, NH, &pool);
  loss();
  ExpectFloatClose("attention", fo, out);
}

TEST(LayersTest, Gelu) {
  const int N = 40;
  std::mt19937_64 rng(6);
  Vec inp = RandomVec(N, rng, 3.0), w = RandomVec(N, rng), out(N);
  auto loss = [&] {
    GeluForward<double>(out.data(), inp.data(), N, nullptr);
    return Dot(out, w);
  };
  loss();
  Vec dinp(N);
  GeluBackward<double>(dinp.data(), inp.data(), w.data(), N, nullptr);
  ExpectGradClose("gelu", "inp", dinp, NumericGrad(inp, loss));
  // float (vectorised tanh) vs double, forward and backward
  auto fi = ToFloat(inp), fw = ToFloat(w);
  std::vector<float> fo(N), fd(N, 0.0f);
  GeluForward<float>(fo.data(), fi.data(), N, nullptr);
  GeluBackward<float>(fd.data(), fi.data(), fw.data(), N, nullptr);
  loss();
  ExpectFloatClose("gelu", fo, out);
  ExpectFloatClose("gelu backward", fd, dinp);
}

TEST(LayersTest, Residual) {
  const int N = 12;
  std::mt19937_64 rng(7);
  Vec a = RandomVec(N, rng), b = RandomVec(N, rng), w = RandomVec(N, rng), out(N);
  auto loss = [&] {
    ResidualForward<double>(out.data(), a.data(), b.data(), N, nullptr);
    return Dot(out, w);
  };
  Vec da(N), db(N);
  ResidualBackward<double>(da.data(), db.data(), w.data(), N, nullptr);
  ExpectGradClose("residual", "inp1", da, NumericGrad(a, loss));
  ExpectGradClose("residual", "inp2", db, NumericGrad(b, loss));
}

TEST(LayersTest, SoftmaxCrossEntropyFused) {
  const int N = 5, V = 11, Vp = 16;
  std::mt19937_64 rng(8);
  Vec logits = RandomVec(N * Vp, rng, 3.0);
  std::vector<int> tgt = {0, 10, 3, 3, 7};
  const double dloss = 0.37;
  Vec losses(N), lse(N);
  auto loss = [&] {
    CrossEntropyForward<double>(losses.data(), lse.data(), logits.data(), tgt.data(), N, V, Vp,
                                nullptr);
    double s = 0;
    for (double l : losses) s += l;
    return dloss * s;
  };
  loss();
  Vec dl = logits;
  CrossEntropyBackwardInPlace<double>(dl.data(), lse.data(), tgt.data(), dloss, N, V, Vp, nullptr);
  Vec numeric = NumericGrad(logits, loss);
  // Padded columns: never read (numeric grad 0) and never written.
  for (int r = 0; r < N; ++r)
    for (int j = V; j < Vp; ++j) {
      EXPECT_EQ(numeric[r * Vp + j], 0.0);
      EXPECT_EQ(dl[r * Vp + j], logits[r * Vp + j]);
      dl[r * Vp + j] = 0;
    }
  ExpectGradClose("softmax_ce", "logits", dl, numeric);
  auto fl = ToFloat(logits);
  std::vector<float> flosses(N), flse(N);
  CrossEntropyForward<float>(flosses.data(), flse.data(), fl.data(), tgt.data(), N, V, Vp, nullptr);
  loss();
  ExpectFloatClose("softmax_ce", flosses, losses);
}

}  // namespace
}  // namespace shardtrain::engine::cpu
