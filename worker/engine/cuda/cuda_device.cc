#include "worker/engine/cuda/cuda_device.h"

#include <cuda.h>  // the driver's types; libcuda itself is opened at run time
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

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

// The driver's virtual memory management, from libcuda.so.1 opened at run
// time (binaries never link the driver library). Null members: not offered.
struct VmmApi {
  decltype(&::cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&::cuMemAddressReserve) reserve = nullptr;
  decltype(&::cuMemAddressFree) free_addresses = nullptr;
  decltype(&::cuMemCreate) create = nullptr;
  decltype(&::cuMemRelease) release = nullptr;
  decltype(&::cuMemMap) map = nullptr;
  decltype(&::cuMemUnmap) unmap = nullptr;
  decltype(&::cuMemSetAccess) set_access = nullptr;
  decltype(&::cuGetErrorString) error_string = nullptr;
  bool ok() const {
    return granularity && reserve && free_addresses && create && release && map && unmap &&
           set_access;
  }
};

const VmmApi& Vmm() {
  static const VmmApi api = [] {
    VmmApi a;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return a;
    const auto get = [lib](auto* fn, const char* name) {
      *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(dlsym(lib, name));
    };
    get(&a.granularity, "cuMemGetAllocationGranularity");
    get(&a.reserve, "cuMemAddressReserve");
    get(&a.free_addresses, "cuMemAddressFree");
    get(&a.create, "cuMemCreate");
    get(&a.release, "cuMemRelease");
    get(&a.map, "cuMemMap");
    get(&a.unmap, "cuMemUnmap");
    get(&a.set_access, "cuMemSetAccess");
    get(&a.error_string, "cuGetErrorString");
    return a;
  }();
  return api;
}

std::string DriverError(CUresult r, absl::string_view call, int ordinal) {
  const char* text = nullptr;
  if (Vmm().error_string != nullptr) Vmm().error_string(r, &text);
  return absl::StrCat(call, " on cuda:", ordinal, ": CUDA driver error ", static_cast<int>(r), " (",
                      text != nullptr ? text : "?", ")");
}

// Device memory at reserved addresses, backed granule by granule while
// taken (cuda_device.h, AllocateReleasable).
class ReleasableBuffer final : public Buffer {
 public:
  ~ReleasableBuffer() override {
    cudaSetDevice(ordinal_);
    cudaStreamSynchronize(compute_->get());
    for (size_t g = 0; g < handles_.size(); ++g) Unmap(g);
    Vmm().free_addresses(base_, reserved_);
  }

