// The device a worker registers for --device cpu | cuda:N, from the GPUs the
// CUDA runtime reports (injected here), and the lines --probe-devices prints.
// The probe itself runs too: on a machine without a GPU it must say why.
#include "worker/device_probe.h"

#include <gtest/gtest.h>

namespace shardtrain::worker {
namespace {

std::vector<GpuInfo> TwoGpus() {
  GpuInfo h100{0, "NVIDIA H100 80GB HBM3", 85'029'158'912, 9, 0};
  GpuInfo t4{1, "Tesla T4", 15'828'320'256, 7, 5};
  return {h100, t4};
}

std::vector<std::string> Precisions(const v1::Device& d) {
  return {d.precisions().begin(), d.precisions().end()};
}

TEST(DeviceProbeTest, CpuIsFp32WithHostMemory) {
  auto d = DeviceFor("cpu", 3, absl::FailedPreconditionError("never consulted"));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->name(), "cpu");
  EXPECT_EQ(d->kind(), "cpu");
  EXPECT_EQ(d->model(), "cpu, 3 threads");
  EXPECT_GT(d->memory_bytes(), 0);
  EXPECT_EQ(Precisions(*d), std::vector<std::string>{"fp32"});
}

TEST(DeviceProbeTest, AGpuOfComputeCapability8OrNewerTrainsInEveryPrecision) {
  auto d = DeviceFor("cuda:0", 3, TwoGpus());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->name(), "cuda:0");
  EXPECT_EQ(d->kind(), "cuda");
  EXPECT_EQ(d->model(), "NVIDIA H100 80GB HBM3, compute capability 9.0");
  EXPECT_EQ(d->memory_bytes(), 85'029'158'912);
  EXPECT_EQ(Precisions(*d), (std::vector<std::string>{"fp32", "bf16", "fp16"}));
  GpuInfo a100{0, "NVIDIA A100-SXM4-40GB", 42'298'834'944, 8, 0};
  EXPECT_EQ(GpuPrecisions(a100), (std::vector<std::string>{"fp32", "bf16", "fp16"}));
}

TEST(DeviceProbeTest, AnOlderGpuIsRefusedNamingItsCapability) {
  auto d = DeviceFor("cuda:1", 3, TwoGpus());
  EXPECT_TRUE(absl::IsFailedPrecondition(d.status())) << d.status();
  EXPECT_EQ(d.status().message(),
            "--device cuda:1: Tesla T4 has compute capability 7.5; this build's kernels need 8.0 "
            "or newer");
}

TEST(DeviceProbeTest, AMissingGpuNamesTheOnesThereAre) {
  auto d = DeviceFor("cuda:2", 3, TwoGpus());
  EXPECT_TRUE(absl::IsFailedPrecondition(d.status())) << d.status();
  EXPECT_EQ(d.status().message(),
            "--device cuda:2: this machine has 2 CUDA devices (cuda:0, cuda:1)");
  auto none = DeviceFor("cuda:0", 3,
                        absl::FailedPreconditionError(
                            "no CUDA device: cudaGetDeviceCount: CUDA error 35 "
                            "cudaErrorInsufficientDriver (CUDA driver version is insufficient for "
                            "CUDA runtime version)"));
  EXPECT_TRUE(absl::IsFailedPrecondition(none.status())) << none.status();
  EXPECT_EQ(none.status().message(),
            "--device cuda:0: no CUDA device: cudaGetDeviceCount: CUDA error 35 "
            "cudaErrorInsufficientDriver (CUDA driver version is insufficient for CUDA runtime "
            "version)");
}

TEST(DeviceProbeTest, MalformedNamesAreUsageErrors) {
  for (const char* bad : {"gpu", "cuda", "cuda:", "cuda:-1", "cuda:x", "cuda:1a", "cuda: 1",
                          "cuda:+1", "cuda:99999", "CPU"}) {
    auto d = DeviceFor(bad, 1, TwoGpus());
    EXPECT_TRUE(absl::IsInvalidArgument(d.status())) << bad << ": " << d.status();
    EXPECT_EQ(d.status().message(), absl::StrCat("--device: '", bad, "' is not cpu or cuda:N"));
    // The probe is not even run for them.
    EXPECT_TRUE(absl::IsInvalidArgument(ProbeDevice(bad, 1).status())) << bad;
  }
}

TEST(DeviceProbeTest, ProbeLinesAreOneTabSeparatedLinePerGpu) {
  std::vector<GpuInfo> gpus = TwoGpus();
  gpus[1].model = "Tesla\tT4\n";  // a model name never breaks the format
  EXPECT_EQ(ProbeLines(gpus),
            "cuda:0\tfp32,bf16,fp16\t85029158912\t9.0\tNVIDIA H100 80GB HBM3\n"
            "cuda:1\t-\t15828320256\t7.5\tTesla T4 \n");
  EXPECT_EQ(ProbeLines({}), "");
}

// The real probe of this machine: a GPU that can train is cuda:0's device;
// without one (no GPU, no driver, a CPU-only build) the reason is named.
TEST(DeviceProbeTest, ThisMachine) {
  absl::StatusOr<std::vector<GpuInfo>> gpus = ProbeGpus();
  absl::StatusOr<v1::Device> d = ProbeDevice("cuda:0", 1);
  if (!gpus.ok()) {
    EXPECT_TRUE(absl::IsFailedPrecondition(gpus.status())) << gpus.status();
    EXPECT_EQ(gpus.status().message().rfind("no CUDA device: ", 0), 0u) << gpus.status();
    EXPECT_TRUE(absl::IsFailedPrecondition(d.status())) << d.status();
    EXPECT_EQ(d.status().message(), absl::StrCat("--device cuda:0: ", gpus.status().message()));
    std::cout << "no GPU here: " << d.status().message() << std::endl;
    return;
  }
  ASSERT_FALSE(gpus->empty());
  std::cout << ProbeLines(*gpus);
  if (GpuPrecisions(gpus->front()).empty()) return;
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->kind(), "cuda");
  EXPECT_EQ(d->memory_bytes(), gpus->front().memory_bytes);
  EXPECT_GT(d->memory_bytes(), 0);
}

}  // namespace
}  // namespace shardtrain::worker
