// TensorParallelGroup over both kinds of communicator, 3 thread ranks (Gloo):
//   host memory    each collective done when the call returns (the engine's
//                  CPU path, and GPU ranks staging through the host);
//   device memory  NCCL's path, played by DeviceMemoryComm (Gloo taking
//                  device addresses): every collective ordered after the
//                  device's queued work by an event, its result there once
//                  the compute stream reaches it; errors come from Finish.
// Both give the same sums, maxima, gathers and reduce-scatters, and count
// the same bytes; a device-memory group without its device refuses to run.
#include "worker/parallel/tensor_parallel_group.h"

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

constexpr int kRanks = 3, kN = 5;

struct Results {
  std::vector<float> sum, max, gathered, gathered_in_place, scattered;
  int64_t bytes = 0, calls = 0;
};

// Every collective of the group once, on data that depends on the rank;
// `device`: the buffers are passed at their device addresses.
void Exercise(TensorParallelGroup& tp, bool device, Results* out) {
  auto at = [device](float* p) { return device ? ToDevice(p) : p; };
  const int r = tp.rank();
  out->sum.resize(kN);
  out->max.resize(kN);
  for (int i = 0; i < kN; ++i) out->sum[i] = out->max[i] = float(r * 10 + i) * 0.25f;
  tp.AllReduceSum(at(out->sum.data()), kN);
  tp.AllReduceMax(at(out->max.data()), kN);
  std::vector<float> local(kN);
  for (int i = 0; i < kN; ++i) local[i] = float(100 * r + i);
  out->gathered.resize(kN * kRanks);
  tp.AllGather(at(local.data()), at(out->gathered.data()), kN);
  // In place, as the CUDA engine gathers a 16-bit tensor: the rank's block
  // already where it belongs.
  out->gathered_in_place.assign(kN * kRanks, -1.0f);
  std::copy(local.begin(), local.end(), out->gathered_in_place.begin() + r * kN);
  tp.AllGather(at(out->gathered_in_place.data() + r * kN), at(out->gathered_in_place.data()), kN);
  std::vector<float> full(kN * kRanks);
  for (int i = 0; i < kN * kRanks; ++i) full[i] = float(i + r);
  out->scattered.resize(kN);
  tp.ReduceScatterSum(at(full.data()), at(out->scattered.data()), kN);
  ASSERT_TRUE(tp.Finish().ok()) << tp.status();
  out->bytes = tp.TakeBytes();
  out->calls = tp.calls();
}

TEST(TensorParallelGroupTest, DeviceMemoryGroupOrdersOnTheDeviceAndEqualsTheHostGroup) {
  std::vector<Results> host(kRanks), device(kRanks);
  std::vector<int> ops(kRanks), host_ops(kRanks), unordered(kRanks);
  comm::testing::RunRanks(kRanks, [&](comm::Communicator& c) {
    TensorParallelGroup tp(&c);
    EXPECT_FALSE(tp.device_memory());
    Exercise(tp, false, &host[c.rank()]);
  });
  comm::testing::RunRanks(kRanks, [&](comm::Communicator& c) {
    DeviceMemoryComm d(c);
    engine::cpu::CpuDevice cpu;
    TensorParallelGroup tp(&d);
    EXPECT_TRUE(tp.device_memory());
    tp.set_device(&cpu);
    Exercise(tp, true, &device[c.rank()]);
    ops[c.rank()] = d.ops();
    host_ops[c.rank()] = d.host_ops();
    unordered[c.rank()] = d.unordered();
  });
  for (int r = 0; r < kRanks; ++r) {
    SCOPED_TRACE(r);
    const Results &h = host[r], &d = device[r];
    for (int i = 0; i < kN; ++i) {
      EXPECT_FLOAT_EQ(h.sum[i], (0 + 10 + 20 + 3 * i) * 0.25f);
      EXPECT_FLOAT_EQ(h.max[i], (20 + i) * 0.25f);
      // full[r·kN + i] summed over ranks q of (r·kN + i + q).
      EXPECT_FLOAT_EQ(h.scattered[i], float(3 * (r * kN + i) + 0 + 1 + 2));
    }
    for (int q = 0; q < kRanks; ++q) {
      for (int i = 0; i < kN; ++i) EXPECT_EQ(h.gathered[q * kN + i], float(100 * q + i));
    }
    EXPECT_EQ(h.gathered_in_place, h.gathered);
    EXPECT_EQ(d.sum, h.sum);
    EXPECT_EQ(d.max, h.max);
    EXPECT_EQ(d.gathered, h.gathered);
    EXPECT_EQ(d.gathered_in_place, h.gathered);
    EXPECT_EQ(d.scattered, h.scattered);
    EXPECT_EQ(d.bytes, h.bytes);
    EXPECT_EQ(d.calls, 5);
    EXPECT_EQ(ops[r], 5);
    EXPECT_EQ(host_ops[r], 0) << "collectives on host memory";
    EXPECT_EQ(unordered[r], 0) << "reductions not ordered after the device's work";
  }
  std::printf(
      "[tp-group] %d ranks: sum, max, gather (also in place), reduce-scatter equal over host and "
      "device memory; %lld bytes sent per rank either way\n",
      kRanks, static_cast<long long>(host[0].bytes));
}

// A device-memory group must know the device whose stream orders its ops:
// without one the first call fails (FAILED_PRECONDITION), nothing is sent,
// and later calls do nothing.
TEST(TensorParallelGroupTest, DeviceMemoryGroupWithoutItsDeviceFailsWithoutSending) {
  comm::testing::RunRanks(2, [&](comm::Communicator& c) {
    DeviceMemoryComm d(c);
    TensorParallelGroup tp(&d);
    std::vector<float> x(4, 1.0f);
    tp.AllReduceSum(ToDevice(x.data()), x.size());
    tp.AllReduceMax(ToDevice(x.data()), x.size());
    EXPECT_EQ(tp.Finish().code(), absl::StatusCode::kFailedPrecondition) << tp.status();
    EXPECT_NE(tp.status().message().find("set_device"), std::string::npos) << tp.status();
    EXPECT_EQ(d.ops(), 0);
    EXPECT_EQ(x, std::vector<float>(4, 1.0f));
  });
}

}  // namespace
}  // namespace shardtrain::parallel
