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
//           not. SetReleaseBoundary does nothing. Release cannot report
//           errors; a failed memset leaves the context's sticky error, which
//           the next call that checks reports (e.g. Stream::Synchronize).
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
  Stream& compute_stream() override;
  absl::StatusOr<std::unique_ptr<Stream>> NewStream() override;
  absl::StatusOr<std::unique_ptr<Event>> NewEvent() override;

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
