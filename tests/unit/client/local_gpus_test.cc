// `shardtrain local` for a cuda job: the GPUs --probe-devices lists that can
// train, and the GPU each worker gets (round-robin).
#include "client/local_gpus.h"

#include <gtest/gtest.h>

namespace shardtrain::client {
namespace {

TEST(LocalGpusTest, UsableGpusAreTheLinesWithPrecisions) {
  const std::string probe =
      "cuda:0\tfp32,bf16,fp16\t85029158912\t9.0\tNVIDIA H100 80GB HBM3\n"
      "cuda:1\t-\t15828320256\t7.5\tTesla T4\n"
      "cuda:2\tfp32,bf16,fp16\t42298834944\t8.0\tNVIDIA A100-SXM4-40GB\n";
  EXPECT_EQ(UsableGpus(probe), (std::vector<std::string>{"cuda:0", "cuda:2"}));
  EXPECT_TRUE(UsableGpus("").empty());
  EXPECT_TRUE(UsableGpus("cuda:1\t-\t1\t7.5\tTesla T4\n").empty());
  // Anything else a wrapper may print (warnings, an old worker's text) is ignored.
  EXPECT_EQ(UsableGpus("warning: something\ncuda:3\tfp32\n\nnot a gpu\tfp32\n"),
            std::vector<std::string>{"cuda:3"});
}

TEST(LocalGpusTest, WorkersGoRoundRobinOverTheGpus) {
  const std::vector<std::string> gpus = {"cuda:0", "cuda:2"};
  std::vector<std::string> got;
  for (int i = 0; i < 5; ++i) got.push_back(WorkerGpu(i, gpus));
  EXPECT_EQ(got, (std::vector<std::string>{"cuda:0", "cuda:2", "cuda:0", "cuda:2", "cuda:0"}));
  EXPECT_EQ(WorkerGpu(3, {"cuda:0"}), "cuda:0");
}

TEST(LocalGpusTest, NcclNeedsAGpuPerWorker) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(
      "name: t\nmodel: {layers: 1, heads: 1, dim: 8, context: 8, vocab: 256}\n"
      "data: {train: a.bin}\nbatch: {global: 2, micro: 1, seq_len: 8}\n"
      "parallel: {dp: 2, comm: nccl}\nresources: {device: cuda}\nsteps: 1\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(CheckWorkersFitGpus(*spec, 2, 2).ok());
  const absl::Status shared = CheckWorkersFitGpus(*spec, 2, 1);
  EXPECT_EQ(shared.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(
      shared.message().rfind("parallel.comm: nccl needs one GPU per worker (2 workers, 1 GPUs", 0),
      0u)
      << shared;
  // Gloo shares GPUs; one rank needs no collectives at all.
  absl::StatusOr<JobSpec> gloo = ParseJobSpec(JobSpecToYaml(*spec), {"parallel.comm=gloo"});
  ASSERT_TRUE(gloo.ok());
  EXPECT_TRUE(CheckWorkersFitGpus(*gloo, 2, 1).ok());
  absl::StatusOr<JobSpec> one = ParseJobSpec(
      JobSpecToYaml(*spec),
      {"parallel.dp=1", "batch.global=1", "resources.min_workers=1", "resources.max_workers=1"});
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_TRUE(CheckWorkersFitGpus(*one, 2, 1).ok());
}

}  // namespace
}  // namespace shardtrain::client
