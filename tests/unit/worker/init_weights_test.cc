// model.init: a job starts from given weights instead of its seed's. A
// source run trains 5 steps and its weights are exported in Hugging Face's
// GPT-2 layout (and as our weights file); jobs of other layouts (dp 2 with
// ZeRO-3, tp 2, pp 2; thread ranks over Gloo) started from either file hold
// exactly those weights, and evaluate the source's validation loss within
// 1e-6. A file of another shape fails Trainer::Create naming model.init and
// the tensor.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/comm/test_util.h"
#include "worker/checkpoint/hf_gpt2.h"
#include "worker/checkpoint/weights_file.h"
#include "worker/trainer.h"

namespace shardtrain::worker {
namespace {
namespace fs = std::filesystem;

class InitWeightsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("shardtrain_init_" + std::to_string(getpid()));
    fs::create_directories(dir_);
    std::ofstream train(dir_ / "train.txt"), val(dir_ / "val.txt");
    for (int i = 0; i < 300; ++i) train << "Fortune " << i * 13 % 97 << ": the quick fox.\n";
    for (int i = 0; i < 60; ++i) val << "A lazy dog " << i * 7 << " sleeps here.\n";
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  JobSpec Spec(
      const std::string& layout, const std::string& init = "",
      const std::string& model = "{layers: 4, heads: 4, dim: 32, context: 32, vocab: 256}") {
    absl::StatusOr<JobSpec> spec = ParseJobSpec(absl::StrCat(
        "name: init\n", "model: ", model.substr(0, model.size() - 1),
        init.empty() ? "" : absl::StrCat(", init: ", init), "}\n",
        "data: {train: ", (dir_ / "train.txt").string(), ", val: ", (dir_ / "val.txt").string(),
        "}\n", "batch: {global: 8, micro: 4, seq_len: 32}\n", "parallel: ", layout, "\n",
        "optimizer: {lr: 0.003, warmup_steps: 2}\n", "eval: {every: 100, batches: 2}\n",
        "steps: 5\n"));
    EXPECT_TRUE(spec.ok()) << spec.status();
    return *spec;
  }
  fs::path dir_;
};

// Rank 0's whole model and validation loss, after `steps` steps, of `spec`'s
// world of thread ranks.
struct Result {
  std::vector<float> params;
  double val = NAN;
  absl::Status create;
};
Result TrainRanks(const JobSpec& spec, int steps) {
  Result out;
  std::mutex mu;
  comm::testing::RunRanks(spec.Dims()->world(), [&](comm::Communicator& comm) {
    auto t = Trainer::Create(spec, comm.rank(), 1, &comm);
    if (!t.ok()) {
      std::lock_guard<std::mutex> lock(mu);
      out.create = t.status();
      return;
    }
    for (int s = 1; s <= steps; ++s) ASSERT_TRUE((*t)->Step(s).ok());
    absl::StatusOr<double> val = (*t)->Evaluate();
    ASSERT_TRUE(val.ok()) << val.status();
    absl::StatusOr<absl::Span<const float>> w = (*t)->WholeModel();
    ASSERT_TRUE(w.ok()) << w.status();
    if (comm.rank() == 0) {
      std::lock_guard<std::mutex> lock(mu);
      out.params.assign(w->begin(), w->end());
      out.val = *val;
    }
  });
  return out;
}

TEST_F(InitWeightsTest, JobsOfAnyLayoutStartFromExportedWeights) {
  const JobSpec source = Spec("{dp: 1}");
  const Result trained = TrainRanks(source, 5);
  ASSERT_FALSE(trained.params.empty());
  const model::ModelConfig config = *model::MakeGptConfig(4, 4, 32, 32, 256);
  const std::string hf = (dir_ / "export").string();
  fs::create_directories(hf);
  ASSERT_TRUE(checkpoint::WriteSafetensors(hf + "/model.safetensors",
                                           checkpoint::ToHfGpt2(config, trained.params))
                  .ok());
  const std::string ours = (dir_ / "final.weights").string();
  ASSERT_TRUE(checkpoint::SaveWeights(ours, config, trained.params).ok());

  const Result fresh = TrainRanks(source, 0);
  EXPECT_NE(fresh.params, trained.params);  // without model.init: the seed's weights
  for (const char* layout : {"{dp: 1}", "{dp: 2, zero: 3}", "{tp: 2}", "{pp: 2}"}) {
    for (const std::string& init : {hf, ours}) {
      SCOPED_TRACE(absl::StrCat(layout, " from ", init));
      const Result started = TrainRanks(Spec(layout, init), 0);
      ASSERT_TRUE(started.create.ok()) << started.create;
      EXPECT_EQ(started.params, trained.params);
      std::printf("[init] %-18s from %-13s val %.7f (source %.7f)\n", layout,
                  fs::path(init).filename().c_str(), started.val, trained.val);
      EXPECT_NEAR(started.val, trained.val, 1e-6 * trained.val);
    }
  }
}

TEST_F(InitWeightsTest, AnotherShapeFailsNamingModelInitAndTheTensor) {
  const model::ModelConfig small = *model::MakeGptConfig(4, 4, 16, 32, 256);
  const std::vector<float> p(model::ParamLayout(small).num_params(), 0.5f);
  const std::string file = (dir_ / "small.safetensors").string();
  ASSERT_TRUE(checkpoint::WriteSafetensors(file, checkpoint::ToHfGpt2(small, p)).ok());
  const Result r = TrainRanks(Spec("{dp: 1}", file), 0);
  EXPECT_EQ(r.create.code(), absl::StatusCode::kInvalidArgument) << r.create;
  EXPECT_NE(r.create.message().find("model.init: "), std::string::npos) << r.create;
  EXPECT_NE(r.create.message().find("transformer.wte.weight: shape [256, 16] in the file, "
                                    "[256, 32] for the model"),
            std::string::npos)
      << r.create;
  const Result missing = TrainRanks(Spec("{dp: 1}", (dir_ / "nope").string()), 0);
  EXPECT_EQ(missing.create.code(), absl::StatusCode::kNotFound) << missing.create;
}

}  // namespace
}  // namespace shardtrain::worker
