// The CPU engine on a slice of the model equals the whole model: tensor
// parallel ranks (over Gloo, one thread each) and pipeline stages give the
// whole model's initial parameters, loss and gradients, element by element
// through ParamLayout::GlobalRuns.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <mutex>
#include <random>
#include <vector>

#include "tests/unit/worker/comm/test_util.h"
#include "worker/engine/cpu/cpu_model.h"
#include "worker/parallel/tensor_parallel_group.h"

namespace shardtrain::engine::cpu {
namespace {

using model::FlatRun;
using model::ModelConfig;
using model::ModelSlice;

constexpr int kB = 2, kT = 8;
constexpr uint64_t kSeed = 5;

ModelConfig Config() {
  // vocab 100 pads to 128: with tp 4 the last rank has 4 real rows of 32.
  auto c = model::MakeGptConfig(2, 4, 32, 16, 100);
  EXPECT_TRUE(c.ok());
  return *c;
}

struct Batch {
  std::vector<int> tokens, targets;
};
Batch MakeBatch(int seed) {
  std::mt19937 rng(seed);
  Batch b;
  for (int i = 0; i < kB * kT; ++i) {
    b.tokens.push_back(static_cast<int>(rng() % 100));
    b.targets.push_back(static_cast<int>(rng() % 100));
  }
  return b;
}

// The whole model's loss and gradients over `batches` (accumulated).
struct Reference {
  float loss = 0;
  std::vector<float> params, grads;
};
Reference Whole(const std::vector<Batch>& batches, const ModelConfig& config = Config()) {
  auto gpt = CpuModel::Create(config, kB, kT, 1);
  EXPECT_TRUE(gpt.ok());
  (*gpt)->InitParams(kSeed);
  (*gpt)->ZeroGrad();
  Reference r;
  for (const Batch& b : batches) {
    r.loss += (*gpt)->Forward(b.tokens.data(), b.targets.data());
    (*gpt)->Backward();
  }
  r.params.assign((*gpt)->params().f32().begin(), (*gpt)->params().f32().end());
  r.grads.assign((*gpt)->grads().f32().begin(), (*gpt)->grads().f32().end());
  return r;
}

// Adds (or, for params, compares) a slice's elements into global arrays.
void ExpectParamsMatch(CpuModel& g, const std::vector<float>& whole) {
  const float* p = g.params().f32().data();
  for (const FlatRun& r : g.layout().GlobalRuns()) {
    for (size_t i = 0; i < r.count; ++i) {
      ASSERT_EQ(p[r.local + i], whole[r.global + i]) << "global element " << r.global + i;
    }
  }
}

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  float scale = 0;
  for (float w : want) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 2e-5f * scale + 1e-7f) << "global element " << i;
  }
}

class TensorParallelTest : public ::testing::TestWithParam<int> {};

TEST_P(TensorParallelTest, SlicesEqualTheWholeModel) {
  const int tp = GetParam();
  const Batch batch = MakeBatch(1);
  const Reference ref = Whole({batch});
  std::mutex mu;
  std::vector<float> grads(ref.grads.size(), 0.0f);
  std::vector<int> covered(ref.grads.size(), 0);
  comm::testing::RunRanks(tp, [&](comm::Communicator& comm) {
    parallel::TensorParallelGroup group(&comm);
    ModelEngineOptions o;
    o.slice.tp = tp;
    o.slice.tp_rank = comm.rank();
    o.tp = &group;
    auto g = CpuModel::Create(Config(), kB, kT, 1, o);
    ASSERT_TRUE(g.ok()) << g.status();
    (*g)->InitParams(kSeed);
    ExpectParamsMatch(**g, ref.params);
    (*g)->ZeroGrad();
    const float loss = (*g)->Forward(batch.tokens.data(), batch.targets.data());
    EXPECT_NEAR(loss, ref.loss, 1e-5 * ref.loss);
    (*g)->Backward();
    ASSERT_TRUE(group.status().ok()) << group.status();
    std::lock_guard<std::mutex> lock(mu);
    const float* gr = (*g)->grads().f32().data();
    for (const FlatRun& r : (*g)->layout().GlobalRuns()) {
      for (size_t i = 0; i < r.count; ++i) {
        // Replicated tensors: every rank computed the same gradient.
        if (covered[r.global + i]++ == 0) {
          grads[r.global + i] = gr[r.local + i];
        } else {
          ASSERT_EQ(grads[r.global + i], gr[r.local + i]) << "replica differs at " << r.global + i;
        }
      }
    }
  });
  for (size_t i = 0; i < covered.size(); ++i) ASSERT_GT(covered[i], 0) << "element " << i;
  ExpectClose(grads, ref.grads);
}

