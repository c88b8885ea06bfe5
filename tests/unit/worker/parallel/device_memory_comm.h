// DeviceMemoryComm: Gloo posing as a communicator of device memory (NCCL's
// part, played on CPU). Its ops take the OffHostEngine's device addresses
// (off_host_engine.h), translated to host ones for Gloo; it counts what
// NCCL would not accept: an op on host memory, and a reduction or transfer
// that is not ordered after the device's work through OpArgs::after (a
// wrong order that a CPU run cannot show, since the "device" is the host).
// Split wraps the inner communicator's sub-groups the same way, so a mesh
// built from it is a device-memory mesh; the counts are the family's (a
// communicator and every group split from it, however deep).
#ifndef SHARDTRAIN_TESTS_UNIT_WORKER_PARALLEL_DEVICE_MEMORY_COMM_H_
#define SHARDTRAIN_TESTS_UNIT_WORKER_PARALLEL_DEVICE_MEMORY_COMM_H_

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "tests/unit/worker/parallel/off_host_engine.h"
#include "worker/comm/communicator.h"

namespace shardtrain::parallel::testing {

class DeviceMemoryComm final : public comm::Communicator {
 public:
  // inner: not owned (must outlive this).
  explicit DeviceMemoryComm(comm::Communicator& inner)
      : inner_(inner), counts_(std::make_shared<Counts>()) {}

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  const std::string& group_name() const override { return inner_.group_name(); }
  absl::Status health() const override { return inner_.health(); }
  bool device_memory() const override { return true; }
  std::shared_ptr<comm::Work> Submit(const comm::OpArgs& args) override {
    comm::OpArgs host = args;
    const bool device = OnDevice(args.input) || OnDevice(args.output);
    if (!device || (args.input != nullptr && !OnDevice(args.input)) ||
        (args.output != nullptr && !OnDevice(args.output))) {
      ++counts_->host_ops;  // NCCL cannot read host memory
      if (std::getenv("DEVICE_MEMORY_COMM_TRACE") != nullptr) {
        std::fprintf(stderr, "DeviceMemoryComm: op %d of %zu elements on host memory (%s)\n",
                     static_cast<int>(args.type), args.count, group_name().c_str());
      }
    }
    const comm::OpType t = args.type;
    if ((t == comm::OpType::kAllReduce || t == comm::OpType::kReduceScatter ||
         t == comm::OpType::kSend || t == comm::OpType::kRecv) &&
        args.after == nullptr) {
      ++counts_->unordered;
    }
    // A host address (counted above) goes through as it is, so the run
    // fails its check instead of crashing.
    if (OnDevice(args.input)) host.input = ToHost(args.input);
    if (OnDevice(args.output)) host.output = ToHost(args.output);
    ++counts_->ops;
    if (args.dtype == DataType::kBFloat16) ++counts_->bf16_ops;
    return inner_.Submit(host);
  }
  absl::StatusOr<std::unique_ptr<comm::Communicator>> Split(int color, int key) override {
    absl::StatusOr<std::unique_ptr<comm::Communicator>> child = inner_.Split(color, key);
    if (!child.ok() || *child == nullptr) return child;
    return std::unique_ptr<comm::Communicator>(new DeviceMemoryComm(*std::move(child), counts_));
  }
  absl::Status Shutdown() override { return owned_ ? owned_->Shutdown() : absl::OkStatus(); }
  const comm::FlightRecorder& flight_recorder() const override { return inner_.flight_recorder(); }
  int ops() const { return counts_->ops; }
  int host_ops() const { return counts_->host_ops; }
  int unordered() const { return counts_->unordered; }
  int bf16_ops() const { return counts_->bf16_ops; }

 private:
  struct Counts {
    std::atomic<int> ops{0}, host_ops{0}, unordered{0}, bf16_ops{0};
  };
  // A Split's child: owns its inner communicator, counts with its parent.
  DeviceMemoryComm(std::unique_ptr<comm::Communicator> owned, std::shared_ptr<Counts> counts)
      : inner_(*owned), owned_(std::move(owned)), counts_(std::move(counts)) {}
  static bool OnDevice(const void* p) {
    return p != nullptr && (reinterpret_cast<uintptr_t>(p) & kTag) != 0;
  }
  comm::Communicator& inner_;
  std::unique_ptr<comm::Communicator> owned_;
  std::shared_ptr<Counts> counts_;
};

}  // namespace shardtrain::parallel::testing

#endif  // SHARDTRAIN_TESTS_UNIT_WORKER_PARALLEL_DEVICE_MEMORY_COMM_H_
