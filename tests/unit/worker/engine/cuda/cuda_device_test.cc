// One GPU as an engine::Device: zero-filled buffers whose released ranges
// read back as zero (memory kept, so still resident; releasable buffers give
// whole granules back), non-blocking streams and events that order them. Tests that need a GPU
// GTEST_SKIP without one; the ones that check the failure without a GPU run anywhere.
#include "worker/engine/cuda/cuda_device.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

namespace shardtrain::engine::cuda {
namespace {

bool HaveDevice() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define SKIP_WITHOUT_GPU() \
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount failed or found none)"

// Pinned host memory, so async copies are truly asynchronous.
struct PinnedBytes {
  explicit PinnedBytes(size_t n) : size(n) {
    EXPECT_EQ(cudaMallocHost(&ptr, std::max<size_t>(n, 1)), cudaSuccess);
  }
  ~PinnedBytes() { cudaFreeHost(ptr); }
  unsigned char* bytes() { return static_cast<unsigned char*>(ptr); }
  void* ptr = nullptr;
  size_t size;
};

class HostStream final : public Stream {
 public:
  absl::Status Synchronize() override { return absl::OkStatus(); }
  absl::Status WaitEvent(const Event& event) override { return event.Synchronize(); }
  void* native() const override { return nullptr; }
};

void CUDART_CB Sleep300ms(void*) { std::this_thread::sleep_for(std::chrono::milliseconds(300)); }

TEST(CudaDeviceTest, CreateWithoutDeviceFailsNamingTheCall) {
  if (HaveDevice()) GTEST_SKIP() << "a CUDA device is present";
  absl::StatusOr<std::unique_ptr<CudaDevice>> d = CudaDevice::Create(0);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kFailedPrecondition) << d.status();
  EXPECT_NE(d.status().message().find("cudaGetDeviceCount"), std::string::npos) << d.status();
}

TEST(CudaDeviceTest, CreateRejectsAMissingOrdinal) {
  absl::StatusOr<std::unique_ptr<CudaDevice>> d = CudaDevice::Create(4096);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kFailedPrecondition) << d.status();
  EXPECT_NE(d.status().message().find("cuda:4096"), std::string::npos) << d.status();
}