  static absl::StatusOr<std::unique_ptr<Buffer>> Create(size_t count, DataType dtype, int ordinal,
                                                        std::shared_ptr<CudaStream> compute) {
    const VmmApi& vmm = Vmm();
    if (!vmm.ok()) return absl::UnimplementedError("no virtual memory management in libcuda");
    CUmemAllocationProp prop = Prop(ordinal);
    size_t granule = 0;
    CUresult r = vmm.granularity(&granule, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (r != CUDA_SUCCESS || granule == 0) {
      return absl::UnimplementedError(DriverError(r, "cuMemGetAllocationGranularity", ordinal));
    }
    const size_t bytes = std::max<size_t>(1, count * DataTypeSize(dtype));
    const size_t granules = (bytes + granule - 1) / granule;
    CUdeviceptr base = 0;
    r = vmm.reserve(&base, granules * granule, 0, 0, 0);
    if (r != CUDA_SUCCESS) {
      return absl::ResourceExhaustedError(DriverError(r, "cuMemAddressReserve", ordinal));
    }
    std::unique_ptr<ReleasableBuffer> b(new ReleasableBuffer(reinterpret_cast<void*>(base), count,
                                                             dtype, ordinal, std::move(compute),
                                                             base, granule, granules));
    // Everything taken and zeroed, as Allocate's buffers start.
    if (absl::Status s = b->MapRange(0, granules); !s.ok()) return s;
    cudaError_t e = cudaStreamSynchronize(b->compute_->get());
    if (e != cudaSuccess) return CudaError(e, "cudaStreamSynchronize", ordinal);
    return std::unique_ptr<Buffer>(std::move(b));
  }

  void Release(size_t begin, size_t n) override {
    if (n == 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    cudaSetDevice(ordinal_);
    const size_t esz = DataTypeSize(dtype());
    // A range up to the end also covers the last granule's unused tail.
    const size_t b0 = begin * esz, b1 = begin + n >= count() ? reserved_ : (begin + n) * esz;
    bool waited = false;
    for (size_t g = b0 / granule_; g * granule_ < b1; ++g) {
      const size_t g0 = g * granule_, g1 = g0 + granule_;
      if (handles_[g] == 0) continue;  // given back already: zeros
      if (g0 >= b0 && g1 <= b1) {
        if (!waited) {  // no queued kernel may still use what goes
          Fatal(cudaStreamSynchronize(compute_->get()), "cudaStreamSynchronize");
          waited = true;
        }
        Unmap(g);
      } else {  // shared with a neighbour: zero only this range's part
        const size_t lo = std::max(b0, g0), hi = std::min({b1, g1, count() * esz});
        Fatal(cudaMemsetAsync(Bytes(lo), 0, hi - lo, compute_->get()), "cudaMemsetAsync");
      }
    }
  }

  void Acquire(size_t begin, size_t n) override {
    if (n == 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    cudaSetDevice(ordinal_);
    const size_t esz = DataTypeSize(dtype());
    const size_t b0 = begin * esz, b1 = (begin + n) * esz;
    const size_t first = b0 / granule_, last = (b1 + granule_ - 1) / granule_;
    if (absl::Status s = MapRange(first, last); !s.ok()) {
      std::fprintf(stderr, "ReleasableBuffer::Acquire: %s\n", std::string(s.message()).c_str());
      std::abort();
    }
  }

  int64_t ResidentBytes(size_t begin, size_t n) const override {
    std::lock_guard<std::mutex> lock(mu_);
    const size_t esz = DataTypeSize(dtype());
    begin = std::min(begin, count());
    n = std::min(n, count() - begin);
    const size_t b0 = begin * esz, b1 = (begin + n) * esz;
    int64_t held = 0;
    for (size_t g = b0 / granule_; g * granule_ < b1; ++g) {
      if (handles_[g] == 0) continue;
      held += int64_t(std::min(b1, (g + 1) * granule_) - std::max(b0, g * granule_));
    }
    return held;
  }

  void SetReleaseBoundary(size_t) override {}

 private:
  ReleasableBuffer(void* data, size_t count, DataType dtype, int ordinal,
                   std::shared_ptr<CudaStream> compute, CUdeviceptr base, size_t granule,
                   size_t granules)
      : Buffer(data, count, dtype, DeviceKind::kCuda),
        ordinal_(ordinal),
        compute_(std::move(compute)),
        base_(base),
        granule_(granule),
        reserved_(granule * granules),
        handles_(granules, 0) {}

  static CUmemAllocationProp Prop(int ordinal) {
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = ordinal;
    return prop;
  }
  char* Bytes(size_t offset) const { return reinterpret_cast<char*>(base_) + offset; }

  // Maps and zeroes (on the compute stream) the unmapped granules of
  // [first, last).
  absl::Status MapRange(size_t first, size_t last) {
    const VmmApi& vmm = Vmm();
    const CUmemAllocationProp prop = Prop(ordinal_);
    CUmemAccessDesc access = {};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    for (size_t g = first; g < last && g < handles_.size(); ++g) {
      if (handles_[g] != 0) continue;
      CUmemGenericAllocationHandle h = 0;
      CUresult r = vmm.create(&h, granule_, &prop, 0);
      if (r != CUDA_SUCCESS) {
        return absl::ResourceExhaustedError(DriverError(r, "cuMemCreate", ordinal_));
      }
      const CUdeviceptr at = base_ + g * granule_;
      r = vmm.map(at, granule_, 0, h, 0);
      if (r == CUDA_SUCCESS) r = vmm.set_access(at, granule_, &access, 1);
      if (r != CUDA_SUCCESS) {
        vmm.unmap(at, granule_);
        vmm.release(h);
        return absl::InternalError(DriverError(r, "cuMemMap/cuMemSetAccess", ordinal_));
      }
      handles_[g] = h;
      cudaError_t e = cudaMemsetAsync(Bytes(g * granule_), 0, granule_, compute_->get());
      if (e != cudaSuccess) return CudaError(e, "cudaMemsetAsync", ordinal_);
    }
    return absl::OkStatus();
  }

  void Unmap(size_t g) {
    if (handles_[g] == 0) return;
    Vmm().unmap(base_ + g * granule_, granule_);
    Vmm().release(handles_[g]);
    handles_[g] = 0;
  }

  void Fatal(cudaError_t e, const char* call) const {
    if (e == cudaSuccess) return;
    std::fprintf(stderr, "ReleasableBuffer::Release: %s\n",
                 std::string(CudaError(e, call, ordinal_).message()).c_str());
    std::abort();
  }

  const int ordinal_;
  const std::shared_ptr<CudaStream> compute_;
  const CUdeviceptr base_;
  const size_t granule_, reserved_;
  mutable std::mutex mu_;
  std::vector<CUmemGenericAllocationHandle> handles_;  // per granule; 0: unmapped
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

absl::StatusOr<std::unique_ptr<Buffer>> CudaDevice::AllocateReleasable(size_t count,
                                                                       DataType dtype) {
  if (dtype != DataType::kFloat32 && dtype != DataType::kBFloat16 && dtype != DataType::kFloat16) {
    return Allocate(count, dtype);  // its error
  }
  cudaError_t e = cudaSetDevice(ordinal_);
  if (e != cudaSuccess) return CudaError(e, "cudaSetDevice", ordinal_);
  absl::StatusOr<std::unique_ptr<Buffer>> b =
      ReleasableBuffer::Create(count, dtype, ordinal_, compute_);
  if (b.ok() || b.status().code() != absl::StatusCode::kUnimplemented) return b;
  static std::once_flag said;
  std::call_once(said, [&] {
    std::fprintf(stderr, "%s: %s; buffers keep their memory when released\n", name_.c_str(),
                 std::string(b.status().message()).c_str());
  });
  return Allocate(count, dtype);
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

namespace {

class CudaHostPin final : public HostPin {
 public:
  explicit CudaHostPin(void* p) : p_(p) {}
  ~CudaHostPin() override { cudaHostUnregister(p_); }

 private:
  void* const p_;
};

}  // namespace

std::unique_ptr<HostPin> CudaDevice::PinHost(void* p, size_t bytes) {
  if (p == nullptr || bytes == 0) return nullptr;
  const cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterPortable);
  if (e != cudaSuccess) {
    cudaGetLastError();  // not sticky; the copies stay pageable
    std::fprintf(stderr, "%s: cudaHostRegister of %zu bytes: %s; host copies stay pageable\n",
                 name_.c_str(), bytes, cudaGetErrorString(e));
    return nullptr;
  }
  return std::make_unique<CudaHostPin>(p);
}

}  // namespace shardtrain::engine::cuda
