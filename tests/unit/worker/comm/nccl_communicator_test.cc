// NCCL backend. The unique-id exchange runs on any machine (ncclGetUniqueId
// needs no GPU); collective tests GTEST_SKIP without enough CUDA devices.
#include "worker/comm/nccl_communicator.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/comm/test_util.h"
#include "worker/comm/rendezvous_store.h"
#include "worker/engine/cuda/cuda_device.h"

namespace shardtrain::comm {
namespace {

using testing::TestValue;
using testing::TypedBuffer;

int DeviceCount() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

TEST(NcclUniqueIdTest, ExchangedThroughTheStore) {
  for (bool file : {false, true}) {
    std::shared_ptr<RendezvousStore> store;
    std::string dir;
    if (file) {
      char tmpl[] = "/tmp/shardtrain_nccl_XXXXXX";
      ASSERT_NE(mkdtemp(tmpl), nullptr);
      store = std::make_shared<FileStore>(tmpl);
      dir = tmpl;
    } else {
      store = std::make_shared<InMemoryStore>();
    }
    constexpr int kWorld = 4;
    std::vector<std::string> ids(kWorld);
    std::vector<std::thread> threads;
    for (int r = 0; r < kWorld; ++r) {
      threads.emplace_back([&, r] {
        if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(30));
        auto id = ExchangeNcclUniqueId(*store, "job1/gen0/world/nccl_id", r, absl::Seconds(10));
        ASSERT_TRUE(id.ok()) << id.status();
        ids[r] = *id;
      });
    }
    for (auto& t : threads) t.join();
    ASSERT_EQ(ids[0].size(), 128u);
    EXPECT_NE(ids[0], std::string(128, '\0'));
    for (int r = 1; r < kWorld; ++r) EXPECT_EQ(ids[r], ids[0]) << "rank " << r;
    if (!dir.empty()) std::filesystem::remove_all(dir);
  }
}

TEST(NcclUniqueIdTest, NonRootTimesOutNamingTheKey) {
  InMemoryStore store;
  auto id = ExchangeNcclUniqueId(store, "job1/gen0/tp0/nccl_id", 1, absl::Milliseconds(50));
  EXPECT_EQ(id.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(id.status().message().find("job1/gen0/tp0/nccl_id"), std::string::npos);
}

TEST(NcclCommunicatorTest, CreateWithoutDeviceFailsCleanly) {
  if (DeviceCount() > 0) GTEST_SKIP() << "a CUDA device is present";
  auto comm = CreateNcclCommunicator(std::make_shared<InMemoryStore>(), 0, 1, NcclOptions());
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kFailedPrecondition) << comm.status();
}

// Runs body on `world` threads, rank r on device r.
void RunNcclRanks(int world, const std::function<void(Communicator&)>& body,
                  NcclOptions options = NcclOptions()) {
  auto store = std::make_shared<InMemoryStore>();
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      NcclOptions o = options;
      o.device = r;
      cudaSetDevice(r);
      auto comm = CreateNcclCommunicator(store, r, world, o);
      ASSERT_TRUE(comm.ok()) << comm.status();
      body(**comm);
      EXPECT_TRUE((*comm)->Shutdown().ok() || !(*comm)->health().ok());
    });
  }
  for (auto& t : threads) t.join();
}