INSTANTIATE_TEST_SUITE_P(Tp, TensorParallelTest, ::testing::Values(2, 4));

// Qwen3's recipe (heads of 16 on a width of 32; q/k norms) on tp slices:
// each rank's q/k norm gradient covers its own heads only, so the ranges
// ParamLayout::TpPartialRanges names sum over the ranks to the whole
// model's gradient (the trainer sums them over the tp group); every other
// replicated tensor is the same on every rank.
TEST_P(TensorParallelTest, QkNormGradientsAreTheSlicesPartialSums) {
  const int tp = GetParam();
  const ModelConfig config =
      *model::MakeLlamaConfig({2, 4, 4, 32, 48, 16, 100, 1e4, 1e-6, false, {}, 16, true});
  const Batch batch = MakeBatch(2);
  const Reference ref = Whole({batch}, config);
  std::mutex mu;
  std::vector<float> grads(ref.grads.size(), 0.0f);
  std::vector<int> covered(ref.grads.size(), 0);
  int partial_elements = 0;
  comm::testing::RunRanks(tp, [&](comm::Communicator& comm) {
    parallel::TensorParallelGroup group(&comm);
    ModelEngineOptions o;
    o.slice.tp = tp;
    o.slice.tp_rank = comm.rank();
    o.tp = &group;
    auto g = CpuModel::Create(config, kB, kT, 1, o);
    ASSERT_TRUE(g.ok()) << g.status();
    (*g)->InitParams(kSeed);
    (*g)->ZeroGrad();
    const float loss = (*g)->Forward(batch.tokens.data(), batch.targets.data());
    EXPECT_NEAR(loss, ref.loss, 1e-5 * ref.loss);
    (*g)->Backward();
    ASSERT_TRUE(group.status().ok()) << group.status();
    const auto partial = (*g)->layout().TpPartialRanges(/*sequence_parallel=*/false);
    auto is_partial = [&](size_t local) {
      for (const auto& [b, e] : partial) {
        if (local >= b && local < e) return true;
      }
      return false;
    };
    std::lock_guard<std::mutex> lock(mu);
    const float* gr = (*g)->grads().f32().data();
    for (const FlatRun& r : (*g)->layout().GlobalRuns()) {
      for (size_t i = 0; i < r.count; ++i) {
        const size_t at = r.global + i;
        if (is_partial(r.local + i)) {
          grads[at] += gr[r.local + i];
          covered[at]++;
          if (comm.rank() == 0) ++partial_elements;
        } else if (covered[at]++ == 0) {
          grads[at] = gr[r.local + i];
        } else {
          ASSERT_EQ(grads[at], gr[r.local + i]) << "replica differs at " << at;
        }
      }
    }
  });
  // The q and k norms of 2 layers, hs 16 each.
  EXPECT_EQ(partial_elements, 2 * 2 * 16);
  for (size_t i = 0; i < covered.size(); ++i) ASSERT_GT(covered[i], 0) << "element " << i;
  ExpectClose(grads, ref.grads);
}

