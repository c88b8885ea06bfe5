// ContextParallelGroup over both kinds of communicator, 3 thread ranks
// (Gloo):
//   host memory    each pass done when FinishRingPass returns (the CPU
//                  engine, and GPU ranks staging their blocks through the
//                  host);
//   device memory  NCCL's path, played by DeviceMemoryComm (Gloo taking
//                  device addresses): every pass ordered after the device's
//                  queued work by an event, its block there once the compute
//                  stream reaches it; errors come from Finish.
// A full turn of the ring (size passes, each block handed on) brings every
// block back to its owner, having visited every rank in ring order; both
// kinds give the same blocks and count the same bytes, and a device-memory
// group without its device refuses to pass.
#include "worker/parallel/context_parallel_group.h"

#include <cstdio>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/worker/comm/test_util.h"
#include "tests/unit/worker/parallel/device_memory_comm.h"
#include "worker/engine/cpu/cpu_device.h"

namespace shardtrain::parallel {
namespace {

using testing::DeviceMemoryComm;
using testing::ToDevice;

constexpr int kRanks = 3, kN = 4;

struct Results {
  std::vector<std::vector<float>> seen;  // the block in hand after each pass
  int64_t bytes = 0, passes = 0;
};

// A full turn: the rank's own block (r·10 + i) handed on kRanks times, two
// buffers alternating as the engine's ring does.
void Turn(ContextParallelGroup& cp, bool device, Results* out) {
  auto at = [device](float* p) { return device ? ToDevice(p) : p; };
  std::vector<float> buf[2] = {std::vector<float>(kN), std::vector<float>(kN)};
  for (int i = 0; i < kN; ++i) buf[0][i] = float(cp.rank() * 10 + i);
  for (int s = 0; s < kRanks; ++s) {
    cp.StartRingPass(at(buf[s % 2].data()), at(buf[(s + 1) % 2].data()), kN, DataType::kFloat32);
    cp.FinishRingPass();
    ASSERT_TRUE(cp.Finish().ok()) << cp.status();  // device: wait before the host reads it
    out->seen.push_back(buf[(s + 1) % 2]);
  }
  out->bytes = cp.TakeBytes();
  out->passes = cp.passes();
}

TEST(ContextParallelGroupTest, DeviceMemoryRingOrdersOnTheDeviceAndEqualsTheHostRing) {
  std::vector<Results> host(kRanks), device(kRanks);
  std::vector<int> ops(kRanks), host_ops(kRanks), unordered(kRanks);
  comm::testing::RunRanks(kRanks, [&](comm::Communicator& c) {
    ContextParallelGroup cp(&c);
    EXPECT_FALSE(cp.device_memory());
    Turn(cp, false, &host[c.rank()]);
  });
  comm::testing::RunRanks(kRanks, [&](comm::Communicator& c) {
    DeviceMemoryComm d(c);
    engine::cpu::CpuDevice cpu;
    ContextParallelGroup cp(&d);
    EXPECT_TRUE(cp.device_memory());
    cp.set_device(&cpu);
    Turn(cp, true, &device[c.rank()]);
    ops[c.rank()] = d.ops();
    host_ops[c.rank()] = d.host_ops();
    unordered[c.rank()] = d.unordered();
  });
  for (int r = 0; r < kRanks; ++r) {
    SCOPED_TRACE(r);
    ASSERT_EQ(host[r].seen.size(), size_t(kRanks));
    for (int s = 0; s < kRanks; ++s) {
      // After pass s rank r holds rank (r - s - 1)'s block.
      const int owner = ((r - s - 1) % kRanks + kRanks) % kRanks;
      for (int i = 0; i < kN; ++i) EXPECT_EQ(host[r].seen[s][i], float(owner * 10 + i));
    }
    EXPECT_EQ(device[r].seen, host[r].seen);
    EXPECT_EQ(device[r].bytes, host[r].bytes);
    EXPECT_EQ(host[r].bytes, int64_t{kRanks} * kN * 4);
    EXPECT_EQ(device[r].passes, kRanks);
    EXPECT_EQ(ops[r], kRanks);
    EXPECT_EQ(host_ops[r], 0) << "passes on host memory";
    EXPECT_EQ(unordered[r], 0) << "passes not ordered after the device's work";
  }
  std::printf(
      "[cp-group] %d ranks: a full turn of the ring brings every block home over host and device "
      "memory alike; %lld bytes sent per rank either way\n",
      kRanks, static_cast<long long>(host[0].bytes));
}

// Without the device whose stream orders its passes a device-memory group
// fails its first pass (FAILED_PRECONDITION), sends nothing, and later
// passes do nothing.
TEST(ContextParallelGroupTest, DeviceMemoryRingWithoutItsDeviceFailsWithoutSending) {
  comm::testing::RunRanks(2, [&](comm::Communicator& c) {
    DeviceMemoryComm d(c);
    ContextParallelGroup cp(&d);
    std::vector<float> a(4, 1.0f), b(4, 2.0f);
    cp.StartRingPass(ToDevice(a.data()), ToDevice(b.data()), a.size(), DataType::kFloat32);
    cp.FinishRingPass();
    cp.StartRingPass(ToDevice(b.data()), ToDevice(a.data()), a.size(), DataType::kFloat32);
    EXPECT_EQ(cp.Finish().code(), absl::StatusCode::kFailedPrecondition) << cp.status();
    EXPECT_NE(cp.status().message().find("set_device"), std::string::npos) << cp.status();
    EXPECT_EQ(d.ops(), 0);
    EXPECT_EQ(b, std::vector<float>(4, 2.0f));
  });
}

}  // namespace
}  // namespace shardtrain::parallel
