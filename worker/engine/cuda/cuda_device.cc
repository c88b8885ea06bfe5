#include "worker/engine/cuda/cuda_device.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace shardtrain::engine::cuda {
namespace {

// "<call> on cuda:N: CUDA error <code> <name> (<text>)", coded by what the
// caller can do about it.
absl::Status CudaError(cudaError_t e, absl::string_view call, int ordinal) {
  const std::string msg =
      absl::StrCat(call, " on cuda:", ordinal, ": CUDA error ", static_cast<int>(e), " ",
                   cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
  switch (e) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(msg);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
      return absl::FailedPreconditionError(msg);
    default:
      return absl::InternalError(msg);
  }
}

}  // namespace

class CudaStream final : public Stream {
 public:
  CudaStream(int ordinal, cudaStream_t stream) : ordinal_(ordinal), stream_(stream) {}
  ~CudaStream() override {
    cudaSetDevice(ordinal_);
    cudaStreamDestroy(stream_);
  }

  static absl::StatusOr<std::unique_ptr<CudaStream>> Create(int ordinal) {
    cudaError_t e = cudaSetDevice(ordinal);
    if (e != cudaSuccess) return CudaError(e, "cudaSetDevice", ordinal);
    cudaStream_t s = nullptr;
    e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (e != cudaSuccess) return CudaError(e, "cudaStreamCreateWithFlags", ordinal);
    return std::make_unique<CudaStream>(ordinal, s);
  }

  absl::Status Synchronize() override {
    cudaError_t e = cudaStreamSynchronize(stream_);
    if (e != cudaSuccess) return CudaError(e, "cudaStreamSynchronize", ordinal_);
    return absl::OkStatus();
  }

  absl::Status WaitEvent(const Event& event) override {
    if (event.native() == nullptr) return event.Synchronize();  // a host event
    cudaError_t e = cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(event.native()), 0);
    if (e != cudaSuccess) return CudaError(e, "cudaStreamWaitEvent", ordinal_);
    return absl::OkStatus();
  }

  void* native() const override { return stream_; }
  cudaStream_t get() const { return stream_; }

 private:
  const int ordinal_;
  const cudaStream_t stream_;
};

namespace {

class CudaEvent final : public Event {
 public:
  CudaEvent(int ordinal, cudaEvent_t event) : ordinal_(ordinal), event_(event) {}
  ~CudaEvent() override { cudaEventDestroy(event_); }

  absl::Status Record(Stream& stream) override {
    if (stream.native() == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot record a CUDA event of cuda:", ordinal_, " on a host stream"));
    }
    cudaError_t e = cudaEventRecord(event_, static_cast<cudaStream_t>(stream.native()));
    if (e != cudaSuccess) return CudaError(e, "cudaEventRecord", ordinal_);
    return absl::OkStatus();
  }

  absl::Status Synchronize() const override {
    cudaError_t e = cudaEventSynchronize(event_);
    if (e != cudaSuccess) return CudaError(e, "cudaEventSynchronize", ordinal_);
    return absl::OkStatus();
  }

  bool Query() const override { return cudaEventQuery(event_) != cudaErrorNotReady; }
  void* native() const override { return event_; }

 private:
  const int ordinal_;
  const cudaEvent_t event_;
};

class CudaBuffer final : public Buffer {
 public:
  CudaBuffer(void* data, size_t count, DataType dtype, int ordinal,
             std::shared_ptr<CudaStream> compute)
      : Buffer(data, count, dtype, DeviceKind::kCuda),
        ordinal_(ordinal),
        compute_(std::move(compute)) {}
  ~CudaBuffer() override {
    if (data() == nullptr) return;
    cudaSetDevice(ordinal_);
    cudaFree(data());
  }

  void Release(size_t begin, size_t n) override {
    if (n == 0) return;
    const size_t esz = DataTypeSize(dtype());
    cudaSetDevice(ordinal_);
    cudaMemsetAsync(static_cast<char*>(data()) + begin * esz, 0, n * esz, compute_->get());
  }