TEST(PipelineStageTest, TwoStagesWithTwoSlotsEqualTheWholeModel) {
  const std::vector<Batch> batches = {MakeBatch(2), MakeBatch(3)};
  const Reference ref = Whole(batches);
  std::vector<std::unique_ptr<CpuModel>> stages;
  for (int s = 0; s < 2; ++s) {
    ModelEngineOptions o;
    o.slice.first_layer = s;
    o.slice.num_layers = 1;
    o.slice.first_stage = s == 0;
    o.slice.last_stage = s == 1;
    o.slots = 2;
    auto g = CpuModel::Create(Config(), kB, kT, 1, o);
    ASSERT_TRUE(g.ok()) << g.status();
    (*g)->InitParams(kSeed);
    ExpectParamsMatch(**g, ref.params);
    (*g)->ZeroGrad();
    stages.push_back(*std::move(g));
  }
  // GPipe order: both forwards, then both backwards.
  float loss = 0;
  for (int m = 0; m < 2; ++m) {
    EXPECT_EQ(stages[0]->StageForward(m, batches[m].tokens.data(), nullptr, nullptr, kB, kT), 0.0f);
    loss += stages[1]->StageForward(m, nullptr, batches[m].targets.data(),
                                    stages[0]->StageOutput(m), kB, kT);
  }
  EXPECT_NEAR(loss, ref.loss, 1e-6 * ref.loss);
  for (int m = 0; m < 2; ++m) {
    stages[1]->StageBackward(m, 1.0f, nullptr);
    stages[0]->StageBackward(m, 1.0f, stages[1]->InputGrad());
  }
  // The tied wte's gradient is the sum of the two stages'; the last stage's
  // wpe copy gets none.
  std::vector<float> grads(ref.grads.size(), 0.0f);
  for (auto& g : stages) {
    const float* gr = g->grads().f32().data();
    for (const FlatRun& r : g->layout().GlobalRuns()) {
      for (size_t i = 0; i < r.count; ++i) grads[r.global + i] += gr[r.local + i];
    }
  }
  ExpectClose(grads, ref.grads);
  const model::ParamLayout& last = stages[1]->layout();
  const float* wpe = stages[1]->grads().f32().data() + last.offset(last.wpe());
  EXPECT_TRUE(
      std::all_of(wpe, wpe + last.tensors()[last.wpe()].numel, [](float x) { return x == 0.0f; }));
}

TEST(GlobalRunsTest, TpSlicesPartitionTheWholeModel) {
  const ModelConfig cfg = Config();
  const model::ParamLayout whole(cfg);
  for (int tp : {1, 2, 4}) {
    std::vector<int> count(whole.num_params(), 0);
    for (int r = 0; r < tp; ++r) {
      ModelSlice s;
      s.tp = tp;
      s.tp_rank = r;
      const model::ParamLayout part(cfg, s);
      EXPECT_EQ(part.global_num_params(), whole.num_params());
      EXPECT_EQ(part.GlobalFingerprint(), whole.Fingerprint());
      size_t local = 0;
      for (const FlatRun& run : part.GlobalRuns()) {
        EXPECT_EQ(run.local, local) << "runs cover the slice in order";
        local += run.count;
        for (size_t i = 0; i < run.count; ++i) count[run.global + i]++;
      }
      EXPECT_EQ(local, part.num_params());
    }
    // Split tensors once, replicated ones tp times.
    for (const model::TensorInfo& t : whole.tensors()) {
      const bool split =
          t.name == "wte" || t.name.find("qkv") != std::string::npos ||
          (t.name.find("weight") != std::string::npos && t.shape.size() == 2 && t.name != "wpe") ||
          t.name.find("mlp.fc.bias") != std::string::npos;
      for (size_t i = 0; i < t.numel; ++i) {
        ASSERT_EQ(count[t.offset + i], split ? 1 : tp) << t.name << " tp " << tp;
      }
    }
  }
}

}  // namespace
}  // namespace shardtrain::engine::cpu
