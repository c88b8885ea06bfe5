#include "worker/comm/communicator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace shardtrain::comm {
namespace {

class DoneWork final : public Work {
 public:
  DoneWork(uint64_t seq, absl::Status status) : seq_(seq), status_(std::move(status)) {}
  absl::Status Wait(absl::Duration) override { return status_; }
  bool Done() const override { return true; }
  uint64_t seq() const override { return seq_; }

 private:
  uint64_t seq_;
  absl::Status status_;
};

}  // namespace

absl::Status Work::BlockStream(engine::Stream&) { return Wait(absl::InfiniteDuration()); }

std::shared_ptr<Work> CompletedWork(uint64_t seq, absl::Status status) {
  return std::make_shared<DoneWork>(seq, std::move(status));
}

absl::Status PendingWork::Wait(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return done_; };
  if (!mu_.AwaitWithTimeout(absl::Condition(&done), timeout)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "Work seq=", seq_, " still running after waiting ", absl::FormatDuration(timeout)));
  }
  return status_;
}

bool PendingWork::Done() const {
  absl::MutexLock lock(&mu_);
  return done_;
}

void PendingWork::Complete(absl::Status status) {
  absl::MutexLock lock(&mu_);
  status_ = std::move(status);
  done_ = true;
}

absl::Status ValidateOpArgs(const OpArgs& a, int rank, int size) {
  const std::string op(OpTypeName(a.type));
  auto need = [&](const void* p, absl::string_view what) -> absl::Status {
    if (p == nullptr && (a.count > 0 || (a.type == OpType::kSendRecv && a.recv_count > 0))) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": ", what, " is null with count ", a.count));
    }
    return absl::OkStatus();
  };
  auto peer_ok = [&](int p, absl::string_view what) -> absl::Status {
    if (p < 0 || p >= size || p == rank) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": ", what, " ", p, " is not another rank of a group of ", size));
    }
    return absl::OkStatus();
  };
  switch (a.type) {
    case OpType::kAllReduce:
      return need(a.output, "output");
    case OpType::kBroadcast:
    case OpType::kReduce:
      if (a.root < 0 || a.root >= size) {
        return absl::InvalidArgumentError(
            absl::StrCat(op, ": root ", a.root, " out of range for a group of ", size));
      }
      return need(a.output, "output");
    case OpType::kAllGather:
    case OpType::kReduceScatter:
      if (auto s = need(a.input, "input"); !s.ok()) return s;
      // All-gather may run in place: input is this rank's own output block
      // (for rank 0 that is output itself).
      if (a.input == a.output && a.count > 0 && !(a.type == OpType::kAllGather && rank == 0)) {
        return absl::InvalidArgumentError(absl::StrCat(op, ": input and output must not alias"));
      }
      return need(a.output, "output");
    case OpType::kSend:
      if (auto s = peer_ok(a.peer, "peer"); !s.ok()) return s;
      return need(a.input, "input");
    case OpType::kRecv:
      if (auto s = peer_ok(a.peer, "peer"); !s.ok()) return s;
      return need(a.output, "output");
    case OpType::kSendRecv:
      if (auto s = peer_ok(a.peer, "peer"); !s.ok()) return s;
      if (auto s = peer_ok(a.recv_peer, "recv_peer"); !s.ok()) return s;
      if (a.input == nullptr && a.count > 0) {
        return absl::InvalidArgumentError(op + ": input is null");
      }
      if (a.output == nullptr && a.recv_count > 0) {
        return absl::InvalidArgumentError(op + ": output is null");
      }
      return absl::OkStatus();
    case OpType::kBarrier:
      return absl::OkStatus();
    case OpType::kAllToAllV: {
      const size_t n = static_cast<size_t>(size);
      if (a.send_counts.size() != n || a.recv_counts.size() != n) {
        return absl::InvalidArgumentError(absl::StrCat(op, ": ", a.send_counts.size(), " send and ",
                                                       a.recv_counts.size(),
                                                       " receive counts for a group of ", size));
      }
      size_t sent = 0, received = 0;
      for (size_t p = 0; p < n; ++p) {
        sent += a.send_counts[p];
        received += a.recv_counts[p];
      }
      if (sent != a.count) {
        return absl::InvalidArgumentError(
            absl::StrCat(op, ": send counts sum to ", sent, ", count is ", a.count));
      }
      if ((a.input == nullptr && sent > 0) || (a.output == nullptr && received > 0)) {
        return absl::InvalidArgumentError(op + ": a null buffer with elements to move");
      }
      const size_t esz = DataTypeSize(a.dtype);
      const auto* in = static_cast<const char*>(a.input);
      const auto* out = static_cast<const char*>(a.output);
      if (sent > 0 && received > 0 && in < out + received * esz && out < in + sent * esz) {
        return absl::InvalidArgumentError(op + ": input and output overlap");
      }
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError("unknown op");
}

absl::StatusOr<std::unique_ptr<Communicator>> Communicator::NewGroup(
    const std::vector<int>& ranks) {
  for (int r : ranks) {
    if (r < 0 || r >= size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("NewGroup: rank ", r, " out of range for a group of ", size()));
    }
  }
  auto it = std::find(ranks.begin(), ranks.end(), rank());
  if (it == ranks.end()) return Split(kNoColor, 0);
  return Split(0, static_cast<int>(it - ranks.begin()));
}

namespace {

// The fields every wrapper sets; each adds its own (reduce op, root, peer).
OpArgs Op(OpType type, DataType dtype, const void* input, void* output, size_t count,
          const engine::Event* after) {
  OpArgs a;
  a.type = type;
  a.dtype = dtype;
  a.input = input;
  a.output = output;
  a.count = count;
  a.after = after;
  return a;
}

absl::Status Finish(const std::shared_ptr<Work>& work) {
  return work->Wait(absl::InfiniteDuration());
}

}  // namespace

