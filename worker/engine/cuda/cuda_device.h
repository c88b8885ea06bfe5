// CudaDevice: one GPU, "cuda:<ordinal>", as an engine::Device. The seam the
// GPU engine slots into; built only with CUDA (target shardtrain_engine_cuda)
// and on the CUDA runtime alone, never the driver library, so binaries still
// start on machines without a GPU (Create then fails cleanly).
//
//   Buffer  cudaMalloc'd fp32, bf16 or fp16, zero-filled before Allocate
//           returns. Release(begin, n) zeroes the range with a
//           cudaMemsetAsync ordered on the compute stream (after the work
//           issued to it before, before the work issued after; order other
//           streams with events) and returns immediately. Device memory is
//           NOT given back: a buffer holds all of it until destroyed, so
//           ResidentBytes(begin, n) is the bytes of the range, released or
//           not; Acquire does nothing. SetReleaseBoundary does nothing.
//           Release cannot report errors; a failed memset leaves the
//           context's sticky error, which the next call that checks reports
//           (e.g. Stream::Synchronize).
//   AllocateReleasable: a buffer that does give memory back (ZeRO-2/3's
//           parameters and gradients), built on the driver's virtual memory
//           management (cuMemAddressReserve, cuMemCreate, cuMemMap; libcuda
//           is opened at run time, never linked): the addresses are reserved
//           once and backed granule by granule (cuMemGetAllocationGranularity,
//           2 MiB on current GPUs). Release waits for the compute stream (no
//           kernel may still use what goes), unmaps the granules lying wholly
//           inside the range and zeroes the rest of it; Acquire maps the
//           unmapped granules overlapping its range again, zero-filled on the
//           compute stream; ResidentBytes counts mapped granules. A granule
//           shared by two ranges stays mapped while either needs it. Where
//           the driver offers no virtual memory management it falls back to
//           Allocate's buffer (saying so once on stderr). Failures inside
//           Release/Acquire abort the process with the driver's message (a
//           worker crash, recovered like any failed rank).
//   Stream  a cudaStream_t created non-blocking: it does not synchronise
//           with the legacy default stream. WaitEvent on a host event
//           (native() == nullptr) waits on the host.
//   Event   a cudaEvent_t created with cudaEventDisableTiming. Query() is
//           also true once the event failed (Synchronize() then returns the
//           error). Record on a host stream is INVALID_ARGUMENT.
//
// Errors name the CUDA call and the device: FAILED_PRECONDITION when the
// device is not there, RESOURCE_EXHAUSTED when memory runs out, INTERNAL for
// other CUDA errors. Every call makes the device current on the calling
// thread first (cudaSetDevice). Buffers, streams and events may outlive the
// CudaDevice object (buffers share its compute stream). Thread-safe.
#ifndef SHARDTRAIN_WORKER_ENGINE_CUDA_CUDA_DEVICE_H_
#define SHARDTRAIN_WORKER_ENGINE_CUDA_CUDA_DEVICE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/engine/device.h"

namespace shardtrain::engine::cuda {

class CudaStream;

class CudaDevice final : public Device {
 public:
  // The device `ordinal`, with its compute stream. FAILED_PRECONDITION when
  // the runtime finds no such device (no GPU or driver here, cudaGetDeviceCount
  // fails), INTERNAL when creating its streams fails.
  static absl::StatusOr<std::unique_ptr<CudaDevice>> Create(int ordinal);
  ~CudaDevice() override;

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  const std::string& name() const override { return name_; }
  int ordinal() const { return ordinal_; }

  absl::StatusOr<std::unique_ptr<Buffer>> Allocate(size_t count, DataType dtype) override;
  // As Allocate, a buffer whose Release gives device memory back (above).
  absl::StatusOr<std::unique_ptr<Buffer>> AllocateReleasable(size_t count, DataType dtype);
  Stream& compute_stream() override;
  absl::StatusOr<std::unique_ptr<Stream>> NewStream() override;
  absl::StatusOr<std::unique_ptr<Event>> NewEvent() override;
  std::unique_ptr<HostPin> PinHost(void* p, size_t bytes) override;

 private:
  CudaDevice(int ordinal, std::shared_ptr<CudaStream> compute, std::unique_ptr<CudaStream> zero);

  const int ordinal_;
  const std::string name_;
  // Shared with the buffers, whose Release is ordered on it.
  const std::shared_ptr<CudaStream> compute_;
  // Private: Allocate zeroes new memory here and waits for just that.
  const std::unique_ptr<CudaStream> zero_;
};

}  // namespace shardtrain::engine::cuda

#endif  // SHARDTRAIN_WORKER_ENGINE_CUDA_CUDA_DEVICE_H_