  int64_t ResidentBytes(size_t begin, size_t n) const override {
    begin = std::min(begin, count());
    n = std::min(n, count() - begin);
    return static_cast<int64_t>(n * DataTypeSize(dtype()));
  }

  void SetReleaseBoundary(size_t) override {}

 private:
  const int ordinal_;
  const std::shared_ptr<CudaStream> compute_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CudaDevice>> CudaDevice::Create(int ordinal) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no cuda:", ordinal, ": cudaGetDeviceCount failed with CUDA error ", static_cast<int>(e),
        " ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
  }
  if (ordinal < 0 || ordinal >= n) {
    return absl::FailedPreconditionError(
        absl::StrCat("no cuda:", ordinal, ": cudaGetDeviceCount reports ", n, " device(s)"));
  }
  absl::StatusOr<std::unique_ptr<CudaStream>> compute = CudaStream::Create(ordinal);
  if (!compute.ok()) return compute.status();
  absl::StatusOr<std::unique_ptr<CudaStream>> zero = CudaStream::Create(ordinal);
  if (!zero.ok()) return zero.status();
  return std::unique_ptr<CudaDevice>(
      new CudaDevice(ordinal, std::shared_ptr<CudaStream>(std::move(*compute)), std::move(*zero)));
}

CudaDevice::CudaDevice(int ordinal, std::shared_ptr<CudaStream> compute,
                       std::unique_ptr<CudaStream> zero)
    : ordinal_(ordinal),
      name_(absl::StrCat("cuda:", ordinal)),
      compute_(std::move(compute)),
      zero_(std::move(zero)) {}

CudaDevice::~CudaDevice() = default;

Stream& CudaDevice::compute_stream() { return *compute_; }

absl::StatusOr<std::unique_ptr<Buffer>> CudaDevice::Allocate(size_t count, DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32:
    case DataType::kBFloat16:
    case DataType::kFloat16:
      break;
    default:
      return absl::UnimplementedError(absl::StrCat(name_, " holds fp32, bf16 and fp16 only"));
  }
  const size_t bytes = count * DataTypeSize(dtype);
  void* ptr = nullptr;
  if (bytes > 0) {
    cudaError_t e = cudaSetDevice(ordinal_);
    if (e != cudaSuccess) return CudaError(e, "cudaSetDevice", ordinal_);
    e = cudaMalloc(&ptr, bytes);
    if (e != cudaSuccess) {
      cudaGetLastError();  // an out-of-memory error is not sticky: clear it
      return CudaError(e, absl::StrCat("cudaMalloc of ", bytes, " bytes"), ordinal_);
    }
    e = cudaMemsetAsync(ptr, 0, bytes, zero_->get());
    absl::string_view call = "cudaMemsetAsync";
    if (e == cudaSuccess) {
      e = cudaStreamSynchronize(zero_->get());
      call = "cudaStreamSynchronize";
    }
    if (e != cudaSuccess) {
      cudaFree(ptr);
      return CudaError(e, call, ordinal_);
    }
  }
  return std::unique_ptr<Buffer>(new CudaBuffer(ptr, count, dtype, ordinal_, compute_));
}

absl::StatusOr<std::unique_ptr<Stream>> CudaDevice::NewStream() {
  absl::StatusOr<std::unique_ptr<CudaStream>> s = CudaStream::Create(ordinal_);
  if (!s.ok()) return s.status();
  return std::unique_ptr<Stream>(std::move(*s));
}

absl::StatusOr<std::unique_ptr<Event>> CudaDevice::NewEvent() {
  cudaError_t e = cudaSetDevice(ordinal_);
  if (e != cudaSuccess) return CudaError(e, "cudaSetDevice", ordinal_);
  cudaEvent_t event = nullptr;
  e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
  if (e != cudaSuccess) return CudaError(e, "cudaEventCreateWithFlags", ordinal_);
  return std::unique_ptr<Event>(new CudaEvent(ordinal_, event));
}

}  // namespace shardtrain::engine::cuda
