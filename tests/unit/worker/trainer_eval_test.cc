// The validation loss through real parts (CPU engine, DDP or ZeRO-1/2/3,
// Gloo over 127.0.0.1 between thread ranks): a Trainer on 2 ranks reports,
// on the evaluation steps only, the 1-rank DDP trainer's validation loss
// (fp32, relative 1e-5), identical on both ranks: 3 global batches of 2
// windows, evaluated by 1 rank in micro-batches of 2 and by 2 ranks in
// micro-batches of 1 (the same global batch, so the same windows).
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common/job_spec.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/comm/test_util.h"
#include "worker/trainer.h"

namespace shardtrain::worker {
namespace {
namespace fs = std::filesystem;

class TrainerEvalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("shardtrain_trainer_eval_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    std::ofstream train(dir_ / "train.txt"), val(dir_ / "val.txt");
    for (int i = 0; i < 300; ++i) train << "The quick brown fox " << i << " jumps.\n";
    for (int i = 0; i < 40; ++i) val << "A lazy dog " << i * 7 << " sleeps.\n";
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  JobSpec Spec(int dp, int zero) const {
    const int micro = 2 / dp;
    absl::StatusOr<JobSpec> spec = ParseJobSpec(
        "name: trainer-eval\n"
        "model: {layers: 2, heads: 2, dim: 16, context: 16, vocab: 256}\n"
        "data: {train: " +
        (dir_ / "train.txt").string() + ", val: " + (dir_ / "val.txt").string() +
        "}\n"
        "batch: {global: 2, micro: " +
        std::to_string(micro) +
        ", seq_len: 16}\n"
        "parallel: {dp: " +
        std::to_string(dp) + ", zero: " + std::to_string(zero) +
        "}\n"
        "optimizer: {lr: 0.01}\n"
        "eval: {every: 2, batches: 3}\n"
        "steps: 3\n");
    EXPECT_TRUE(spec.ok()) << spec.status();
    return *spec;
  }
  // rank -> the val_loss of steps 1..3 (NaN where absent).
  std::map<int, std::vector<double>> Train(int dp, int zero) const {
    const JobSpec spec = Spec(dp, zero);
    std::map<int, std::vector<double>> out;
    std::mutex mu;
    comm::testing::RunRanks(dp, [&](comm::Communicator& comm) {
      auto trainer = Trainer::Create(spec, comm.rank(), /*threads=*/1, &comm);
      ASSERT_TRUE(trainer.ok()) << trainer.status();
      std::vector<double> val;
      for (int step = 1; step <= 3; ++step) {
        absl::StatusOr<StepResult> r = (*trainer)->Step(step);
        ASSERT_TRUE(r.ok()) << r.status();
        val.push_back(r->val_loss.value_or(NAN));
      }
      std::lock_guard<std::mutex> lock(mu);
      out[comm.rank()] = val;
    });
    return out;
  }
  fs::path dir_;
};

TEST_F(TrainerEvalTest, TwoRanksReportTheOneRankValidationLoss) {
  const std::vector<double> ref = Train(1, 0)[0];
  ASSERT_EQ(ref.size(), 3u);
  EXPECT_TRUE(std::isnan(ref[0]));                              // step 1 does not evaluate
  ASSERT_TRUE(std::isfinite(ref[1]) && std::isfinite(ref[2]));  // every 2, and the last
  EXPECT_NE(ref[1], ref[2]);
  for (int zero = 0; zero <= 3; ++zero) {
    const std::map<int, std::vector<double>> runs = Train(2, zero);
    ASSERT_EQ(runs.size(), 2u) << "zero " << zero;
    double worst = 0;
    for (const auto& [rank, val] : runs) {
      EXPECT_TRUE(std::isnan(val[0])) << "zero " << zero << " rank " << rank;
      for (int i = 1; i < 3; ++i) {
        worst = std::max(worst, std::abs(val[i] - ref[i]) / ref[i]);
        EXPECT_EQ(val[i], runs.at(0)[i]) << "ranks disagree, zero " << zero;
      }
    }
    std::printf("zero %d dp 2: val %.6f %.6f vs 1 rank %.6f %.6f, max rel diff %.3g\n", zero,
                runs.at(0)[1], runs.at(0)[2], ref[1], ref[2], worst);
    EXPECT_LE(worst, 1e-5) << "zero " << zero;
  }
}

}  // namespace
}  // namespace shardtrain::worker
