#include "worker/comm/types.h"

#include <cmath>
#include <cstring>
#include <random>

#include "gloo/types.h"
#include "gtest/gtest.h"

namespace shardtrain::comm {
namespace {

TEST(TypesTest, HalfRoundTripsEveryValue) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToHalf(f), h) << "half bits " << h << " = " << f;
  }
}

TEST(TypesTest, BFloat16RoundTripsEveryValue) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = BFloat16ToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToBFloat16(f), h) << "bf16 bits " << h;
  }
}

// Rounding to nearest even agrees with Gloo's own fp16 conversion.
TEST(TypesTest, HalfMatchesGlooRounding) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-70000.0f, 70000.0f);
  std::uniform_real_distribution<float> tiny(-1e-4f, 1e-4f);
  for (int i = 0; i < 200000; ++i) {
    const float f = (i % 2) ? dist(rng) : tiny(rng);
    gloo::float16 g = gloo::cpu_float2half_rn(f);
    ASSERT_EQ(FloatToHalf(f), g.x) << f;
  }
}

TEST(TypesTest, BFloat16RoundsToNearestEven) {
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(1.0f + 1.0f / 256)), 1.0f);  // tie -> even
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(NAN))));
  EXPECT_TRUE(std::isinf(HalfToFloat(FloatToHalf(1e6f))));
}

TEST(TypesTest, BulkConversion) {
  float in[5] = {0.0f, -1.5f, 3.25f, 1024.0f, -0.125f}, out[5];
  uint16_t mid[5];
  for (DataType d : {DataType::kFloat32, DataType::kBFloat16, DataType::kFloat16}) {
    alignas(4) uint8_t buf[20];
    FromFloat32(d, in, d == DataType::kFloat32 ? static_cast<void*>(buf) : mid, 5);
    ToFloat32(d, d == DataType::kFloat32 ? static_cast<void*>(buf) : mid, out, 5);
    for (int i = 0; i < 5; ++i) EXPECT_EQ(out[i], in[i]) << DataTypeName(d);
  }
}

}  // namespace
}  // namespace shardtrain::comm
