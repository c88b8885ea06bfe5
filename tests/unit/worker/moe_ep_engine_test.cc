// Expert parallelism in the engine, on thread ranks over Gloo: each ep rank
// runs its own micro-batch, sends every (token, slot) pair to the rank of
// its expert and gets the outputs back. With the router's weights zero
// every score ties and every token picks the lowest experts (the tie rule):
// one expert takes every pair and the ranks holding the others receive no
// row at all (Megatron-LM#1877's crash). Each rank's loss equals the whole
// model's on its batch, and each expert's gradient, on the rank holding
// it, the whole model's over every rank's batch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <random>
#include <vector>

#include "tests/unit/worker/comm/test_util.h"
#include "worker/engine/cpu/cpu_model.h"
#include "worker/parallel/expert_parallel_group.h"

namespace shardtrain::worker {
namespace {

constexpr int kB = 2, kT = 8;

model::ModelConfig Config(int top_k) {
  model::LlamaShape shape{2, 4, 2, 32, 48, 16, 64, 10000, 1e-5, false};
  shape.moe = {/*experts=*/4, top_k, /*expert_ffn_dim=*/16};
  return *model::MakeLlamaConfig(shape);
}

std::vector<int> Tokens(int rank, int salt) {
  std::mt19937 rng(100 * rank + salt);
  std::vector<int> t(kB * kT);
  for (int& x : t) x = static_cast<int>(rng() % 64);
  return t;
}

// Zeroes every MoE layer's router weights (every score ties) when `tie`.
void Init(engine::cpu::CpuModel& m, bool tie) {
  m.InitParams(7);
  if (!tie) return;
  const model::ParamLayout& lay = m.layout();
  for (int i = 0; i < lay.num_layers(); ++i) {
    const model::TensorInfo& t = lay.tensors()[lay.block_tensor(lay.layer(i), model::kRouterW)];
    std::fill_n(m.params().f32().data() + t.offset, t.numel, 0.0f);
  }
}

void ExpectEpEqualsWhole(int ep, int top_k, bool tie) {
  const model::ModelConfig cfg = Config(top_k);
  // The whole model on every rank's batch in turn: the losses, and the
  // experts' gradients summed over the batches.
  auto whole = *engine::cpu::CpuModel::Create(cfg, kB, kT, 1);
  Init(*whole, tie);
  whole->ZeroGrad();
  std::vector<float> want_loss(ep);
  for (int r = 0; r < ep; ++r) {
    want_loss[r] = whole->Forward(Tokens(r, 1).data(), Tokens(r, 2).data());
    whole->Backward();
  }
  const engine::MoeStats whole_stats = whole->TakeMoeStats();
  std::mutex mu;
  comm::testing::RunRanks(ep, [&](comm::Communicator& comm) {
    parallel::ExpertParallelGroup group(&comm);
    engine::ModelEngineOptions o;
    o.slice.ep = ep;
    o.slice.ep_rank = comm.rank();
    o.ep = &group;
    auto m = engine::cpu::CpuModel::Create(cfg, kB, kT, 1, o);
    ASSERT_TRUE(m.ok()) << m.status();
    Init(**m, tie);
    (*m)->ZeroGrad();
    const float loss = (*m)->Forward(Tokens(comm.rank(), 1).data(), Tokens(comm.rank(), 2).data());
    (*m)->Backward();
    ASSERT_TRUE(group.status().ok()) << group.status();
    const model::ParamLayout& lay = (*m)->layout();
    const model::ParamLayout& all = whole->layout();
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_NEAR(loss, want_loss[comm.rank()], 1e-6 * std::abs(want_loss[comm.rank()]));
    double worst = 0, largest = 0;
    for (const model::TensorInfo& t : lay.tensors()) {
      if (t.name.find(".experts.") == std::string::npos) continue;
      const model::TensorInfo& w = all.tensors()[*all.FindTensor(t.name)];
      for (size_t i = 0; i < t.numel; ++i) {
        const double got = (*m)->grads().f32()[t.offset + i];
        const double ref = whole->grads().f32()[w.offset + i];
        worst = std::max(worst, std::abs(got - ref));
        largest = std::max(largest, std::abs(ref));
      }
    }
    std::printf(
        "ep %d rank %d (top %d%s): loss %.6f, experts' gradients max abs diff %.3g of "
        "%.3g\n",
        ep, comm.rank(), top_k, tie ? ", every score tied" : "", loss, worst, largest);
    EXPECT_LE(worst, 1e-6 * std::max(largest, 1e-3));
  });
  if (tie) {
    // The tie rule: every pair went to the lowest experts, none to the rest.
    for (const std::vector<int64_t>& load : whole_stats.load) {
      for (int e = 0; e < 4; ++e) EXPECT_EQ(load[e] > 0, e < top_k) << "expert " << e;
    }
  }
}

TEST(MoeEpEngineTest, EveryTokenToOneExpertAndRanksThatReceiveNothing) {
  ExpectEpEqualsWhole(/*ep=*/2, /*top_k=*/1, /*tie=*/true);  // rank 1's experts get no row
  ExpectEpEqualsWhole(/*ep=*/4, /*top_k=*/2, /*tie=*/true);  // ranks 1-3: only expert 1 on rank 1
}

TEST(MoeEpEngineTest, RandomRoutingOverFourRanks) {
  ExpectEpEqualsWhole(/*ep=*/4, /*top_k=*/2, /*tie=*/false);
}

}  // namespace
}  // namespace shardtrain::worker
