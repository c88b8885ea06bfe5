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

#include "common/model/slice.h"
#include "tests/unit/worker/engine/cpu/fd_test_util.h"

namespace shardtrain::engine::cpu {
namespace {

using Vec = std::vector<double>;

using namespace fd;  // NOLINT: the finite-difference helpers (fd_test_util.h)

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

// Multi-head (KVH == NH) and grouped-query attention: query heads sharing a
// key/value head add into its gradient.
void CheckAttention(const char* name, int NH, int KVH) {
  const int B = 2, T = 4, hs = 3, C = NH * hs, W = C + 2 * KVH * hs;
  std::mt19937_64 rng(5);
  Vec qkv = RandomVec(B * T * W, rng), w = RandomVec(B * T * C, rng);
  Vec out(B * T * C), att(B * NH * T * T), scratch(B * NH * T * T);
  auto loss = [&] {
    AttentionForward<double>(out.data(), att.data(), qkv.data(), B, T, C, NH, KVH, nullptr);
    return Dot(out, w);
  };
  loss();
  Vec dqkv(qkv.size());
  AttentionBackward<double>(dqkv.data(), w.data(), qkv.data(), att.data(), scratch.data(), B, T, C,
                            NH, KVH, nullptr);
  ExpectGradClose(name, "qkv", dqkv, NumericGrad(qkv, loss));
  ThreadPool pool(2);
  auto fq = ToFloat(qkv);
  std::vector<float> fo(out.size()), fa(att.size()), fs(scratch.size());
  AttentionForward<float>(fo.data(), fa.data(), fq.data(), B, T, C, NH, KVH, &pool);
  loss();
  ExpectFloatClose(name, fo, out);
  // The threaded backward (one thread per key/value head) equals the serial.
  std::vector<float> dq1(qkv.size()), dq2(qkv.size());
  auto fw = ToFloat(w);
  AttentionBackward<float>(dq1.data(), fw.data(), fq.data(), fa.data(), fs.data(), B, T, C, NH, KVH,
                           nullptr);
  AttentionBackward<float>(dq2.data(), fw.data(), fq.data(), fa.data(), fs.data(), B, T, C, NH, KVH,
                           &pool);
  EXPECT_EQ(dq1, dq2) << name;
}

TEST(LayersTest, Attention) { CheckAttention("attention", 2, 2); }
TEST(LayersTest, GroupedQueryAttention) {
  CheckAttention("attention gqa", 4, 2);
  CheckAttention("attention mqa", 4, 1);
}

// GQA equals multi-head attention over K and V copied to every head of
// their group (what Hugging Face's repeat_kv does).
TEST(LayersTest, GroupedQueryAttentionEqualsRepeatedKeysAndValues) {
  const int B = 2, T = 5, hs = 4, NH = 4, KVH = 2, C = NH * hs, KV = KVH * hs;
  std::mt19937_64 rng(15);
  const Vec qkv = RandomVec(B * T * (C + 2 * KV), rng);
  Vec full(B * T * 3 * C);
  for (int r = 0; r < B * T; ++r) {
    const double* src = qkv.data() + r * (C + 2 * KV);
    double* dst = full.data() + r * 3 * C;
    std::copy(src, src + C, dst);
    for (int h = 0; h < NH; ++h) {
      const int j = h / (NH / KVH);
      std::copy(src + C + j * hs, src + C + (j + 1) * hs, dst + C + h * hs);
      std::copy(src + C + KV + j * hs, src + C + KV + (j + 1) * hs, dst + 2 * C + h * hs);
    }
  }
  Vec o1(B * T * C), o2(B * T * C), a1(B * NH * T * T), a2(B * NH * T * T);
  AttentionForward<double>(o1.data(), a1.data(), qkv.data(), B, T, C, NH, KVH, nullptr);
  AttentionForward<double>(o2.data(), a2.data(), full.data(), B, T, C, NH, NH, nullptr);
  EXPECT_LT(MaxRelDiff(o1, o2), 1e-14);
}

// Context parallelism's attention by blocks: cp simulated ranks, each with
// its two chunks of the sequence (model::ContextChunkPositions), attend
// their queries to every rank's key/value block in ring order (own block
// first) and merge by logsumexp; backward adds each block's share into the
// owner's key/value gradient. Equals whole-sequence attention, forward and
// backward, for multi-head and grouped-query attention.
void CheckRingAttention(const char* name, int NH, int KVH, int cp) {
  const int B = 2, T = 4 * cp, hs = 3, C = NH * hs, KV = KVH * hs, W = C + 2 * KV;
  const int Tl = T / cp;
  std::mt19937_64 rng(21);
  const Vec qkv = RandomVec(B * T * W, rng), dout = RandomVec(B * T * C, rng);
  Vec out(B * T * C), att(B * NH * T * T), scratch(B * NH * T * T), dqkv(qkv.size());
  AttentionForward<double>(out.data(), att.data(), qkv.data(), B, T, C, NH, KVH, nullptr);
  AttentionBackward<double>(dqkv.data(), dout.data(), qkv.data(), att.data(), scratch.data(), B, T,
                            C, NH, KVH, nullptr);
  // Each rank's rows of a (B, T, width) tensor, in its column order.
  std::vector<std::vector<int>> pos(cp);
  for (int r = 0; r < cp; ++r) pos[r] = model::ContextChunkPositions(T, cp, r);
  auto local = [&](const Vec& whole, int r, int width) {
    Vec v(size_t(B) * Tl * width);
    for (int b = 0; b < B; ++b) {
      for (int i = 0; i < Tl; ++i) {
        std::copy_n(whole.data() + (size_t(b) * T + pos[r][i]) * width, width,
                    v.data() + (size_t(b) * Tl + i) * width);
      }
    }
    return v;
  };
  std::vector<Vec> q(cp), kv(cp), o(cp), lse(cp), d(cp), dq(cp), dkv(cp);
  for (int r = 0; r < cp; ++r) {
    q[r] = local(qkv, r, W);
    kv[r].resize(size_t(B) * Tl * 2 * KV);
    CopyKv<double>(kv[r].data(), q[r].data(), B, Tl, C, KV, nullptr);
    o[r].resize(size_t(B) * Tl * C);
    lse[r].resize(size_t(B) * NH * Tl);
    d[r] = local(dout, r, C);
    dq[r].assign(q[r].size(), 0.0);
    dkv[r].assign(kv[r].size(), 0.0);
  }
  Vec blk_out(size_t(B) * Tl * C), blk_lse(size_t(B) * NH * Tl), s1(size_t(B) * NH * Tl * Tl),
      s2(s1.size()), D(blk_lse.size());
  double fwd = 0, bwd = 0;
  for (int r = 0; r < cp; ++r) {
    for (int step = 0; step < cp; ++step) {  // ring order: (r - step) mod cp
      const int src = (r - step + cp) % cp;
      AttentionBlockForward<double>(o[r].data(), lse[r].data(), blk_out.data(), blk_lse.data(),
                                    q[r].data(), kv[src].data(), pos[r].data(), pos[src].data(), B,
                                    Tl, Tl, C, NH, KVH, step == 0, s1.data(), nullptr);
    }
    fwd = std::max(fwd, MaxRelDiff(o[r], local(out, r, C)));
    AttentionRowDot<double>(D.data(), d[r].data(), o[r].data(), B, Tl, C, NH, nullptr);
    for (int step = 0; step < cp; ++step) {
      const int src = (r - step + cp) % cp;
      AttentionBlockBackward<double>(dq[r].data(), dkv[src].data(), d[r].data(), q[r].data(),
                                     kv[src].data(), lse[r].data(), D.data(), pos[r].data(),
                                     pos[src].data(), B, Tl, Tl, C, NH, KVH, s1.data(), s2.data(),
                                     nullptr);
    }
  }
  for (int r = 0; r < cp; ++r) {
    AddKvGrad<double>(dq[r].data(), dkv[r].data(), B, Tl, C, KV, nullptr);
    bwd = std::max(bwd, MaxRelDiff(dq[r], local(dqkv, r, W)));
  }
  std::printf("[ring] %-14s cp %d: out max rel diff %.3e, dqkv %.3e vs whole-sequence attention\n",
              name, cp, fwd, bwd);
  EXPECT_LT(fwd, 1e-12) << name;
  EXPECT_LT(bwd, 1e-12) << name;
}

TEST(LayersTest, RingAttentionByBlocksEqualsWholeSequence) {
  CheckRingAttention("attention", 2, 2, 2);
  CheckRingAttention("attention", 2, 2, 4);
  CheckRingAttention("attention gqa", 4, 2, 3);
  CheckRingAttention("attention mqa", 4, 1, 2);
}

// Positions given explicitly: the encoder's learned positions and rotary
// read pos[t] for column t.
TEST(LayersTest, EncoderAndRotaryReadExplicitPositions) {
  const int B = 2, T = 4, C = 4, V = 5, heads = 2, hs = 2, ld = heads * hs;
  const std::vector<int> pos = {6, 1, 3, 0};
  std::mt19937_64 rng(8);
  const Vec wte = RandomVec(V * C, rng), wpe = RandomVec(8 * C, rng);
  const std::vector<int> inp = {1, 4, 0, 2, 3, 3, 1, 0};
  Vec out(B * T * C);
  EncoderForward<double>(out.data(), inp.data(), wte.data(), wpe.data(), B, T, C, nullptr,
                         pos.data());
  for (int r = 0; r < B * T; ++r) {
    for (int c = 0; c < C; ++c) {
      EXPECT_EQ(out[r * C + c], wte[inp[r] * C + c] + wpe[pos[r % T] * C + c]);
    }
  }
  Vec dwte(V * C), dwpe(8 * C);
  EncoderBackward<double>(dwte.data(), dwpe.data(), out.data(), inp.data(), B, T, C, pos.data());
  EXPECT_EQ(dwpe[2 * C], 0.0);  // position 2 is no column's
  EXPECT_EQ(dwpe[6 * C], out[0] + out[T * C]);
  // Rotary at explicit positions equals rotary of a sequence where the row
  // sits at that position.
  std::vector<float> table(8 * hs);  // (context 8, hs/2 = 1, [cos, sin])
  for (int p = 0; p < 8; ++p) {
    table[2 * p] = std::cos(0.3f * p);
    table[2 * p + 1] = std::sin(0.3f * p);
  }
  const Vec x = RandomVec(B * T * ld, rng);
  Vec a = x;
  RotaryForward<double>(a.data(), table.data(), B, T, heads, hs, ld, false, nullptr, pos.data());
  for (int r = 0; r < B * T; ++r) {
    Vec whole(8 * ld);
    std::copy_n(x.data() + r * ld, ld, whole.data() + pos[r % T] * ld);
    RotaryForward<double>(whole.data(), table.data(), 1, 8, heads, hs, ld, false, nullptr);
    for (int c = 0; c < ld; ++c) EXPECT_EQ(a[r * ld + c], whole[pos[r % T] * ld + c]);
  }
}

TEST(LayersTest, RmsNorm) {
  const int N = 6, C = 9;
  std::mt19937_64 rng(12);
  Vec inp = RandomVec(N * C, rng, 2.0), wt = RandomVec(C, rng);
  Vec w = RandomVec(N * C, rng), out(N * C), rstd(N);
  auto loss = [&] {
    RmsNormForward<double>(out.data(), rstd.data(), inp.data(), wt.data(), 1e-5, N, C, nullptr);
    return Dot(out, w);
  };
  loss();
  Vec dinp(inp.size()), dwt(C);
  RmsNormBackward<double>(dinp.data(), dwt.data(), w.data(), inp.data(), wt.data(), rstd.data(), N,
                          C, nullptr);
  ExpectGradClose("rmsnorm", "inp", dinp, NumericGrad(inp, loss));
  ExpectGradClose("rmsnorm", "weight", dwt, NumericGrad(wt, loss));
  // torch.nn.RMSNorm: x / sqrt(mean(x²) + eps) · w, row 0 by hand.
  double ss = 0;
  for (int c = 0; c < C; ++c) ss += inp[c] * inp[c];
  EXPECT_NEAR(out[3], inp[3] / std::sqrt(ss / C + 1e-5) * wt[3], 1e-12);
  auto fi = ToFloat(inp), fw = ToFloat(wt);
  std::vector<float> fo(N * C), fr(N);
  RmsNormForward<float>(fo.data(), fr.data(), fi.data(), fw.data(), 1e-5f, N, C, nullptr);
  loss();  // out again at the unperturbed inputs
  ExpectFloatClose("rmsnorm", fo, out);
}

// Qwen3's q/k norms: rows of ld 14 = 3 heads of hs 4 from column 1 (and
// one column before, one after, left alone), the saved values in a buffer
// of ld_stat 4 heads from head 1: the finite differences of the in-place
// normalisation, and each head equal to RmsNormForward on its own.
TEST(LayersTest, HeadRmsNorm) {
  const int N = 5, hs = 4, heads = 3, ld = 14, col = 1, ld_stat = 4, first = 1;
  std::mt19937_64 rng(21);
  Vec x = RandomVec(N * ld, rng, 2.0), wt = RandomVec(hs, rng), w = RandomVec(N * ld, rng);
  Vec pre(N * ld_stat * hs), rstd(N * ld_stat), y;
  auto loss = [&] {
    y = x;
    HeadRmsNormForward<double>(y.data() + col, ld, pre.data() + first * hs, rstd.data() + first,
                               ld_stat, wt.data(), 1e-6, N, heads, hs, nullptr);
    return Dot(y, w);
  };
  loss();
  for (int r = 0; r < N; ++r) {
    EXPECT_EQ(y[r * ld], x[r * ld]);  // outside the heads: untouched
    EXPECT_EQ(y[r * ld + ld - 1], x[r * ld + ld - 1]);
    for (int h = 0; h < heads; ++h) {
      double out[hs], s = 0;
      RmsNormForward<double>(out, &s, x.data() + r * ld + col + h * hs, wt.data(), 1e-6, 1, hs,
                             nullptr);
      for (int c = 0; c < hs; ++c) EXPECT_NEAR(y[r * ld + col + h * hs + c], out[c], 1e-14);
      EXPECT_NEAR(rstd[r * ld_stat + first + h], s, 1e-14 * s);
    }
  }
  // Backward: dy is w where the heads are (the rest passes through as is).
  Vec dx = w, dwt(hs);
  HeadRmsNormBackward<double>(dx.data() + col, ld, dwt.data(), pre.data() + first * hs,
                              rstd.data() + first, ld_stat, wt.data(), N, heads, hs, nullptr);
  ExpectGradClose("head-rmsnorm", "x", dx, NumericGrad(x, loss));
  ExpectGradClose("head-rmsnorm", "weight", dwt, NumericGrad(wt, loss));
}

TEST(LayersTest, Rotary) {
  // 2 sequences of 3 positions, rows of 3 heads of hs 4 (2 rotated, as q
  // and k, then 1 more: v's, left alone) in rows of ld 12.
  const int B = 2, T = 3, hs = 4, heads = 2, ld = 12, context = 5;
  std::mt19937_64 rng(13);
  std::vector<float> table(context * hs / 2 * 2);
  for (int p = 0; p < context; ++p) {
    for (int i = 0; i < hs / 2; ++i) {
      const double a = p * std::pow(10000.0, -2.0 * i / hs);
      table[(p * hs / 2 + i) * 2] = static_cast<float>(std::cos(a));
      table[(p * hs / 2 + i) * 2 + 1] = static_cast<float>(std::sin(a));
    }
  }
  Vec x = RandomVec(B * T * ld, rng), w = RandomVec(B * T * ld, rng);
  const Vec x0 = x;
  auto loss = [&] {
    Vec y = x;
    RotaryForward<double>(y.data(), table.data(), B, T, heads, hs, ld, false, nullptr);
    return Dot(y, w);
  };
  // Backward: the inverse rotation of the output's gradient.
  Vec dx = w;
  RotaryForward<double>(dx.data(), table.data(), B, T, heads, hs, ld, true, nullptr);
  ExpectGradClose("rotary", "x", dx, NumericGrad(x, loss));
  // Position 0 is the identity, the third head untouched, a pair's norm
  // kept, and the inverse undoes the rotation.
  Vec y = x;
  RotaryForward<double>(y.data(), table.data(), B, T, heads, hs, ld, false, nullptr);
  for (int c = 0; c < ld; ++c) EXPECT_DOUBLE_EQ(y[c], x[c]) << c;
  for (int c = heads * hs; c < ld; ++c) EXPECT_DOUBLE_EQ(y[ld + c], x[ld + c]) << c;
  const double n0 = x[ld] * x[ld] + x[ld + 1] * x[ld + 1];
  EXPECT_NEAR(y[ld] * y[ld] + y[ld + 1] * y[ld + 1], n0, 1e-6 * n0);
  // (x0, x1) at position 1, pair 0 (angle 1 rad): x0 cos 1 - x1 sin 1.
  EXPECT_NEAR(y[ld], x[ld] * std::cos(1.0) - x[ld + 1] * std::sin(1.0), 1e-6);
  RotaryForward<double>(y.data(), table.data(), B, T, heads, hs, ld, true, nullptr);
  EXPECT_LT(MaxRelDiff(y, x0), 1e-6);
}

TEST(LayersTest, SwiGlu) {
  const int N = 5, H = 7;
  std::mt19937_64 rng(14);
  Vec inp = RandomVec(N * 2 * H, rng, 3.0), w = RandomVec(N * H, rng), out(N * H);
  auto loss = [&] {
    SwiGluForward<double>(out.data(), inp.data(), N, H, nullptr);
    return Dot(out, w);
  };
  loss();
  // silu(g) · u by hand for one element.
  const double g = inp[2 * H + 3], u = inp[2 * H + H + 3];
  EXPECT_NEAR(out[H + 3], g / (1 + std::exp(-g)) * u, 1e-12);
  Vec dinp(inp.size());
  SwiGluBackward<double>(dinp.data(), inp.data(), w.data(), N, H, nullptr);
  ExpectGradClose("swiglu", "inp", dinp, NumericGrad(inp, loss));
  auto fi = ToFloat(inp);
  std::vector<float> fo(out.size());
  SwiGluForward<float>(fo.data(), fi.data(), N, H, nullptr);
  loss();  // out again at the unperturbed inputs
  ExpectFloatClose("swiglu", fo, out);
}

TEST(LayersTest, EncoderWithoutPositions) {
  const int B = 2, T = 3, C = 4, V = 5;
  std::mt19937_64 rng(16);
  Vec wte = RandomVec(V * C, rng);
  std::vector<int> tok = {1, 4, 1, 0, 2, 3};
  Vec w = RandomVec(B * T * C, rng), out(B * T * C);
  auto loss = [&] {
    EncoderForward<double>(out.data(), tok.data(), wte.data(), nullptr, B, T, C, nullptr);
    return Dot(out, w);
  };
  loss();
  for (int c = 0; c < C; ++c) EXPECT_EQ(out[C + c], wte[4 * C + c]);
  Vec dwte(wte.size());
  EncoderBackward<double>(dwte.data(), nullptr, w.data(), tok.data(), B, T, C);
  ExpectGradClose("encoder nopos", "wte", dwte, NumericGrad(wte, loss));
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