// Device copy of a TypedBuffer.
struct DeviceBuffer {
  DeviceBuffer(size_t bytes) : bytes(bytes) {
    EXPECT_EQ(cudaMalloc(&ptr, std::max<size_t>(bytes, 16)), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  void From(TypedBuffer& h) { cudaMemcpy(ptr, h.data(), bytes, cudaMemcpyHostToDevice); }
  void To(TypedBuffer& h) { cudaMemcpy(h.data(), ptr, bytes, cudaMemcpyDeviceToHost); }
  void* ptr = nullptr;
  size_t bytes;
};

TEST(NcclCommunicatorTest, CollectivesMatchReference) {
  const int devices = DeviceCount();
  if (devices < 1) GTEST_SKIP() << "no CUDA device";
  const int world = std::min(devices, 4);
  for (DataType dtype : {DataType::kFloat32, DataType::kBFloat16, DataType::kFloat16}) {
    RunNcclRanks(world, [&](Communicator& comm) {
      const size_t esz = DataTypeSize(dtype);
      for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}, size_t{100003}}) {
        // AllReduce sum.
        TypedBuffer h(dtype, count);
        for (size_t i = 0; i < count; ++i) h.Set(i, TestValue(comm.rank(), i));
        DeviceBuffer d(count * esz);
        d.From(h);
        ASSERT_TRUE(comm.AllReduce(d.ptr, count, dtype, ReduceOp::kSum).ok());
        d.To(h);
        for (size_t i = 0; i < count; ++i) {
          float want = 0;
          for (int r = 0; r < world; ++r) want += TestValue(r, i);
          ASSERT_EQ(h.Get(i), want) << "allreduce i=" << i;
        }
        // AllGather.
        TypedBuffer in(dtype, count), out(dtype, count * world);
        for (size_t i = 0; i < count; ++i) in.Set(i, TestValue(comm.rank(), i));
        DeviceBuffer din(count * esz), dout(count * world * esz);
        din.From(in);
        ASSERT_TRUE(comm.AllGather(din.ptr, dout.ptr, count, dtype).ok());
        dout.To(out);
        for (size_t j = 0; j < count * world; ++j) {
          ASSERT_EQ(out.Get(j), TestValue(static_cast<int>(j / count), j % count));
        }
        // ReduceScatter max.
        TypedBuffer rs_in(dtype, count * world), rs_out(dtype, count);
        for (size_t j = 0; j < count * world; ++j) rs_in.Set(j, TestValue(comm.rank(), j));
        DeviceBuffer drs_in(count * world * esz), drs_out(count * esz);
        drs_in.From(rs_in);
        ASSERT_TRUE(comm.ReduceScatter(drs_in.ptr, drs_out.ptr, count, dtype, ReduceOp::kMax).ok());
        drs_out.To(rs_out);
        for (size_t i = 0; i < count; ++i) {
          float want = TestValue(0, comm.rank() * count + i);
          for (int r = 1; r < world; ++r) {
            want = std::max(want, TestValue(r, comm.rank() * count + i));
          }
          ASSERT_EQ(rs_out.Get(i), want);
        }
        // Broadcast from the last rank.
        for (size_t i = 0; i < count; ++i) h.Set(i, TestValue(comm.rank(), i));
        d.From(h);
        ASSERT_TRUE(comm.Broadcast(d.ptr, count, dtype, world - 1).ok());
        d.To(h);
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(h.Get(i), TestValue(world - 1, i));
      }
      ASSERT_TRUE(comm.Barrier().ok());
    });
  }
}

void CUDART_CB Sleep1s(void*) { std::this_thread::sleep_for(std::chrono::seconds(1)); }

