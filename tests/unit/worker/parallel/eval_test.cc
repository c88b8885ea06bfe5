// Forward-only passes (DataParallel::BeginEval / EndEval) under every
// strategy — DDP (zero 0) and ZeRO-1/2/3 — on 1 and 2 thread ranks, each
// with its own CpuModel and Gloo communicator over 127.0.0.1. Between training
// steps every rank evaluates its share of the same validation sequences;
// the summed loss over dp must equal the single-rank DDP value (fp32,
// relative 1e-5). Under ZeRO-3 the parameters are gathered per unit by the
// param hook, which only accepts the use order it expects: several forwards
// with no backward in between must go through the eval bracket. The passes
// must also leave no gathered unit behind, touch no gradient and add no
// bytes to the next step's traffic.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/config.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/comm/test_util.h"
#include "worker/engine/cpu/cpu_model.h"
#include "worker/parallel/data_parallel.h"
#include "worker/parallel/zero.h"

namespace shardtrain::parallel {
namespace {

constexpr int kB = 2, kT = 8;
constexpr int kGlobal = 4;   // training sequences per step
constexpr int kValSeqs = 8;  // validation sequences per evaluation
constexpr int kEvals = 2;    // after step 1 and after step 2
constexpr uint64_t kSeed = 77;

model::ModelConfig SmallConfig() {
  auto config = model::MakeGptConfig(2, 2, 10, 9, 50);  // units of 730, 1330, 1330, 20
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

// Token i of sequence `seq` of `batch` (training step, or kValBatch).
constexpr int kValBatch = 1000;
int Token(int batch, int seq, int i) {
  uint64_t x = uint64_t(batch) * 1000003u + uint64_t(seq) * 101u + uint64_t(i);
  x ^= x >> 13;
  x *= 0x9E3779B97F4A7C15ull;
  return static_cast<int>((x >> 29) % 50u);
}

void Fill(int batch, int first, int count, std::vector<int>* in, std::vector<int>* tgt) {
  in->resize(size_t(count) * kT);
  tgt->resize(in->size());
  for (int s = 0; s < count; ++s) {
    for (int i = 0; i < kT; ++i) {
      (*in)[size_t(s) * kT + i] = Token(batch, first + s, i);
      (*tgt)[size_t(s) * kT + i] = Token(batch, first + s, i + 1);
    }
  }
}

struct Variant {
  std::string name;
  int zero;
  bool reshard = true;
};
void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

struct EvalRun {
  std::vector<double> val;          // kEvals validation losses
  std::vector<int64_t> step_bytes;  // comm_bytes of each step
};

// One evaluation, as the trainer runs it: this rank's share of the
// validation sequences in forwards of kB, the sum over dp from EndEval.
double Evaluate(DataParallel& dp_strategy, engine::Engine& m, comm::Communicator& comm) {
  const int share = kValSeqs / comm.size(), first = comm.rank() * share;
  std::vector<int> in, tgt;
  dp_strategy.BeginEval();
  double sum = 0;
  for (int at = first; at < first + share; at += kB) {
    Fill(kValBatch, at, kB, &in, &tgt);
    sum += double(m.Forward(in.data(), tgt.data(), kB, kT)) * kB;
  }
  absl::StatusOr<double> total = dp_strategy.EndEval(sum);
  EXPECT_TRUE(total.ok()) << total.status();
  return total.ok() ? *total / kValSeqs : NAN;
}

void RankRun(comm::Communicator& comm, const Variant& v, EvalRun* run) {
  const int dp = comm.size(), accum = kGlobal / (kB * dp);
  auto gpt = engine::cpu::CpuModel::Create(SmallConfig(), kB, kT, 1);
  ASSERT_TRUE(gpt.ok());
  engine::cpu::CpuModel& m = **gpt;
  ParallelSpec p;
  p.dp = dp;
  p.zero = v.zero;
  p.reshard_after_forward = v.reshard;
  optim::AdamWOptions adamw;
  adamw.weight_decay = 0.1f;
  auto made = MakeDataParallel(p, &m, adamw, &comm);
  ASSERT_TRUE(made.ok()) << made.status();
  DataParallel& s = **made;
  s.InitParams(kSeed);
  auto* zero = dynamic_cast<Zero*>(&s);
  std::vector<int> in, tgt;
  for (int step = 1; step <= 2; ++step) {
    for (int micro = 0; micro < accum; ++micro) {
      Fill(step, (comm.rank() * accum + micro) * kB, kB, &in, &tgt);
      s.BeginMicroBatch(micro, accum);
      m.Forward(in.data(), tgt.data());
      m.Backward(1.0f / accum);
      ASSERT_TRUE(s.EndMicroBatch().ok());
    }
    auto stats = s.Step(3e-3f, 1.0f);
    ASSERT_TRUE(stats.ok()) << stats.status();
    run->step_bytes.push_back(stats->comm_bytes);
    const std::vector<float> grads(m.grads().f32().begin(), m.grads().f32().end());
    run->val.push_back(Evaluate(s, m, comm));
    EXPECT_TRUE(std::equal(grads.begin(), grads.end(), m.grads().f32().begin()))
        << "evaluation changed the gradients";
    if (zero != nullptr && v.zero == 3) {
      EXPECT_EQ(zero->live_param_elems(), 0u) << "units left gathered after EndEval";
    }
  }
}

class EvalTest : public ::testing::TestWithParam<std::tuple<int, Variant>> {};

TEST_P(EvalTest, ValidationLossMatchesOneRank) {
  const auto& [dp, v] = GetParam();
  EvalRun ref;
  comm::testing::RunRanks(1, [&](comm::Communicator& comm) { RankRun(comm, {"ddp", 0}, &ref); });
  std::vector<EvalRun> runs(dp);
  comm::testing::RunRanks(dp,
                          [&](comm::Communicator& comm) { RankRun(comm, v, &runs[comm.rank()]); });
  if (HasFailure()) return;
  ASSERT_EQ(ref.val.size(), size_t(kEvals));
  double worst = 0;
  for (int r = 0; r < dp; ++r) {
    ASSERT_EQ(runs[r].val.size(), size_t(kEvals));
    for (int e = 0; e < kEvals; ++e) {
      ASSERT_TRUE(std::isfinite(runs[r].val[e]));
      worst = std::max(worst, std::abs(runs[r].val[e] - ref.val[e]) / ref.val[e]);
      EXPECT_EQ(runs[r].val[e], runs[0].val[e]) << "ranks disagree, evaluation " << e;
    }
    // Step 2 follows an evaluation, step 1 does not: the same traffic.
    EXPECT_EQ(runs[r].step_bytes[1], runs[r].step_bytes[0]) << "rank " << r;
  }
  EXPECT_NE(ref.val[0], ref.val[1]);  // training moved the parameters
  std::printf("%-11s dp %d: val %.6f %.6f, max rel diff vs 1 rank %.3g\n", v.name.c_str(), dp,
              runs[0].val[0], runs[0].val[1], worst);
  EXPECT_LE(worst, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(
    DpAndStage, EvalTest,
    ::testing::Combine(::testing::Values(1, 2),
                       ::testing::Values(Variant{"ddp", 0}, Variant{"zero1", 1},
                                         Variant{"zero2", 2}, Variant{"zero3", 3},
                                         Variant{"zero3_keep", 3, /*reshard=*/false})),
    [](const ::testing::TestParamInfo<EvalTest::ParamType>& info) {
      return absl::StrCat(std::get<1>(info.param).name, "_dp", std::get<0>(info.param));
    });

}  // namespace
}  // namespace shardtrain::parallel
