// Device: the memory and the ordered work queues of what an engine computes
// on — the host (engine/cpu) or one GPU (engine/cuda). Engines allocate
// their flat buffers here, data-parallel strategies release and measure
// ranges of them, and collectives order themselves after a stream's work
// through events, so that the same strategy code runs on either.
//
//   Buffer  a flat, zero-filled array of one element type in the device's
//           memory; ranges can be given back (ZeRO-2/3 free the units they
//           do not hold) and what really holds memory can be measured.
//   Stream  an ordered queue of device work (a CUDA stream). On the host,
//           work runs on the calling thread when issued: a host stream is
//           always idle.
//   Event   a point in a stream's work; another stream or a collective can
//           be made to wait for it without blocking the host.
//
// Thread-safety: a Device, its Streams and Events may be used from any
// thread; a Buffer's Release and writes to the same range must not race
// (ResidentBytes may run concurrently with anything).
#ifndef SHARDTRAIN_WORKER_ENGINE_DEVICE_H_
#define SHARDTRAIN_WORKER_ENGINE_DEVICE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "common/job_spec.h"

namespace shardtrain::engine {

class Event;

class Stream {
 public:
  virtual ~Stream() = default;
  // Blocks the host until all work issued to this stream so far finished.
  virtual absl::Status Synchronize() = 0;
  // Work issued to this stream after this call starts only once `event`
  // completed; the host does not wait.
  virtual absl::Status WaitEvent(const Event& event) = 0;
  // The backend's handle (a cudaStream_t), or nullptr for a host stream.
  virtual void* native() const = 0;
};

class Event {
 public:
  virtual ~Event() = default;
  // Marks the current end of `stream`'s work: the event completes once all
  // work issued to `stream` before this call has.
  virtual absl::Status Record(Stream& stream) = 0;
  // Blocks the host until the event completed.
  virtual absl::Status Synchronize() const = 0;
  // True once the event completed or failed (Synchronize then returns the
  // failure); a never-recorded event counts as done. Callers that must not
  // block (the Gloo backend's op thread) poll this, then Synchronize.
  virtual bool Query() const = 0;
  // The backend's handle (a cudaEvent_t), or nullptr for a host event.
  virtual void* native() const = 0;
};

// A flat array on a device as the optimizer, data-parallel strategies and
// checkpoints see it: pointer, element count and type, and where it lives.
struct FlatView {
  void* data = nullptr;
  size_t count = 0;
  DataType dtype = DataType::kFloat32;
  DeviceKind device = DeviceKind::kCpu;

  size_t bytes() const { return count * DataTypeSize(dtype); }
  // The elements as host fp32. Precondition: dtype is kFloat32 and the memory
  // is the host's (aborts with a message otherwise: a programming error).
  absl::Span<float> f32() const;
};

class Buffer {
 public:
  virtual ~Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  size_t count() const { return count_; }  // elements
  DataType dtype() const { return dtype_; }
  DeviceKind device() const { return device_; }
  size_t bytes() const { return count_ * DataTypeSize(dtype_); }
  FlatView view() const { return FlatView{data_, count_, dtype_, device_}; }
  // The elements as T. Precondition: sizeof(T) == DataTypeSize(dtype());
  // dereferencing needs host-addressable memory.
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }

  // Sets elements [begin, begin + n) to zero and gives the memory lying
  // wholly inside the range back to the device. Host memory is taken again
  // when next written; device memory that was given back must be taken with
  // Acquire before anything reads or writes it again (a GPU cannot fault it
  // in). Precondition: begin + n <= count().
  virtual void Release(size_t begin, size_t n) = 0;
  void ReleaseAll() { Release(0, count_); }
  // Makes [begin, begin + n) memory again where Release gave it back, zero
  // filled (ordered like Release). A no-op where nothing was given back, and
  // on the host. Aborts when the device has no memory left for it.
  virtual void Acquire(size_t begin, size_t n) {
    (void)begin;
    (void)n;
  }
  // Bytes of the memory overlapping [begin, begin + n) that is held now.
  virtual int64_t ResidentBytes(size_t begin, size_t n) const = 0;
  int64_t ResidentBytes() const { return ResidentBytes(0, count_); }
  // A hint that ranges on either side of element `offset` are released and
  // taken independently (the host keeps huge pages from straddling it).
  virtual void SetReleaseBoundary(size_t offset) = 0;

 protected:
  Buffer(void* data, size_t count, DataType dtype, DeviceKind device)
      : data_(data), count_(count), dtype_(dtype), device_(device) {}

 private:
  void* const data_;
  const size_t count_;
  const DataType dtype_;
  const DeviceKind device_;
};

// Host memory page-locked for a device (see Device::PinHost) until this is
// destroyed.
class HostPin {
 public:
  virtual ~HostPin() = default;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual DeviceKind kind() const = 0;
  virtual const std::string& name() const = 0;  // "cpu", "cuda:0"

  // `count` zero elements of `dtype`. RESOURCE_EXHAUSTED when the device
  // cannot hold them (the host aborts instead, as operator new would);
  // UNIMPLEMENTED for a type the device does not hold.
  virtual absl::StatusOr<std::unique_ptr<Buffer>> Allocate(size_t count, DataType dtype) = 0;
  // The stream the engine computes on.
  virtual Stream& compute_stream() = 0;
  // A new stream (e.g. for communication that overlaps computation).
  virtual absl::StatusOr<std::unique_ptr<Stream>> NewStream() = 0;
  virtual absl::StatusOr<std::unique_ptr<Event>> NewEvent() = 0;
  // Page-locks host memory [p, p + bytes) (cudaHostRegister) so that copies
  // between it and the device run at the bus's speed rather than through a
  // driver bounce buffer, until the returned pin is destroyed (before the
  // memory is freed). nullptr where there is nothing to pin (the host) or
  // the device refused: copies then stay correct, only slower.
  virtual std::unique_ptr<HostPin> PinHost(void* p, size_t bytes) {
    (void)p;
    (void)bytes;
    return nullptr;
  }
};

}  // namespace shardtrain::engine

#endif  // SHARDTRAIN_WORKER_ENGINE_DEVICE_H_
