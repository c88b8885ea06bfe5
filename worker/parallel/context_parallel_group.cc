#include "worker/parallel/context_parallel_group.h"

#include "absl/strings/str_cat.h"

namespace shardtrain::parallel {
namespace {
// The tag of the ring's messages (pairs match per peer and tag, in order).
constexpr uint32_t kRingTag = 0x6370;  // "cp"
}  // namespace

void ContextParallelGroup::StartRingPass(const void* send, void* recv, size_t count,
                                         DataType dtype) {
  FinishRingPass();  // one pass at a time
  if (!status_.ok()) return;
  if (comm_->device_memory()) {
    status_ = absl::FailedPreconditionError(
        "parallel.cp: the ring passes host memory only so far (a communicator of device memory "
        "was given)");
    return;
  }
  const int n = comm_->size(), r = comm_->rank();
  ++passes_;
  bytes_ += static_cast<int64_t>(count * DataTypeSize(dtype));
  in_flight_ =
      comm_->SendRecvAsync(send, count, (r + 1) % n, recv, count, (r + n - 1) % n, dtype, kRingTag);
}

void ContextParallelGroup::FinishRingPass() {
  if (in_flight_ == nullptr) return;
  absl::Status s = in_flight_->Wait();
  in_flight_.reset();
  if (!s.ok() && status_.ok()) {
    status_ = absl::Status(s.code(), absl::StrCat("context-parallel ring pass: ", s.message()));
  }
}

}  // namespace shardtrain::parallel