std::shared_ptr<Work> Communicator::AllReduceAsync(void* data, size_t count, DataType dtype,
                                                   ReduceOp op, const engine::Event* after) {
  OpArgs a = Op(OpType::kAllReduce, dtype, nullptr, data, count, after);
  a.reduce = op;
  return Submit(a);
}
absl::Status Communicator::AllReduce(void* data, size_t count, DataType dtype, ReduceOp op) {
  return Finish(AllReduceAsync(data, count, dtype, op));
}

std::shared_ptr<Work> Communicator::BroadcastAsync(void* data, size_t count, DataType dtype,
                                                   int root, const engine::Event* after) {
  OpArgs a = Op(OpType::kBroadcast, dtype, nullptr, data, count, after);
  a.root = root;
  return Submit(a);
}
absl::Status Communicator::Broadcast(void* data, size_t count, DataType dtype, int root) {
  return Finish(BroadcastAsync(data, count, dtype, root));
}

std::shared_ptr<Work> Communicator::ReduceAsync(void* data, size_t count, DataType dtype,
                                                ReduceOp op, int root, const engine::Event* after) {
  OpArgs a = Op(OpType::kReduce, dtype, nullptr, data, count, after);
  a.reduce = op;
  a.root = root;
  return Submit(a);
}
absl::Status Communicator::Reduce(void* data, size_t count, DataType dtype, ReduceOp op, int root) {
  return Finish(ReduceAsync(data, count, dtype, op, root));
}

std::shared_ptr<Work> Communicator::AllGatherAsync(const void* input, void* output, size_t count,
                                                   DataType dtype, const engine::Event* after) {
  return Submit(Op(OpType::kAllGather, dtype, input, output, count, after));
}
absl::Status Communicator::AllGather(const void* input, void* output, size_t count,
                                     DataType dtype) {
  return Finish(AllGatherAsync(input, output, count, dtype));
}

std::shared_ptr<Work> Communicator::ReduceScatterAsync(const void* input, void* output,
                                                       size_t count, DataType dtype, ReduceOp op,
                                                       const engine::Event* after) {
  OpArgs a = Op(OpType::kReduceScatter, dtype, input, output, count, after);
  a.reduce = op;
  return Submit(a);
}
absl::Status Communicator::ReduceScatter(const void* input, void* output, size_t count,
                                         DataType dtype, ReduceOp op) {
  return Finish(ReduceScatterAsync(input, output, count, dtype, op));
}

std::shared_ptr<Work> Communicator::SendAsync(const void* data, size_t count, DataType dtype,
                                              int peer, uint32_t tag, const engine::Event* after) {
  OpArgs a = Op(OpType::kSend, dtype, data, nullptr, count, after);
  a.peer = peer;
  a.tag = tag;
  return Submit(a);
}
absl::Status Communicator::Send(const void* data, size_t count, DataType dtype, int peer,
                                uint32_t tag) {
  return Finish(SendAsync(data, count, dtype, peer, tag));
}

std::shared_ptr<Work> Communicator::RecvAsync(void* data, size_t count, DataType dtype, int peer,
                                              uint32_t tag, const engine::Event* after) {
  OpArgs a = Op(OpType::kRecv, dtype, nullptr, data, count, after);
  a.peer = peer;
  a.tag = tag;
  return Submit(a);
}
absl::Status Communicator::Recv(void* data, size_t count, DataType dtype, int peer, uint32_t tag) {
  return Finish(RecvAsync(data, count, dtype, peer, tag));
}

std::shared_ptr<Work> Communicator::SendRecvAsync(const void* send_data, size_t send_count,
                                                  int send_peer, void* recv_data, size_t recv_count,
                                                  int recv_peer, DataType dtype, uint32_t tag,
                                                  const engine::Event* after) {
  OpArgs a = Op(OpType::kSendRecv, dtype, send_data, recv_data, send_count, after);
  a.peer = send_peer;
  a.recv_count = recv_count;
  a.recv_peer = recv_peer;
  a.tag = tag;
  return Submit(a);
}
absl::Status Communicator::SendRecv(const void* send_data, size_t send_count, int send_peer,
                                    void* recv_data, size_t recv_count, int recv_peer,
                                    DataType dtype, uint32_t tag) {
  return Finish(SendRecvAsync(send_data, send_count, send_peer, recv_data, recv_count, recv_peer,
                              dtype, tag));
}

std::shared_ptr<Work> Communicator::BarrierAsync() {
  return Submit(Op(OpType::kBarrier, DataType::kFloat32, nullptr, nullptr, 0, nullptr));
}
absl::Status Communicator::Barrier() { return Finish(BarrierAsync()); }

std::shared_ptr<Work> Communicator::AllToAllVAsync(const void* input,
                                                   std::vector<size_t> send_counts, void* output,
                                                   std::vector<size_t> recv_counts, DataType dtype,
                                                   const engine::Event* after) {
  size_t count = 0;
  for (size_t c : send_counts) count += c;
  OpArgs a = Op(OpType::kAllToAllV, dtype, input, output, count, after);
  a.send_counts = std::move(send_counts);
  a.recv_counts = std::move(recv_counts);
  return Submit(a);
}
absl::Status Communicator::AllToAllV(const void* input, std::vector<size_t> send_counts,
                                     void* output, std::vector<size_t> recv_counts,
                                     DataType dtype) {
  return Finish(
      AllToAllVAsync(input, std::move(send_counts), output, std::move(recv_counts), dtype));
}

}  // namespace shardtrain::comm
