// DeviceMemoryComm: Gloo posing as a communicator of device memory (NCCL's
// part, played on CPU). Its ops take the OffHostEngine's device addresses
// (off_host_engine.h), translated to host ones for Gloo; it counts what
// NCCL would not accept: an op on host memory, and a reduction or transfer
// that is not ordered after the device's work through OpArgs::after (a
// wrong order that a CPU run cannot show, since the "device" is the host).
// Split wraps the inner communicator's sub-groups the same way, so a mesh
// built from it is a device-memory mesh.
#ifndef SHARDTRAIN_TESTS_UNIT_WORKER_PARALLEL_DEVICE_MEMORY_COMM_H_
#define SHARDTRAIN_TESTS_UNIT_WORKER_PARALLEL_DEVICE_MEMORY_COMM_H_

#include <atomic>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "tests/unit/worker/parallel/off_host_engine.h"
#include "worker/comm/communicator.h"

namespace shardtrain::parallel::testing {

class DeviceMemoryComm final : public comm::Communicator {
 public:
  // inner: not owned (must outlive this), or owned (a Split's child).
  explicit DeviceMemoryComm(comm::Communicator& inner) : inner_(inner) {}
  explicit DeviceMemoryComm(std::unique_ptr<comm::Communicator> owned)
      : inner_(*owned), owned_(std::move(owned)) {}

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
      ++host_ops_;  // NCCL cannot read host memory
    }
    const comm::OpType t = args.type;
    if ((t == comm::OpType::kAllReduce || t == comm::OpType::kReduceScatter ||
         t == comm::OpType::kSend || t == comm::OpType::kRecv) &&
        args.after == nullptr) {
      ++unordered_;
    }
    host.input = ToHost(args.input);
    host.output = ToHost(args.output);
    ++ops_;
    return inner_.Submit(host);
  }
  absl::StatusOr<std::unique_ptr<comm::Communicator>> Split(int color, int key) override {
    absl::StatusOr<std::unique_ptr<comm::Communicator>> child = inner_.Split(color, key);
    if (!child.ok() || *child == nullptr) return child;
    return std::unique_ptr<comm::Communicator>(new DeviceMemoryComm(*std::move(child)));
  }
  absl::Status Shutdown() override { return owned_ ? owned_->Shutdown() : absl::OkStatus(); }
  const comm::FlightRecorder& flight_recorder() const override { return inner_.flight_recorder(); }
  int ops() const { return ops_; }
  int host_ops() const { return host_ops_; }
  int unordered() const { return unordered_; }

 private:
  static bool OnDevice(const void* p) {
    return p != nullptr && (reinterpret_cast<uintptr_t>(p) & kTag) != 0;
  }
  comm::Communicator& inner_;
  std::unique_ptr<comm::Communicator> owned_;
  std::atomic<int> ops_{0}, host_ops_{0}, unordered_{0};
};

}  // namespace shardtrain::parallel::testing

#endif  // SHARDTRAIN_TESTS_UNIT_WORKER_PARALLEL_DEVICE_MEMORY_COMM_H_
