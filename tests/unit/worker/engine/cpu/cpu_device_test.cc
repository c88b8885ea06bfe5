// The host as an engine::Device: zero-filled buffers whose released ranges
// read back as zero and stop being resident; host streams and events.
#include "worker/engine/cpu/cpu_device.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "worker/engine/cpu/page_buffer.h"

namespace shardtrain::engine::cpu {
namespace {

TEST(CpuDeviceTest, BuffersReleaseAndMeasure) {
  CpuDevice device;
  EXPECT_EQ(device.kind(), DeviceKind::kCpu);
  EXPECT_EQ(device.name(), "cpu");
  const size_t page_floats = PageBuffer::PageSize() / sizeof(float);
  const size_t n = 64 * page_floats;
  absl::StatusOr<std::unique_ptr<Buffer>> b = device.Allocate(n, DataType::kFloat32);
  ASSERT_TRUE(b.ok()) << b.status();
  Buffer& buf = **b;
  EXPECT_EQ(buf.count(), n);
  EXPECT_EQ(buf.bytes(), n * 4);
  float* f = buf.as<float>();
  // Measured before anything reads the memory: mincore also counts pages
  // only read, which map the kernel's shared zero page.
  EXPECT_EQ(buf.ResidentBytes(), 0);  // nothing touched yet
  EXPECT_TRUE(std::all_of(f, f + n, [](float x) { return x == 0.0f; }));
  std::fill(f, f + n, 1.5f);
  EXPECT_EQ(buf.ResidentBytes(), int64_t(n * 4));
  // Release pages 8..39 plus half a page on each side: the whole pages go,
  // the partial ones are zeroed in place.
  const size_t begin = 8 * page_floats - page_floats / 2, count = 32 * page_floats + page_floats;
  buf.Release(begin, count);
  EXPECT_EQ(buf.ResidentBytes(), int64_t((n - 32 * page_floats) * 4));
  EXPECT_TRUE(std::all_of(f + begin, f + begin + count, [](float x) { return x == 0.0f; }));
  EXPECT_EQ(f[begin - 1], 1.5f);
  EXPECT_EQ(f[begin + count], 1.5f);
  buf.ReleaseAll();
  EXPECT_EQ(buf.ResidentBytes(), 0);

  EXPECT_EQ(device.Allocate(8, DataType::kBFloat16).status().code(),
            absl::StatusCode::kUnimplemented);
}

TEST(CpuDeviceTest, HostStreamsAndEventsAreAlwaysDone) {
  CpuDevice device;
  absl::StatusOr<std::unique_ptr<Event>> e = device.NewEvent();
  absl::StatusOr<std::unique_ptr<Stream>> s = device.NewStream();
  ASSERT_TRUE(e.ok() && s.ok());
  EXPECT_TRUE((*e)->Query());
  EXPECT_TRUE((*e)->Record(device.compute_stream()).ok());
  EXPECT_TRUE((*e)->Query());
  EXPECT_TRUE((*s)->WaitEvent(**e).ok());
  EXPECT_TRUE((*s)->Synchronize().ok());
  EXPECT_EQ((*s)->native(), nullptr);
}

}  // namespace
}  // namespace shardtrain::engine::cpu
