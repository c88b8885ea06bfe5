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

}  // namespace
}  // namespace shardtrain::client