// OpArgs::after and Work::BlockStream with a CudaDevice, world 1. A host
// function holds the compute stream for 1 s, then the inputs are copied
// in and an event is recorded. The ops wait for that event on the device:
// Submit and BlockStream return at once and the ops are not done. The copy
// of the outputs to the host, issued to the compute stream after
// BlockStream, must see the results: the all-gather (out of place) copies
// what was there only after the event, zeros before it.
TEST(NcclCommunicatorTest, OrderedAfterAnEventAndBeforeAStream) {
  if (DeviceCount() < 1) GTEST_SKIP() << "no CUDA device";
  auto dev = engine::cuda::CudaDevice::Create(0);
  ASSERT_TRUE(dev.ok()) << dev.status();
  RunNcclRanks(1, [&](Communicator& comm) {
    engine::Stream& compute = (*dev)->compute_stream();
    cudaStream_t cs = static_cast<cudaStream_t>(compute.native());
    const size_t n = 1 << 20, bytes = n * sizeof(float);
    auto in = (*dev)->Allocate(n, DataType::kFloat32);
    auto out = (*dev)->Allocate(n, DataType::kFloat32);
    auto data = (*dev)->Allocate(n, DataType::kFloat32);
    auto ready = (*dev)->NewEvent();
    ASSERT_TRUE(in.ok() && out.ok() && data.ok() && ready.ok());
    float *h_in = nullptr, *h_out = nullptr, *h_data = nullptr;
    ASSERT_EQ(cudaMallocHost(&h_in, bytes), cudaSuccess);
    ASSERT_EQ(cudaMallocHost(&h_out, bytes), cudaSuccess);
    ASSERT_EQ(cudaMallocHost(&h_data, bytes), cudaSuccess);
    for (size_t i = 0; i < n; ++i) h_in[i] = TestValue(0, i) + 100.0f;
    std::memset(h_out, 0, bytes);
    std::memset(h_data, 0, bytes);

    // Warm-up, so that first-launch costs do not count below.
    ASSERT_TRUE(comm.AllGather((*in)->data(), (*out)->data(), n, DataType::kFloat32).ok());
    ASSERT_TRUE(comm.AllReduce((*data)->data(), n, DataType::kFloat32, ReduceOp::kSum).ok());

    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(cudaLaunchHostFunc(cs, Sleep1s, nullptr), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync((*in)->data(), h_in, bytes, cudaMemcpyHostToDevice, cs), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync((*data)->data(), h_in, bytes, cudaMemcpyHostToDevice, cs),
              cudaSuccess);
    ASSERT_TRUE((*ready)->Record(compute).ok());
    auto gather =
        comm.AllGatherAsync((*in)->data(), (*out)->data(), n, DataType::kFloat32, ready->get());
    auto reduce =
        comm.AllReduceAsync((*data)->data(), n, DataType::kFloat32, ReduceOp::kSum, ready->get());
    EXPECT_FALSE(gather->Done()) << "the op finished before its event";
    EXPECT_FALSE(reduce->Done()) << "the op finished before its event";
    ASSERT_TRUE(gather->BlockStream(compute).ok());
    ASSERT_TRUE(reduce->BlockStream(compute).ok());
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(500))
        << "Submit or BlockStream blocked the host";
    ASSERT_EQ(cudaMemcpyAsync(h_out, (*out)->data(), bytes, cudaMemcpyDeviceToHost, cs),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(h_data, (*data)->data(), bytes, cudaMemcpyDeviceToHost, cs),
              cudaSuccess);
    ASSERT_TRUE(compute.Synchronize().ok());
    EXPECT_TRUE(gather->Wait(absl::Seconds(10)).ok());
    EXPECT_TRUE(reduce->Wait(absl::Seconds(10)).ok());
    size_t wrong_out = 0, wrong_data = 0;
    for (size_t i = 0; i < n; ++i) {
      wrong_out += h_out[i] != h_in[i];
      wrong_data += h_data[i] != h_in[i];
    }
    EXPECT_EQ(wrong_out, 0u) << "all-gather output, e.g. [0] = " << h_out[0] << " want " << h_in[0];
    EXPECT_EQ(wrong_data, 0u) << "all-reduce output, e.g. [0] = " << h_data[0] << " want "
                              << h_in[0];
    cudaFreeHost(h_in);
    cudaFreeHost(h_out);
    cudaFreeHost(h_data);
  });
}

TEST(NcclCommunicatorTest, MissingRankTimesOutAndPoisons) {
  if (DeviceCount() < 2) GTEST_SKIP() << "needs two CUDA devices";
  NcclOptions options;
  options.timeout = absl::Seconds(2);
  options.dump_on_failure = false;
  RunNcclRanks(
      2,
      [&](Communicator& comm) {
        DeviceBuffer d(4096);
        if (comm.rank() == 1) {
          std::this_thread::sleep_for(std::chrono::seconds(5));
          return;
        }
        const absl::Time t0 = absl::Now();
        absl::Status s = comm.AllReduce(d.ptr, 1024, DataType::kFloat32, ReduceOp::kSum);
        EXPECT_LT(absl::Now() - t0, absl::Seconds(2 + 2));
        EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
        EXPECT_NE(s.message().find("ranks not arrived (dead, hung or behind): [1]"),
                  std::string::npos)
            << s;
        EXPECT_EQ(comm.Barrier().code(), absl::StatusCode::kFailedPrecondition);
      },
      options);
}

}  // namespace
}  // namespace shardtrain::comm
