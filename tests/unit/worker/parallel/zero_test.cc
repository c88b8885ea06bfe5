// parallel::Zero (ZeRO-1/2/3 per unit) on a real GPT against a single-rank
// reference: dp ranks are threads, each with its own CpuModel and Gloo
// communicator over 127.0.0.1; the reference is one CpuModel running the whole
// global batch (all dp ranks' sequences at once), optim::ClipGradNorm and
// optim::AdamW over the whole buffer. Unit sizes leave a remainder over 3 and
// 4 ranks, so the tail ops run. Also: a stage-3 unit's gathered parameters
// are freed after use (live bytes, logical and measured with mincore).
#include "worker/parallel/zero.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/config.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/comm/test_util.h"
#include "worker/engine/cpu/cpu_model.h"
#include "worker/engine/cpu/page_buffer.h"
#include "worker/optim/adamw.h"

namespace shardtrain::parallel {
namespace {

constexpr int kSteps = 6;
constexpr int kB = 2, kT = 8;
constexpr float kMaxNorm = 1.0f;
constexpr uint64_t kSeed = 1234;

// L=2, NH=2, C=10, context 9, vocab 50 (Vp 64): units 730, 1330, 1330, 20
// elements; 730 and 1330 leave remainders over 3 and 4 ranks.
model::ModelConfig SmallConfig() {
  auto config = model::MakeGptConfig(2, 2, 10, 9, 50);
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

optim::AdamWOptions Options() {
  optim::AdamWOptions o;
  o.beta1 = 0.9f;
  o.beta2 = 0.95f;
  o.eps = 1e-8f;
  o.weight_decay = 0.1f;
  return o;
}

float Lr(int step) { return 3e-3f * static_cast<float>(1 + step % 3); }

// Token `i` of sequence `seq` of micro-batch `micro` of `step` (and its
// target, the next token).
int Token(int step, int micro, int seq, int i, int vocab) {
  uint64_t x = uint64_t(step) * 1000003u + uint64_t(micro) * 10007u + uint64_t(seq) * 101u + i;
  x ^= x >> 13;
  x *= 0x9E3779B97F4A7C15ull;
  return static_cast<int>((x >> 29) % uint64_t(vocab));
}

// Sequences [first, first + count) of (step, micro): tokens and targets.
void Batch(int step, int micro, int first, int count, int vocab, std::vector<int>* in,
           std::vector<int>* tgt) {
  in->resize(size_t(count) * kT);
  tgt->resize(in->size());
  for (int s = 0; s < count; ++s) {
    for (int i = 0; i < kT; ++i) {
      (*in)[size_t(s) * kT + i] = Token(step, micro, first + s, i, vocab);
      (*tgt)[size_t(s) * kT + i] = Token(step, micro, first + s, i + 1, vocab);
    }
  }
}

struct Trace {
  std::vector<double> losses;                     // per step
  std::vector<float> params;                      // final: whole (reference) or the shard
  std::vector<std::pair<size_t, size_t>> ranges;  // the shard's flat ranges (ranks)
  std::vector<double> norms;
};

Trace Reference(int dp, int accum) {
  auto gpt = engine::cpu::CpuModel::Create(SmallConfig(), dp * kB, kT, 1);
  EXPECT_TRUE(gpt.ok());
  engine::cpu::CpuModel& m = **gpt;
  m.InitParams(kSeed);
  auto adamw = optim::AdamW::Create(m.layout(), 0, m.layout().num_params(), Options());
  EXPECT_TRUE(adamw.ok());
  Trace run;
  std::vector<int> in, tgt;
  for (int step = 0; step < kSteps; ++step) {
    m.ZeroGrad();
    double loss = 0;
    for (int micro = 0; micro < accum; ++micro) {
      Batch(step, micro, 0, dp * kB, m.config().vocab, &in, &tgt);
      loss += m.Forward(in.data(), tgt.data());
      m.Backward(1.0f / accum);
    }
    run.losses.push_back(loss / accum);
    run.norms.push_back(optim::ClipGradNorm(m.grads().f32(), kMaxNorm, nullptr));
    adamw->Step(m.params().f32(), m.grads().f32(), Lr(step), nullptr);
  }
  run.params.assign(m.params().f32().begin(), m.params().f32().end());
  return run;
}

struct Variant {
  std::string name;
  int stage;
  bool reshard = true;
  bool offload = false;
  int accum = 2;
};

// Test names and ctest lines show the variant's name, not its bytes.
void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

// One rank: its share of every micro-batch through Zero.
void RankRun(comm::Communicator& comm, const Variant& v, Trace* run) {
  const int dp = comm.size(), rank = comm.rank();
  auto gpt = engine::cpu::CpuModel::Create(SmallConfig(), kB, kT, 1);
  ASSERT_TRUE(gpt.ok());
  engine::cpu::CpuModel& m = **gpt;
  ZeroOptions o;
  o.stage = v.stage;
  o.reshard_after_forward = v.reshard;
  o.offload_optimizer = v.offload;
  auto zero = Zero::Create(o, &m, Options(), &comm);
  ASSERT_TRUE(zero.ok()) << zero.status();
  Zero& z = **zero;
  z.InitParams(kSeed);
  std::vector<int> in, tgt;
  for (int step = 0; step < kSteps; ++step) {
    double loss = 0;
    for (int micro = 0; micro < v.accum; ++micro) {
      Batch(step, micro, rank * kB, kB, m.config().vocab, &in, &tgt);
      z.BeginMicroBatch(micro, v.accum);
      loss += m.Forward(in.data(), tgt.data());
      m.Backward(1.0f / v.accum);
      ASSERT_TRUE(z.EndMicroBatch().ok());
    }
    // The mean over ranks of each rank's mean loss is the global batch's.
    std::vector<float> all(dp);
    const float mine = static_cast<float>(loss / v.accum);
    ASSERT_TRUE(comm.AllGather(&mine, all.data(), 1, comm::DataType::kFloat32).ok());
    double sum = 0;
    for (float l : all) sum += l;
    run->losses.push_back(sum / dp);
    auto norm = z.Step(Lr(step), kMaxNorm);
    ASSERT_TRUE(norm.ok()) << norm.status();
    run->norms.push_back(norm->grad_norm);
  }
  run->params = z.SaveParams();
  run->ranges = z.SaveRanges();
  EXPECT_EQ(z.memory().optimizer_on_host, v.offload);
  if (v.stage < 3) {  // every rank holds the whole, identical model again
    std::vector<float> whole(m.params().f32().begin(), m.params().f32().end());
    ASSERT_TRUE(comm.Broadcast(whole.data(), whole.size(), comm::DataType::kFloat32, 0).ok());
    for (size_t i = 0; i < whole.size(); ++i) {
      ASSERT_EQ(whole[i], m.params().f32()[i]) << "rank " << rank << " element " << i;
    }
  }
}

class ZeroTest : public ::testing::TestWithParam<std::tuple<int, Variant>> {};

TEST_P(ZeroTest, MatchesOneRankOnTheWholeBatch) {
  const auto& [dp, v] = GetParam();
  const Trace ref = Reference(dp, v.accum);
  std::vector<Trace> runs(dp);
  comm::testing::RunRanks(dp,
                          [&](comm::Communicator& comm) { RankRun(comm, v, &runs[comm.rank()]); });
  if (HasFailure()) return;
  double worst_loss = 0, worst_param = 0;
  for (int step = 0; step < kSteps; ++step) {
    const double d = std::abs(runs[0].losses[step] - ref.losses[step]) / ref.losses[step];
    worst_loss = std::max(worst_loss, d);
    EXPECT_NEAR(runs[0].norms[step], ref.norms[step], 1e-5 * ref.norms[step]) << "step " << step;
  }
  // The shards tile the buffer in rank order within every unit.
  size_t covered = 0;
  for (int r = 0; r < dp; ++r) {
    size_t at = 0;
    for (auto [begin, end] : runs[r].ranges) {
      covered += end - begin;
      for (size_t i = begin; i < end; ++i, ++at) {
        worst_param = std::max(worst_param, double(std::abs(runs[r].params[at] - ref.params[i])));
      }
    }
    EXPECT_EQ(at, runs[r].params.size());
  }
  EXPECT_EQ(covered, ref.params.size());
  std::printf("%-14s dp %d: max rel loss diff %.3g, max abs param diff %.3g (%d steps)\n",
              v.name.c_str(), dp, worst_loss, worst_param, kSteps);
  EXPECT_LE(worst_loss, 1e-5);
  EXPECT_LE(worst_param, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(
    DpAndStage, ZeroTest,
    ::testing::Combine(::testing::Values(1, 2, 3, 4),
                       ::testing::Values(Variant{"zero1", 1}, Variant{"zero2", 2},
                                         Variant{"zero3", 3},
                                         Variant{"zero3_keep", 3, /*reshard=*/false},
                                         Variant{"zero3_offload", 3, true, /*offload=*/true},
                                         Variant{"zero3_accum1", 3, true, false, /*accum=*/1})),
    [](const ::testing::TestParamInfo<ZeroTest::ParamType>& info) {
      return absl::StrCat(std::get<1>(info.param).name, "_dp", std::get<0>(info.param));
    });

// Stage 3 keeps a unit's parameters only while it is used (and the next
// use's unit, prefetched): the peak of gathered elements is the largest sum
// of two consecutive uses' units, everything is freed after the backward,
// and the resident pages of the model's parameter buffer agree (to the
// partial pages at unit edges; no huge page straddles two units). Blocks of
// 12.6 MB, so that transparent huge pages are in play.
TEST(ZeroLiveBytesTest, Stage3FreesGatheredUnitsAfterUse) {
  auto config = model::MakeGptConfig(4, 4, 512, 64, 256);
  ASSERT_TRUE(config.ok());
  for (bool reshard : {true, false}) {
    comm::testing::RunRanks(2, [&](comm::Communicator& comm) {
      auto gpt = engine::cpu::CpuModel::Create(*config, 2, 16, 1);
      ASSERT_TRUE(gpt.ok());
      engine::cpu::CpuModel& m = **gpt;
      ZeroOptions o;
      o.stage = 3;
      o.reshard_after_forward = reshard;
      auto zero = Zero::Create(o, &m, Options(), &comm);
      ASSERT_TRUE(zero.ok()) << zero.status();
      Zero& z = **zero;
      z.set_measure(true);
      z.InitParams(kSeed);
      const size_t page = engine::cpu::PageBuffer::PageSize();
      const auto& units = m.layout().units();
      // Whole-unit pages plus the partial pages at unit edges.
      const int64_t edge_slack = int64_t(2 * units.size() * page);
      EXPECT_LE(m.param_buffer().ResidentBytes(), edge_slack) << "after init";
      EXPECT_LE(m.grad_buffer().ResidentBytes(), edge_slack) << "after init";
      // Uses: emb, block.0..3, final, emb | emb, final, block.3..0.
      const size_t emb = units[0].numel, blk = units[1].numel, fin = units.back().numel;
      const size_t expected_peak =
          reshard ? std::max({emb + blk, 2 * blk, blk + fin, fin + emb}) : m.layout().num_params();
      std::vector<int> in(32), tgt(32);
      for (int step = 0; step < 2; ++step) {
        for (int i = 0; i < 32; ++i) {
          in[i] = (step * 7 + i * 13 + comm.rank()) % 256;
          tgt[i] = (in[i] + 1) % 256;
        }
        z.BeginMicroBatch(0, 1);
        m.Forward(in.data(), tgt.data());
        m.Backward();
        ASSERT_TRUE(z.EndMicroBatch().ok());
        EXPECT_EQ(z.live_param_elems(), 0u) << "gathered params left after the backward";
        EXPECT_LE(m.param_buffer().ResidentBytes(), edge_slack);
        EXPECT_LE(m.grad_buffer().ResidentBytes(), edge_slack);
        ASSERT_TRUE(z.Step(1e-3f, 1.0f).ok());
      }
      EXPECT_EQ(z.peak_live_param_elems(), expected_peak);
      const ZeroMemory mem = z.zero_memory();
      const int64_t want = int64_t(expected_peak * sizeof(float));
      EXPECT_GE(mem.gathered, want - int64_t(2 * page));
      EXPECT_LE(mem.gathered, want + edge_slack);
      EXPECT_EQ(mem.params, int64_t(z.shard_size() * sizeof(float)));
      if (comm.rank() == 0) {
        std::printf(
            "reshard %d: peak gathered %zu elements (%.1f%% of %zu), measured %lld B "
            "resident vs %lld B predicted\n",
            reshard, z.peak_live_param_elems(),
            100.0 * z.peak_live_param_elems() / m.layout().num_params(), m.layout().num_params(),
            static_cast<long long>(mem.gathered), static_cast<long long>(want));
      }
    });
  }
}

TEST(ZeroTest, RejectsStagesOutsideOneToThree) {
  auto gpt = engine::cpu::CpuModel::Create(SmallConfig(), 1, 4, 1);
  ASSERT_TRUE(gpt.ok());
  for (int stage : {0, 4, -1}) {
    ZeroOptions o;
    o.stage = stage;
    auto z = Zero::Create(o, gpt->get(), Options(), nullptr);
    EXPECT_EQ(z.status().code(), absl::StatusCode::kInvalidArgument) << stage;
  }
}

TEST(ShardRangeTest, SplitsEvenlyWithTheRemainderOnTheLastRank) {
  EXPECT_EQ(UnitShardRange(10, 3, 0).begin, 0u);
  EXPECT_EQ(UnitShardRange(10, 3, 0).end, 3u);
  EXPECT_EQ(UnitShardRange(10, 3, 1).begin, 3u);
  EXPECT_EQ(UnitShardRange(10, 3, 1).end, 6u);
  EXPECT_EQ(UnitShardRange(10, 3, 2).begin, 6u);
  EXPECT_EQ(UnitShardRange(10, 3, 2).end, 10u);
  EXPECT_EQ(UnitShardRange(3, 4, 2).size(), 0u);
  EXPECT_EQ(UnitShardRange(3, 4, 3).begin, 0u);
  EXPECT_EQ(UnitShardRange(3, 4, 3).end, 3u);
}

}  // namespace
}  // namespace shardtrain::parallel