TEST(CudaDeviceTest, AllocateZeroesReleaseZeroesTheRangeAndKeepsIt) {
  SKIP_WITHOUT_GPU();
  absl::StatusOr<std::unique_ptr<CudaDevice>> dev = CudaDevice::Create(0);
  ASSERT_TRUE(dev.ok()) << dev.status();
  CudaDevice& device = **dev;
  EXPECT_EQ(device.kind(), DeviceKind::kCuda);
  EXPECT_EQ(device.name(), "cuda:0");
  cudaStream_t compute = static_cast<cudaStream_t>(device.compute_stream().native());
  ASSERT_NE(compute, nullptr);
  for (DataType dtype : {DataType::kFloat32, DataType::kBFloat16, DataType::kFloat16}) {
    SCOPED_TRACE(DataTypeName(dtype));
    const size_t n = 100003, esz = DataTypeSize(dtype), bytes = n * esz;
    absl::StatusOr<std::unique_ptr<Buffer>> b = device.Allocate(n, dtype);
    ASSERT_TRUE(b.ok()) << b.status();
    Buffer& buf = **b;
    ASSERT_NE(buf.data(), nullptr);
    EXPECT_EQ(buf.count(), n);
    EXPECT_EQ(buf.dtype(), dtype);
    EXPECT_EQ(buf.bytes(), bytes);
    PinnedBytes host(bytes);
    std::memset(host.ptr, 0x5A, bytes);
    // Zero-filled when Allocate returns: read back on another stream.
    ASSERT_EQ(cudaMemcpy(host.ptr, buf.data(), bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    size_t nonzero = 0;
    for (size_t i = 0; i < bytes; ++i) nonzero += host.bytes()[i] != 0;
    EXPECT_EQ(nonzero, 0u) << "bytes not zero after Allocate";

    std::memset(host.ptr, 0xAB, bytes);
    ASSERT_EQ(cudaMemcpy(buf.data(), host.ptr, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    const size_t begin = 1000, count = 30001;
    buf.Release(begin, count);  // ordered on the compute stream
    std::memset(host.ptr, 0x11, bytes);
    ASSERT_EQ(cudaMemcpyAsync(host.ptr, buf.data(), bytes, cudaMemcpyDeviceToHost, compute),
              cudaSuccess);
    ASSERT_TRUE(device.compute_stream().Synchronize().ok());
    size_t wrong = 0;
    for (size_t i = 0; i < bytes; ++i) {
      const bool released = i >= begin * esz && i < (begin + count) * esz;
      wrong += host.bytes()[i] != (released ? 0x00 : 0xAB);
    }
    EXPECT_EQ(wrong, 0u) << "bytes wrong after Release(" << begin << ", " << count << ")";
    // Device memory is not given back: everything stays resident.
    EXPECT_EQ(buf.ResidentBytes(), static_cast<int64_t>(bytes));
    EXPECT_EQ(buf.ResidentBytes(begin, count), static_cast<int64_t>(count * esz));
    buf.SetReleaseBoundary(begin);
    buf.ReleaseAll();
    ASSERT_EQ(cudaMemcpyAsync(host.ptr, buf.data(), bytes, cudaMemcpyDeviceToHost, compute),
              cudaSuccess);
    ASSERT_TRUE(device.compute_stream().Synchronize().ok());
    nonzero = 0;
    for (size_t i = 0; i < bytes; ++i) nonzero += host.bytes()[i] != 0;
    EXPECT_EQ(nonzero, 0u) << "bytes not zero after ReleaseAll";
    EXPECT_EQ(buf.ResidentBytes(), static_cast<int64_t>(bytes));
  }
  absl::StatusOr<std::unique_ptr<Buffer>> empty = device.Allocate(0, DataType::kFloat32);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ((*empty)->count(), 0u);
  EXPECT_EQ((*empty)->ResidentBytes(), 0);
}

// AllocateReleasable: 5 MiB and a bit of fp32 (3 granules of 2 MiB on
// current GPUs). Release of a range covering a whole granule gives that
// granule back (ResidentBytes drops by it) and zeroes the rest of the range;
// Acquire maps it again zero-filled; the data outside the range is intact.
TEST(CudaDeviceTest, ReleasableBuffersGiveWholeGranulesBackAndAcquireRemapsThemZeroed) {
  SKIP_WITHOUT_GPU();
  absl::StatusOr<std::unique_ptr<CudaDevice>> dev = CudaDevice::Create(0);
  ASSERT_TRUE(dev.ok()) << dev.status();
  CudaDevice& device = **dev;
  cudaStream_t compute = static_cast<cudaStream_t>(device.compute_stream().native());
  const size_t n = (5u << 20) / 4 + 1001, bytes = n * 4;
  absl::StatusOr<std::unique_ptr<Buffer>> b = device.AllocateReleasable(n, DataType::kFloat32);
  ASSERT_TRUE(b.ok()) << b.status();
  Buffer& buf = **b;
  const int64_t all = buf.ResidentBytes();
  EXPECT_EQ(all, static_cast<int64_t>(bytes));
  PinnedBytes host(bytes);
  std::memset(host.ptr, 0xAB, bytes);
  ASSERT_EQ(cudaMemcpy(buf.data(), host.ptr, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  // Bytes [400, 400 + 4 MiB): the second 2 MiB granule lies inside, the
  // first and third only in part.
  const size_t begin = 100, count = (4u << 20) / 4;
  buf.Release(begin, count);
  EXPECT_EQ(buf.ResidentBytes(), all - (2 << 20)) << "one 2 MiB granule given back";
  buf.Acquire(begin, count);
  EXPECT_EQ(buf.ResidentBytes(), all);
  ASSERT_EQ(cudaMemcpyAsync(host.ptr, buf.data(), bytes, cudaMemcpyDeviceToHost, compute),
            cudaSuccess);
  ASSERT_TRUE(device.compute_stream().Synchronize().ok());
  size_t wrong = 0;
  for (size_t i = 0; i < bytes; ++i) {
    const bool released = i >= begin * 4 && i < (begin + count) * 4;
    wrong += host.bytes()[i] != (released ? 0x00 : 0xAB);
  }
  EXPECT_EQ(wrong, 0u) << "bytes wrong after Release and Acquire";
  buf.ReleaseAll();  // the last granule's unused tail counts as inside
  EXPECT_EQ(buf.ResidentBytes(), 0);
  buf.Acquire(0, n);
  EXPECT_EQ(buf.ResidentBytes(), all);
}

// A host function holds the compute stream; a copy issued after it and an
// event recorded after the copy. Another stream that waits for the event
// sees the copied data, and the host was not blocked meanwhile.
TEST(CudaDeviceTest, EventsOrderStreamsWithoutBlockingTheHost) {
  SKIP_WITHOUT_GPU();
  absl::StatusOr<std::unique_ptr<CudaDevice>> dev = CudaDevice::Create(0);
  ASSERT_TRUE(dev.ok()) << dev.status();
  CudaDevice& device = **dev;
  absl::StatusOr<std::unique_ptr<Stream>> other = device.NewStream();
  ASSERT_TRUE(other.ok()) << other.status();
  absl::StatusOr<std::unique_ptr<Event>> event = device.NewEvent();
  ASSERT_TRUE(event.ok()) << event.status();
  ASSERT_NE((*other)->native(), nullptr);
  ASSERT_NE((*event)->native(), nullptr);
  EXPECT_NE((*other)->native(), device.compute_stream().native());
  EXPECT_TRUE((*event)->Query());  // never recorded: done

  const size_t n = 1 << 20;
  absl::StatusOr<std::unique_ptr<Buffer>> buf = device.Allocate(n, DataType::kFloat32);
  ASSERT_TRUE(buf.ok()) << buf.status();
  PinnedBytes src(n * 4), dst(n * 4);
  float* s = static_cast<float*>(src.ptr);
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<float>(i % 1000) + 0.5f;
  std::memset(dst.ptr, 0, n * 4);

  cudaStream_t compute = static_cast<cudaStream_t>(device.compute_stream().native());
  cudaStream_t o = static_cast<cudaStream_t>((*other)->native());
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(cudaLaunchHostFunc(compute, Sleep300ms, nullptr), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync((*buf)->data(), src.ptr, n * 4, cudaMemcpyHostToDevice, compute),
            cudaSuccess);
  ASSERT_TRUE((*event)->Record(device.compute_stream()).ok());
  EXPECT_FALSE((*event)->Query()) << "the event completed while the stream was held";
  ASSERT_TRUE((*other)->WaitEvent(**event).ok());
  ASSERT_EQ(cudaMemcpyAsync(dst.ptr, (*buf)->data(), n * 4, cudaMemcpyDeviceToHost, o),
            cudaSuccess);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(150))
      << "issuing the ordered work blocked the host";
  ASSERT_TRUE((*other)->Synchronize().ok());
  EXPECT_TRUE((*event)->Query());
  EXPECT_TRUE((*event)->Synchronize().ok());
  EXPECT_EQ(std::memcmp(src.ptr, dst.ptr, n * 4), 0) << "the other stream did not wait";

  HostStream host;
  EXPECT_EQ((*event)->Record(host).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardtrain::engine::cuda
