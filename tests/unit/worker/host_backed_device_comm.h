// HostBackedDeviceComm: NCCL's kind of communicator — buffers in GPU memory,
// ordered through OpArgs::after — played by Gloo through host copies, so
// the device-memory paths of the trainer (DDP and ZeRO reducing in the
// engine's buffers, the pipeline sending device buffers, the CUDA engine's
// tp collectives in device memory, the tied and tp-partial sums there) run
// with several ranks on ONE GPU, which NCCL refuses ("Duplicate GPU").
// What it cannot check is NCCL itself (comm_nccl_test and the two-GPU tests
// do that).
//
// Each communicator runs its ops in submission order on its own thread, as
// Gloo does: wait for `after` on the host, copy the inputs out of device
// memory, run the Gloo op, copy the outputs back. Work::BlockStream waits
// on the host (the default), so the stream's later work sees the result.
// Split wraps the inner sub-groups the same way. Test-only; CUDA device 0.
#ifndef SHARDTRAIN_TESTS_UNIT_WORKER_HOST_BACKED_DEVICE_COMM_H_
#define SHARDTRAIN_TESTS_UNIT_WORKER_HOST_BACKED_DEVICE_COMM_H_

#include <cuda_runtime.h>

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/comm/communicator.h"

namespace shardtrain::worker::gpu_testing {

class HostBackedDeviceComm final : public comm::Communicator {
 public:
  // inner: not owned (must outlive this), or owned (a Split's child).
  explicit HostBackedDeviceComm(comm::Communicator& inner) : inner_(inner) { Start(); }
  explicit HostBackedDeviceComm(std::unique_ptr<comm::Communicator> owned)
      : inner_(*owned), owned_(std::move(owned)) {
    Start();
  }
  ~HostBackedDeviceComm() override {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  const std::string& group_name() const override { return inner_.group_name(); }
  absl::Status health() const override { return inner_.health(); }
  bool device_memory() const override { return true; }

  std::shared_ptr<comm::Work> Submit(const comm::OpArgs& args) override {
    auto work = std::make_shared<comm::PendingWork>(++seq_);
    {
      std::lock_guard<std::mutex> l(mu_);
      queue_.push_back({args, work});
    }
    cv_.notify_all();
    return work;
  }
  absl::StatusOr<std::unique_ptr<comm::Communicator>> Split(int color, int key) override {
    absl::StatusOr<std::unique_ptr<comm::Communicator>> child = inner_.Split(color, key);
    if (!child.ok() || *child == nullptr) return child;
    return std::unique_ptr<comm::Communicator>(new HostBackedDeviceComm(*std::move(child)));
  }
  absl::Status Shutdown() override { return owned_ ? owned_->Shutdown() : absl::OkStatus(); }
  const comm::FlightRecorder& flight_recorder() const override { return inner_.flight_recorder(); }

 private:
  struct Op {
    comm::OpArgs args;
    std::shared_ptr<comm::PendingWork> work;
  };

  void Start() {
    thread_ = std::thread([this] { Loop(); });
  }

  void Loop() {
    cudaSetDevice(0);
    cudaStream_t stream = nullptr;
    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    for (;;) {
      Op op;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) break;
        op = std::move(queue_.front());
        queue_.pop_front();
      }
      op.work->Complete(Run(op.args, stream));
    }
    cudaStreamDestroy(stream);
  }

  // Elements of the input and output buffers of `a` in a group of n ranks.
  static std::pair<size_t, size_t> Counts(const comm::OpArgs& a, size_t n) {
    switch (a.type) {
      case comm::OpType::kAllGather:
        return {a.count, a.count * n};
      case comm::OpType::kReduceScatter:
        return {a.count * n, a.count};
      case comm::OpType::kSend:
        return {a.count, 0};
      case comm::OpType::kRecv:
        return {0, a.count};
      case comm::OpType::kSendRecv:
        return {a.count, a.recv_count};
      case comm::OpType::kBarrier:
        return {0, 0};
      case comm::OpType::kAllToAllV: {
        size_t in = 0, out = 0;
        for (size_t c : a.send_counts) in += c;
        for (size_t c : a.recv_counts) out += c;
        return {in, out};
      }
      default:  // in place: all-reduce, broadcast, reduce
        return {0, a.count};
    }
  }

  absl::Status Copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                    cudaStream_t stream) {
    if (bytes == 0) return absl::OkStatus();
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
    if (e != cudaSuccess) {
      return absl::InternalError(absl::StrCat("HostBackedDeviceComm: ", cudaGetErrorString(e)));
    }
    return absl::OkStatus();
  }

  absl::Status Run(const comm::OpArgs& args, cudaStream_t stream) {
    if (args.after != nullptr) {
      if (absl::Status s = args.after->Synchronize(); !s.ok()) return s;
    }
    const size_t esz = DataTypeSize(args.dtype);
    const auto [in_n, out_n] = Counts(args, size_t(size()));
    std::vector<char> in(in_n * esz), out(out_n * esz);
    comm::OpArgs host = args;
    host.after = nullptr;
    host.input = in_n > 0 ? in.data() : nullptr;
    host.output = out_n > 0 ? out.data() : nullptr;
    if (absl::Status s = Copy(in.data(), args.input, in.size(), cudaMemcpyDeviceToHost, stream);
        !s.ok()) {
      return s;
    }
    // In place (all-reduce, broadcast, reduce): the output is also the input.
    if (in_n == 0 && args.type != comm::OpType::kRecv) {
      if (absl::Status s =
              Copy(out.data(), args.output, out.size(), cudaMemcpyDeviceToHost, stream);
          !s.ok()) {
        return s;
      }
    }
    if (absl::Status s = inner_.Submit(host)->Wait(); !s.ok()) return s;
    return Copy(args.output, out.data(), out.size(), cudaMemcpyHostToDevice, stream);
  }

  comm::Communicator& inner_;
  std::unique_ptr<comm::Communicator> owned_;
  uint64_t seq_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Op> queue_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace shardtrain::worker::gpu_testing

#endif  // SHARDTRAIN_TESTS_UNIT_WORKER_HOST_BACKED_DEVICE_COMM_H_
