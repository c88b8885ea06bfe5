// The trainer's device-memory paths (NCCL's) on CPU, through the whole
// Trainer: dp 2 × pp 2 thread ranks whose world is Gloo posing as device
// memory (DeviceMemoryComm, and so every group of the mesh split from it)
// and whose engine poses as a GPU's (OffHostEngine: a host view of its
// memory aborts, a released range reads NaN). So the pipeline sends and
// receives the engine's buffers, DDP and ZeRO-1 reduce them in place, the
// tied embeddings are summed in device memory and the norm's and the
// validation loss's sums over tp and pp go through a device scratch — each
// op ordered after the device's work, none on host memory. Against the
// plain CPU run over Gloo: every rank's training and validation losses and
// the whole model after 4 steps, bit for bit.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/comm/test_util.h"
#include "tests/unit/worker/parallel/device_memory_comm.h"
#include "tests/unit/worker/parallel/off_host_engine.h"
#include "worker/trainer.h"

namespace shardtrain::worker {
namespace {
namespace fs = std::filesystem;

constexpr int kSteps = 4;

struct RankRun {
  std::vector<double> losses;  // training, then validation where reported
  std::vector<float> model;    // the whole model after the last step
  int ops = 0, host_ops = 0, unordered = 0;
};

class DeviceMemoryTrainerTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("shardtrain_device_memory_trainer_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    std::ofstream train(dir_ / "train.txt"), val(dir_ / "val.txt");
    for (int i = 0; i < 300; ++i) train << "The quick brown fox " << i << " jumps.\n";
    for (int i = 0; i < 40; ++i) val << "A lazy dog " << i * 7 << " sleeps.\n";
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  JobSpec Spec(int zero) const {
    absl::StatusOr<JobSpec> spec = ParseJobSpec(absl::StrCat(
        "name: device-memory-trainer\n",
        "model: {layers: 2, heads: 2, dim: 16, context: 16, vocab: 256}\n",
        "data: {train: ", (dir_ / "train.txt").string(), ", val: ", (dir_ / "val.txt").string(),
        "}\n", "batch: {global: 8, micro: 2, seq_len: 16}\n",
        "parallel: {dp: 2, pp: 2, zero: ", zero, "}\n",
        "resources: {min_workers: 4, max_workers: 4}\n", "optimizer: {lr: 0.01, grad_clip: 1.0}\n",
        "eval: {every: 2, batches: 2}\n", "steps: ", kSteps, "\n"));
    EXPECT_TRUE(spec.ok()) << spec.status();
    return *spec;
  }
  // Every rank's run; `device`: over DeviceMemoryComm with OffHostEngines.
  std::vector<RankRun> Run(const JobSpec& spec, bool device) const {
    std::vector<RankRun> out(spec.World());
    comm::testing::RunRanks(spec.World(), [&](comm::Communicator& gloo) {
      std::unique_ptr<parallel::testing::DeviceMemoryComm> posing;
      if (device) posing = std::make_unique<parallel::testing::DeviceMemoryComm>(gloo);
      comm::Communicator& world = device ? *posing : gloo;
      Trainer::EngineWrapper wrap;
      if (device) {
        wrap = [](std::unique_ptr<engine::Engine> e) -> std::unique_ptr<engine::Engine> {
          return std::make_unique<parallel::testing::OffHostEngine>(std::move(e));
        };
      }
      auto t = Trainer::Create(spec, world.rank(), /*threads=*/1, &world, /*gpu=*/0, wrap);
      ASSERT_TRUE(t.ok()) << t.status();
      RankRun& r = out[world.rank()];
      for (int step = 1; step <= kSteps; ++step) {
        absl::StatusOr<StepResult> s = (*t)->Step(step);
        ASSERT_TRUE(s.ok()) << "rank " << world.rank() << " step " << step << ": " << s.status();
        r.losses.push_back(s->loss);
        if (s->val_loss) r.losses.push_back(*s->val_loss);
      }
      absl::StatusOr<absl::Span<const float>> model = (*t)->WholeModel();
      ASSERT_TRUE(model.ok()) << model.status();
      r.model.assign(model->begin(), model->end());
      if (device) {
        r.ops = posing->ops();
        r.host_ops = posing->host_ops();
        r.unordered = posing->unordered();
      }
    });
    return out;
  }
  fs::path dir_;
};

TEST_P(DeviceMemoryTrainerTest, PipelineAndDataParallelInDeviceMemoryEqualThePlainRun) {
  const JobSpec spec = Spec(GetParam());
  const std::vector<RankRun> plain = Run(spec, false), device = Run(spec, true);
  for (int r = 0; r < spec.World(); ++r) {
    SCOPED_TRACE(r);
    ASSERT_EQ(device[r].losses.size(), plain[r].losses.size());
    EXPECT_EQ(device[r].losses, plain[r].losses);
    ASSERT_EQ(device[r].model.size(), plain[r].model.size());
    EXPECT_EQ(std::memcmp(device[r].model.data(), plain[r].model.data(),
                          plain[r].model.size() * sizeof(float)),
              0);
    EXPECT_GT(device[r].ops, 0);
    EXPECT_EQ(device[r].host_ops, 0) << "ops on host memory";
    EXPECT_EQ(device[r].unordered, 0) << "reductions or transfers not after the device's work";
  }
  const RankRun& last = plain[spec.World() - 1];
  EXPECT_TRUE(std::isfinite(last.losses.back()));
  EXPECT_GT(last.losses.front(), 0.0);
  std::printf(
      "[device-memory-trainer] dp2 x pp2 %s: %zu losses per rank (training and validation) and "
      "%zu parameters equal the plain run; rank 0: %d ops, none on host memory, every reduction "
      "and transfer after an event; last-stage loss step 1 %.7f\n",
      GetParam() == 0 ? "DDP" : "ZeRO-1", last.losses.size(), last.model.size(), device[0].ops,
      last.losses.front());
}

INSTANTIATE_TEST_SUITE_P(DdpAndZero1, DeviceMemoryTrainerTest, ::testing::Values(0, 1),
                         [](const ::testing::TestParamInfo<int>& p) {
                           return p.param == 0 ? std::string("Ddp") : std::string("Zero1");
                         });

}  // namespace
}  // namespace shardtrain::worker
