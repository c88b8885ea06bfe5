// The peak table MFU is measured against: GPUs found by the names the CUDA
// runtime reports and by the short names users type, the more specific row
// first, the figure for the job's precision, and unknown devices saying why.
#include "common/device_peaks.h"

#include <gtest/gtest.h>

namespace shardtrain {
namespace {

TEST(DevicePeaksTest, ReportedNamesFindTheirRows) {
  EXPECT_DOUBLE_EQ(*DensePeakFlops("NVIDIA H100 80GB HBM3", DataType::kBFloat16), 989.4e12);
  EXPECT_DOUBLE_EQ(*DensePeakFlops("NVIDIA H200", DataType::kBFloat16), 989.4e12);
  EXPECT_DOUBLE_EQ(*DensePeakFlops("NVIDIA H100 PCIe", DataType::kBFloat16), 756e12);
  EXPECT_DOUBLE_EQ(*DensePeakFlops("NVIDIA A100-SXM4-80GB", DataType::kFloat16), 312e12);
  EXPECT_DOUBLE_EQ(*DensePeakFlops("NVIDIA L40S", DataType::kBFloat16), 362.05e12);
  EXPECT_DOUBLE_EQ(*DensePeakFlops("NVIDIA L4", DataType::kBFloat16), 121e12);
  EXPECT_DOUBLE_EQ(*DensePeakFlops("h100", DataType::kFloat32), 67e12);  // a typed short name
  EXPECT_STREQ(FindDevicePeak("NVIDIA H100 80GB HBM3")->label, "H100 SXM");
  EXPECT_STREQ(FindDevicePeak("NVIDIA GH200 480GB")->label, "GH200");
}

TEST(DevicePeaksTest, UnknownDevicesAndTypesSayWhy) {
  EXPECT_FALSE(DensePeakFlops("x86_64, 2 cores", DataType::kFloat32));
  EXPECT_NE(WhyNoPeak("x86_64, 2 cores", DataType::kFloat32).find("no dense peak known"),
            std::string::npos);
  EXPECT_NE(WhyNoPeak("", DataType::kFloat32).find("no accelerator"), std::string::npos);
  EXPECT_FALSE(DensePeakFlops("Tesla V100-SXM2-16GB", DataType::kBFloat16));
  EXPECT_NE(WhyNoPeak("Tesla V100-SXM2-16GB", DataType::kBFloat16).find("no bf16 peak"),
            std::string::npos);
}

// Every row is found by its own key (no earlier row shadows it) and has a
// figure.
TEST(DevicePeaksTest, NoRowShadowsAnother) {
  for (const DevicePeak& p : DevicePeaks()) {
    EXPECT_EQ(FindDevicePeak(p.key), &p) << p.key;
    EXPECT_GT(p.bf16_tflops + p.fp32_tflops, 0) << p.key;
  }
}

}  // namespace
}  // namespace shardtrain
