// GpuTrainerTest's fixture (a scratch directory and one-rank checkpoint
// commits) and the comparison with the CPU engine, shared by
// gpu_trainer_test.cc and gpu_trainer_models_test.cc.
#ifndef SHARDTRAIN_TESTS_UNIT_WORKER_GPU_TRAINER_FIXTURE_H_
#define SHARDTRAIN_TESTS_UNIT_WORKER_GPU_TRAINER_FIXTURE_H_

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/worker/gpu_trainer_util.h"
#include "worker/checkpoint/directory.h"
#include "worker/checkpoint/manifest.h"
#include "worker/checkpoint/shard_file.h"
#include "worker/checkpoint/storage.h"
#include "worker/trainer.h"

namespace shardtrain::worker::gpu_testing {

class GpuTrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("shardtrain_gpu_trainer_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  // Writes the manifest of `trainer`'s one-rank checkpoint of `step`, as
  // rank 0's commit does; returns the step's directory.
  std::string Commit(Trainer& trainer, int64_t step) {
    std::string path;
    absl::StatusOr<checkpoint::ShardFileInfo> info = trainer.SaveShard(storage_, step, &path);
    EXPECT_TRUE(info.ok()) << info.status();
    const std::string dir = checkpoint::StepDir(trainer.spec().checkpoint.dir, step);
    WriteManifest(trainer, step, dir, *info);
    return dir;
  }
  void WriteManifest(Trainer& trainer, int64_t step, const std::string& dir,
                     const checkpoint::ShardFileInfo& info) {
    absl::StatusOr<checkpoint::Manifest> manifest =
        checkpoint::MakeManifest(trainer.engine().layout(), step, 1, 0, {info});
    EXPECT_TRUE(manifest.ok()) << manifest.status();
    EXPECT_TRUE(checkpoint::WriteManifest(storage_, checkpoint::ManifestPath(dir), *manifest).ok());
  }

  std::filesystem::path dir_;
  checkpoint::FileCheckpointStorage storage_;
};

// After `steps` fp32 steps of the same spec: the worker's memory report
// (every step's) of the GPU trainer accounts what the CPU engine's does, never
// reading device memory as host memory; the parameters agree within 1e-5.
inline void ExpectSameStateAsTheCpu(Trainer& cpu, Trainer& gpu, const char* label, int steps) {
  const MemoryUse m_cpu = cpu.memory(), m_gpu = gpu.memory();
  EXPECT_EQ(m_gpu.params, m_cpu.params);
  EXPECT_EQ(m_gpu.grads, m_cpu.grads);
  EXPECT_EQ(m_gpu.optimizer, m_cpu.optimizer);
  const std::vector<float> p_cpu = Params(cpu), p_gpu = Params(gpu);
  ASSERT_EQ(p_cpu.size(), p_gpu.size());
  const double diff = MaxRelDiff(std::vector<double>(p_gpu.begin(), p_gpu.end()),
                                 std::vector<double>(p_cpu.begin(), p_cpu.end()));
  std::printf("[gpu-trainer] %s parameters after %d AdamW steps: max diff %.3g\n", label, steps,
              diff);
  EXPECT_LE(diff, 1e-5) << label;
}

}  // namespace shardtrain::worker::gpu_testing

#endif  // SHARDTRAIN_TESTS_UNIT_WORKER_GPU_TRAINER_FIXTURE_H_
