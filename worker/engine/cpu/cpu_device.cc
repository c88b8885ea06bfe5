#include "worker/engine/cpu/cpu_device.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/engine/cpu/page_buffer.h"

namespace shardtrain::engine::cpu {
namespace {

class HostStream final : public Stream {
 public:
  absl::Status Synchronize() override { return absl::OkStatus(); }
  // Host work ran when it was issued: whatever the event marks is done.
  absl::Status WaitEvent(const Event& event) override { return event.Synchronize(); }
  void* native() const override { return nullptr; }
};

class HostEvent final : public Event {
 public:
  absl::Status Record(Stream&) override { return absl::OkStatus(); }
  absl::Status Synchronize() const override { return absl::OkStatus(); }
  bool Query() const override { return true; }
  void* native() const override { return nullptr; }
};

class HostBuffer final : public Buffer {
 public:
  explicit HostBuffer(PageBuffer pages)
      : Buffer(pages.data(), pages.size(), DataType::kFloat32, DeviceKind::kCpu),
        pages_(std::move(pages)) {}
  void Release(size_t begin, size_t n) override { pages_.Release(begin, n); }
  int64_t ResidentBytes(size_t begin, size_t n) const override {
    return pages_.ResidentBytes(begin, n);
  }
  void SetReleaseBoundary(size_t offset) override { pages_.NoHugePagesAt(offset); }

 private:
  PageBuffer pages_;  // moving it keeps its mapping (and so data()) unchanged
};

}  // namespace

CpuDevice::CpuDevice() : stream_(std::make_unique<HostStream>()) {}

absl::StatusOr<std::unique_ptr<Buffer>> CpuDevice::Allocate(size_t count, DataType dtype) {
  if (dtype != DataType::kFloat32) {
    return absl::UnimplementedError(
        absl::StrCat("the CPU device holds fp32 buffers only, not ", DataTypeName(dtype)));
  }
  return std::unique_ptr<Buffer>(new HostBuffer(PageBuffer(count)));
}

absl::StatusOr<std::unique_ptr<Stream>> CpuDevice::NewStream() {
  return std::unique_ptr<Stream>(new HostStream());
}

absl::StatusOr<std::unique_ptr<Event>> CpuDevice::NewEvent() {
  return std::unique_ptr<Event>(new HostEvent());
}

}  // namespace shardtrain::engine::cpu
