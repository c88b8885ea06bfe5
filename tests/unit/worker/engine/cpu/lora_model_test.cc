// LoRA adapters in the whole model (ModelEngine's block with the CPU
// engine's layers): the trained layout holds only the adapters, the frozen
// buffer is the plain model's own init bit for bit, an adapter with B = 0
// leaves the loss bit for bit, and with B != 0 the adapted model equals the
// plain model on the merged weights W + (alpha / rank)·B·A — its loss, and
// the adapters' gradients through the exact identities dB = s·G·A^T and
// dA = s·B^T·G, where G is the merged model's weight gradient.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "common/model/lora.h"
#include "common/model/weight_quant.h"
#include "worker/engine/cpu/cpu_model.h"
#include "worker/engine/cpu/layers.h"
#include "worker/engine/cpu/lora_layers.h"

namespace shardtrain::engine::cpu {
namespace {

using model::LoraTarget;
using model::ModelConfig;
using model::ParamLayout;

constexpr uint32_t kAll = (1u << model::kNumLoraTargets) - 1;

ModelConfig Family(bool llama, uint32_t targets) {
  ModelConfig c = llama ? *model::MakeLlamaConfig({2, 4, 2, 32, 48, 16, 100, 1e4, 1e-5, false})
                        : *model::MakeGptConfig(2, 4, 32, 16, 100);
  c.lora.rank = 3;
  c.lora.alpha = 6;
  c.lora.targets = llama ? targets : targets & ~(1u << model::kLoraGate);
  return c;
}

double MaxRel(const float* a, const float* b, size_t n) {
  double d = 0, s = 1e-30;
  for (size_t i = 0; i < n; ++i) {
    d = std::max(d, double(std::abs(a[i] - b[i])));
    s = std::max(s, double(std::abs(b[i])));
  }
  return d / s;
}

struct Batch {
  std::vector<int> tokens, targets;
};

// Every B adapter of `m` drawn from N(0, 0.05) (seed 5): adapters that do
// something.
void RandomB(CpuModel& m) {
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0.0f, 0.05f);
  float* ad = m.params().f32().data();
  for (const model::TensorInfo& t : model::TrainedTensors(m.layout())) {
    if (t.name.back() == 'B') {
      for (size_t i = 0; i < t.numel; ++i) ad[t.offset + i] = d(rng);
    }
  }
}

// The largest |logit of a - logit of b| over `rows` rows of the last
// forward, and the largest |logit of b| (*scale).
double MaxLogitDiff(const CpuModel& a, const CpuModel& b, int rows, int vocab, double* scale) {
  double diff = 0;
  *scale = 0;
  std::vector<float> x(vocab), y(vocab);
  for (int r = 0; r < rows; ++r) {
    a.ReadLogits(r, x.data());
    b.ReadLogits(r, y.data());
    for (int v = 0; v < vocab; ++v) {
      diff = std::max(diff, double(std::abs(x[v] - y[v])));
      *scale = std::max(*scale, double(std::abs(y[v])));
    }
  }
  return diff;
}
Batch MakeBatch(int B, int T) {
  Batch b;
  std::mt19937 rng(3);
  for (int i = 0; i < B * T; ++i) {
    b.tokens.push_back(int(rng() % 100));
    b.targets.push_back(int(rng() % 100));
  }
  return b;
}

TEST(LoraModelTest, LayoutHoldsTheAdaptersAndTheFrozenBufferIsThePlainModels) {
  for (bool llama : {false, true}) {
    const ModelConfig c = Family(llama, kAll);
    const ParamLayout lora(c), base(model::BaseConfig(c));
    EXPECT_EQ(lora.num_params(), size_t(model::LoraParams(c)));
    EXPECT_EQ(lora.num_frozen(), base.num_params());
    EXPECT_EQ(lora.global_num_params(), lora.num_params());
    // Every frozen tensor keeps its name and its offset in the plain layout.
    int frozen = 0;
    for (const model::TensorInfo& t : lora.tensors()) {
      if (!t.frozen) continue;
      const int k = *base.FindTensor(t.name);
      EXPECT_EQ(t.offset, base.tensors()[k].offset) << t.name;
      ++frozen;
    }
    EXPECT_EQ(frozen, int(base.tensors().size()));
    EXPECT_EQ(model::TrainedTensors(lora).size(), lora.tensors().size() - frozen);
    const int A = lora.lora_tensor(1, model::kLoraUp, false);
    ASSERT_GE(A, 0);
    EXPECT_EQ(lora.tensors()[A].name, "block.1.lora.up.A");
    EXPECT_EQ(lora.tensors()[A + 1].shape, (std::vector<int64_t>{c.ffn_dim, 3}));
    EXPECT_EQ(lora.units()[0].numel, 0u);  // the embeddings: no adapters
    ModelConfig other = c;
    other.lora.rank = 2;
    EXPECT_NE(ParamLayout(other).Fingerprint(), lora.Fingerprint());
  }
}

void CheckFamily(bool llama) {
  const char* name = llama ? "llama" : "gpt2";
  const ModelConfig c = Family(llama, kAll);
  const int B = 2, T = 8;
  const Batch batch = MakeBatch(B, T);
  auto plain = CpuModel::Create(model::BaseConfig(c), B, T, 2);
  auto adapted = CpuModel::Create(c, B, T, 2);
  ASSERT_TRUE(plain.ok() && adapted.ok()) << plain.status() << adapted.status();
  (*plain)->InitParams(11);
  (*adapted)->InitParams(11);
  ASSERT_TRUE((*adapted)->has_frozen());
  std::vector<float> frozen((*adapted)->frozen_layout().num_params()), held(frozen.size());
  (*adapted)->InitFrozenInto(11, 0, frozen.size(), frozen.data());
  (*adapted)->SetFrozen(frozen.data());
  (*adapted)->GetFrozen(held.data());
  const absl::Span<const float> p = (*plain)->params().f32();
  ASSERT_EQ(frozen.size(), p.size());
  EXPECT_TRUE(std::equal(p.begin(), p.end(), frozen.begin())) << name;
  EXPECT_EQ(held, frozen) << name << ": fp32 holds the model as given";
  // B = 0: the same loss, bit for bit.
  const float l0 = (*plain)->Forward(batch.tokens.data(), batch.targets.data());
  const float l1 = (*adapted)->Forward(batch.tokens.data(), batch.targets.data());
  EXPECT_EQ(l0, l1) << name;
  // Random B: the adapted model against the merged one.
  const ParamLayout& lay = (*adapted)->layout();
  float* ad = (*adapted)->params().f32().data();
  RandomB(**adapted);
  std::vector<float> merged(p.begin(), p.end());
  MergeLora(lay, ad, merged.data(), nullptr);
  std::copy(merged.begin(), merged.end(), (*plain)->params().f32().data());
  const float lm = (*plain)->Forward(batch.tokens.data(), batch.targets.data());
  const float la = (*adapted)->Forward(batch.tokens.data(), batch.targets.data());
  // Every logit of the merged model (what export writes and model.init
  // reads back) is the adapted model's.
  double logit_scale = 0;
  const double logit_diff = MaxLogitDiff(**adapted, **plain, B * T, c.vocab, &logit_scale);
  std::printf(
      "[lora] %s: loss adapted %.7f, merged %.7f (base %.7f); logits max abs diff %.2e "
      "(largest %.3g)\n",
      name, la, lm, l0, logit_diff, logit_scale);
  EXPECT_LE(logit_diff, 1e-6 * std::max(1.0, logit_scale)) << name;
  EXPECT_LT(std::abs(la - lm) / std::abs(lm), 1e-5) << name;
  EXPECT_GT(std::abs(la - l0), 1e-4) << name << ": the adapters changed nothing";
  (*plain)->ZeroGrad();
  (*adapted)->ZeroGrad();
  (*plain)->Backward();
  (*adapted)->Backward();
  // dB = s·G·A^T, dA = s·B^T·G of each target's rows of G.
  const ParamLayout& pl = (*plain)->layout();
  const float* G = (*plain)->grads().f32().data();
  const float* dad = (*adapted)->grads().f32().data();
  const float s = float(c.lora.scale());
  const int r = c.lora.rank;
  double worst = 0;
  for (int l = 0; l < c.layers; ++l) {
    for (int ti = 0; ti < model::kNumLoraTargets; ++ti) {
      const auto t = LoraTarget(ti);
      const int A = lay.lora_tensor(l, t, false);
      if (A < 0) continue;
      const model::LoraSite site = model::LoraTargetSite(c, t);
      const int in = int(site.in), out = int(site.out);
      const float* g =
          G + pl.offset(pl.block_tensor(l, model::LoraTargetTensor(t))) + site.first_col * site.in;
      std::vector<float> dA(size_t(r) * in), dB(size_t(out) * r);
      // dB (out, r) = s · g (out, in) · A^T (in, r); dA (r, in) = s · B^T (r, out) · g
      Gemm<float>(false, true, out, r, in, s, g, in, ad + lay.offset(A), in, 0.0f, dB.data(), r,
                  nullptr);
      Gemm<float>(true, false, r, in, out, s, ad + lay.offset(A + 1), r, g, in, 0.0f, dA.data(), in,
                  nullptr);
      const double ea = MaxRel(dad + lay.offset(A), dA.data(), dA.size());
      const double eb = MaxRel(dad + lay.offset(A + 1), dB.data(), dB.size());
      EXPECT_LT(ea, 1e-4) << name << " layer " << l << " " << model::LoraTargetName(t) << " A";
      EXPECT_LT(eb, 1e-4) << name << " layer " << l << " " << model::LoraTargetName(t) << " B";
      worst = std::max({worst, ea, eb});
    }
  }
  std::printf(
      "[lora] %s: adapters' gradients vs s·G·A^T, s·B^T·G of the merged model: max rel "
      "diff %.2e\n",
      name, worst);
}

TEST(LoraModelTest, ZeroBIsThePlainModelAndTheAdaptedModelIsTheMergedOne) {
  CheckFamily(false);
  CheckFamily(true);
}

// A frozen model in int8 or NF4 (finetune.base_dtype): the engine equals an
// fp32-based one holding the same weights dequantized — logits and the
// adapters' gradients — while holding FrozenModelBytes, and what it holds
// is the model within the format's error.
TEST(LoraModelTest, AQuantizedBaseIsItsDequantizedModel) {
  const int B = 2, T = 8;
  const Batch batch = MakeBatch(B, T);
  struct Case {
    const char* name;
    model::FrozenQuant quant;
    bool double_quant;
    double max_rel_l2;  // what the format's rounding allows of the weights
  };
  for (const Case& k : {Case{"int8", model::FrozenQuant::kInt8, false, 0.01},
                        Case{"nf4", model::FrozenQuant::kNf4, false, 0.15},
                        Case{"nf4 dq", model::FrozenQuant::kNf4, true, 0.15}}) {
    for (bool llama : {false, true}) {
      const ModelConfig c = Family(llama, kAll);
      ModelEngineOptions qo;
      qo.frozen.quant = k.quant;
      qo.frozen.double_quant = k.double_quant;
      auto q = CpuModel::Create(c, B, T, 2, qo);
      auto f = CpuModel::Create(c, B, T, 2);
      ASSERT_TRUE(q.ok() && f.ok()) << q.status() << f.status();
      const ParamLayout& base = (*q)->frozen_layout();
      std::vector<float> w(base.num_params()), held(w.size());
      (*q)->InitFrozenInto(11, 0, w.size(), w.data());
      (*q)->SetFrozen(w.data());
      (*q)->GetFrozen(held.data());
      (*f)->SetFrozen(held.data());
      // The quantized tensors hold the weights within the format's error.
      double err = 0, norm = 0;
      int quantized = 0;
      for (int i = 0; i < int(base.tensors().size()); ++i) {
        if (!model::QuantizedFrozenTensor(base, i, k.quant)) continue;
        ++quantized;
        const model::TensorInfo& t = base.tensors()[i];
        for (size_t e = t.offset; e < t.offset + t.numel; ++e) {
          err += double(held[e] - w[e]) * (held[e] - w[e]);
          norm += double(w[e]) * w[e];
        }
      }
      EXPECT_EQ(quantized, 4 * c.layers);
      EXPECT_GT(err, 0.0);
      EXPECT_LT(std::sqrt(err / norm), k.max_rel_l2) << k.name;
      model::FrozenFormat fmt = qo.frozen;
      EXPECT_EQ((*q)->frozen_bytes(), model::FrozenModelBytes(base, fmt)) << k.name;
      // The same adapters, B not zero.
      (*q)->InitParams(11);
      RandomB(**q);
      const float* ad = (*q)->params().f32().data();
      std::copy(ad, ad + (*q)->layout().num_params(), (*f)->params().f32().data());
      const float lq = (*q)->Forward(batch.tokens.data(), batch.targets.data());
      const float lf = (*f)->Forward(batch.tokens.data(), batch.targets.data());
      double logit_scale = 0;
      const double logit_diff = MaxLogitDiff(**q, **f, B * T, c.vocab, &logit_scale);
      (*q)->ZeroGrad();
      (*f)->ZeroGrad();
      (*q)->Backward();
      (*f)->Backward();
      const size_t n = (*q)->layout().num_params();
      const double grad_diff = MaxRel((*q)->grads().f32().data(), (*f)->grads().f32().data(), n);
      std::printf(
          "[qlora] %-6s %-5s: loss %.7f vs dequantized fp32 base %.7f; logits max abs diff %.2e "
          "(largest %.3g); adapters' gradients max rel diff %.2e; weights rel L2 error %.4f; "
          "frozen %lld bytes (fp32 %lld)\n",
          k.name, llama ? "llama" : "gpt2", lq, lf, logit_diff, logit_scale, grad_diff,
          std::sqrt(err / norm), static_cast<long long>((*q)->frozen_bytes()),
          static_cast<long long>((*f)->frozen_bytes()));
      EXPECT_LE(logit_diff, 1e-6 * std::max(1.0, logit_scale)) << k.name;
      EXPECT_LT(grad_diff, 1e-5) << k.name;
      EXPECT_LT((*q)->frozen_bytes(), (*f)->frozen_bytes());
    }
  }
}

}  // namespace
}  // namespace shardtrain::engine::cpu
