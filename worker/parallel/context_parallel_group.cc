#include "worker/parallel/context_parallel_group.h"

#include "absl/strings/str_cat.h"
#include "worker/parallel/data_parallel.h"

namespace shardtrain::parallel {
namespace {
// The tag of the ring's messages (pairs match per peer and tag, in order).
constexpr uint32_t kRingTag = 0x6370;  // "cp"
}  // namespace

void ContextParallelGroup::StartRingPass(const void* send, void* recv, size_t count,
                                         DataType dtype) {
  FinishRingPass();  // one pass at a time
  if (!status_.ok()) return;
  const engine::Event* after = nullptr;
  if (comm_->device_memory()) {
    if (device_ == nullptr) {
      status_ = absl::FailedPreconditionError(
          "ContextParallelGroup: a device-memory group without the engine's device (set_device)");
      return;
    }
    ForgetFinished(&ordered_, &events_);
    after = AfterComputeWork(*device_, &events_);  // the block to send is written
  }
  const int n = comm_->size(), r = comm_->rank();
  ++passes_;
  bytes_ += static_cast<int64_t>(count * DataTypeSize(dtype));
  in_flight_ = comm_->SendRecvAsync(send, count, (r + 1) % n, recv, count, (r + n - 1) % n, dtype,
                                    kRingTag, after);
}

void ContextParallelGroup::FinishRingPass() {
  if (in_flight_ == nullptr) return;
  absl::Status s;
  if (comm_->device_memory()) {
    s = in_flight_->BlockStream(device_->compute_stream());  // what reads recv waits on it
    ordered_.push_back(std::move(in_flight_));
  } else {
    s = in_flight_->Wait();
  }
  in_flight_.reset();
  if (!s.ok() && status_.ok()) {
    status_ = absl::Status(s.code(), absl::StrCat("context-parallel ring pass: ", s.message()));
  }
}

absl::Status ContextParallelGroup::Finish() {
  FinishRingPass();
  for (const std::shared_ptr<comm::Work>& w : ordered_) {
    absl::Status s = w->Wait();
    if (!s.ok() && status_.ok()) {
      status_ = absl::Status(s.code(), absl::StrCat("context-parallel ring pass: ", s.message()));
    }
  }
  ordered_.clear();
  events_.clear();
  return status_;
}

}  // namespace shardtrain::parallel
