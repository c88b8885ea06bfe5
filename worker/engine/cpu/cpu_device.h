// CpuDevice: the host as an engine::Device. Buffers are PageBuffers (their
// own anonymous mappings: released ranges go back to the OS, resident bytes
// measured with mincore); work runs on the issuing thread, so the host
// stream is always idle and a host event is complete once recorded.
//
// Buffers hold fp32 only: the CPU engine computes in fp32 (Allocate refuses
// other types with UNIMPLEMENTED). Thread-safe.
#ifndef SHARDTRAIN_WORKER_ENGINE_CPU_CPU_DEVICE_H_
#define SHARDTRAIN_WORKER_ENGINE_CPU_CPU_DEVICE_H_

#include <memory>
#include <string>

#include "worker/engine/device.h"

namespace shardtrain::engine::cpu {

class CpuDevice final : public Device {
 public:
  CpuDevice();
  DeviceKind kind() const override { return DeviceKind::kCpu; }
  const std::string& name() const override { return name_; }
  absl::StatusOr<std::unique_ptr<Buffer>> Allocate(size_t count, DataType dtype) override;
  Stream& compute_stream() override { return *stream_; }
  absl::StatusOr<std::unique_ptr<Stream>> NewStream() override;
  absl::StatusOr<std::unique_ptr<Event>> NewEvent() override;

 private:
  const std::string name_ = "cpu";
  std::unique_ptr<Stream> stream_;
};

}  // namespace shardtrain::engine::cpu

#endif  // SHARDTRAIN_WORKER_ENGINE_CPU_CPU_DEVICE_H_
