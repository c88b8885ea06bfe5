// Communicator: collectives among the ranks of one group (the world, or a
// dp / tp / pp sub-group of the 3D mesh). Backends: Gloo over TCP for CPU
// buffers (gloo_communicator.h), NCCL for device buffers
// (nccl_communicator.h, only when built with CUDA).
//
// Contract shared by every backend:
//  * Every rank of the group must issue the same collectives in the same
//    order (Send/Recv/SendRecv excepted: they pair up per peer). Sequence
//    numbers count submissions on this rank, from 1.
//  * Buffers are contiguous arrays of `dtype`; they must stay valid and
//    untouched until the op's Work completes.
//  * Ordering with device work: OpArgs::after makes an op wait for an
//    engine::Event (work that produces its input) and Work::BlockStream
//    makes an engine::Stream wait for the op (work that consumes its
//    output); on NCCL neither blocks the host.
//  * Every op has a timeout (the backend's default unless OpArgs::timeout is
//    set). An op that does not finish in time fails with DEADLINE_EXCEEDED,
//    naming the op, its seq, the group, and the ranks that had not arrived.
//    A peer that dies makes the others fail (ABORTED) within the timeout + 2 s.
//  * After any failure the communicator is poisoned: queued ops fail with
//    ABORTED, later submissions fail at once with FAILED_PRECONDITION.
//    Build a new one (new generation prefix) to continue.
//  * Thread-safety: Submit and the convenience wrappers may be called from any
//    one thread at a time per communicator (ops execute in submission order).
//    rank(), size(), group_name(), health() and flight_recorder() are safe
//    from any thread.
#ifndef SHARDTRAIN_WORKER_COMM_COMMUNICATOR_H_
#define SHARDTRAIN_WORKER_COMM_COMMUNICATOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/comm/flight_recorder.h"
#include "worker/comm/types.h"
#include "worker/engine/device.h"

namespace shardtrain::comm {

// Handle of a submitted op.
class Work {
 public:
  virtual ~Work() = default;
  // Waits until the op finished and returns its status. If it has not
  // finished within `timeout`, returns DEADLINE_EXCEEDED ("still running");
  // the op itself keeps running under its own timeout and Wait may be called
  // again.
  virtual absl::Status Wait(absl::Duration timeout = absl::InfiniteDuration()) = 0;
  // True once the op finished (successfully or not).
  virtual bool Done() const = 0;
  virtual uint64_t seq() const = 0;
  // Orders `stream` after the op: work issued to `stream` after this call
  // starts only once the op finished. Returns the op's error if it is
  // already known to have failed (then nothing is ordered: do not use its
  // output); an op that fails later reports it through Wait().
  // This default waits on the host (Wait()), which is right for host
  // streams and for host backends such as Gloo. Backends that run on a
  // device (NCCL) override it to make `stream` wait for the op on the device
  // without blocking the host.
  virtual absl::Status BlockStream(engine::Stream& stream);
};

// A fully described op. Element counts are in elements of `dtype`.
//   kAllReduce     output[count] in place (input ignored).
//   kBroadcast     output[count] in place; root's buffer is sent.
//   kReduce        output[count] in place; result valid on root only, other
//                  ranks' buffers are left unspecified.
//   kAllGather     input[count] -> output[count * size], rank r's block at r;
//                  input may be exactly output + rank * count (in place, as
//                  in NCCL), any other overlap is an error.
//   kReduceScatter input[count * size] -> output[count] = reduced block rank.
//   kSend          input[count] to rank `peer` (blocks until peer receives).
//   kRecv          output[count] from rank `peer`.
//   kSendRecv      input[count] to `peer` while receiving output[recv_count]
//                  from `recv_peer` (use it for exchanges that would deadlock
//                  as a Send followed by a Recv on both sides).
//   kBarrier       no buffers.
//   kAllToAllV     input holds send_counts[p] elements for each rank p in
//                  rank order (count = their sum), output receives
//                  recv_counts[p] from each p in rank order; recv_counts[p]
//                  must equal rank p's send_counts[this rank] (exchange the
//                  counts first). Zero counts are fine, all of them too
//                  (Megatron-LM#1877: an expert rank that receives no
//                  token). input and output must not overlap.
//
// `after` (optional) orders the op after device work, typically the kernels
// or copies that produce its input: the op reads no input and writes no
// output before `after` completed. It must stay valid, and must not be
// recorded again, until the op's Work completes.
//   Gloo: the op thread waits for the event on the host (polling
//     after->Query(), then after->Synchronize() for its status) before
//     running the op, within the op's timeout (the wait counts towards it,
//     and a peer's failure aborts it). An error from the event, or the
//     timeout, fails the op like any other error: the communicator is
//     poisoned.
//   NCCL: Submit makes the communicator's stream wait for the event on the
//     device (cudaStreamWaitEvent on after->native()), so the host never
//     blocks; a host event (native() == nullptr) is waited for on the host
//     by Submit. A CUDA error there fails the op and poisons.
struct OpArgs {
  OpType type = OpType::kBarrier;
  DataType dtype = DataType::kFloat32;
  ReduceOp reduce = ReduceOp::kSum;
  const void* input = nullptr;
  void* output = nullptr;
  size_t count = 0;
  int root = 0;                                  // kBroadcast, kReduce
  int peer = -1;                                 // kSend, kRecv, kSendRecv (send destination)
  int recv_peer = -1;                            // kSendRecv
  size_t recv_count = 0;                         // kSendRecv
  std::vector<size_t> send_counts, recv_counts;  // kAllToAllV: elements per rank
  uint32_t tag = 0;  // Send/Recv matching: pairs match per (peer, tag), in order
  absl::Duration timeout = absl::ZeroDuration();  // zero: communicator default
  const engine::Event* after = nullptr;           // see above; null: no wait
};

class Communicator {
 public:
  // Colour meaning "this rank joins no sub-group" in Split.
  static constexpr int kNoColor = -1;

  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // E.g. "world" or "world.split1.c0"; also the store prefix of the group.
  virtual const std::string& group_name() const = 0;

  // OK while usable; otherwise the failure that poisoned it.
  virtual absl::Status health() const = 0;

  // True when ops take device memory (NCCL: a GPU's buffers, ordered on the
  // device through OpArgs::after); false when they take host memory (Gloo),
  // which GPU ranks reach through host copies.
  virtual bool device_memory() const { return false; }

  // Enqueues `args`; never blocks on peers. Argument errors and a poisoned
  // communicator are reported through the returned Work.
  virtual std::shared_ptr<Work> Submit(const OpArgs& args) = 0;

  // Collective over this group: ranks with the same `color` form a new
  // communicator, ordered by (key, parent rank). kNoColor returns nullptr.
  // Every rank of this group must call it (in the same order relative to
  // other Split calls); it implicitly synchronises the ranks of each colour.
  virtual absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) = 0;

  // Collective: a sub-group of the listed parent ranks (in that order).
  // Every rank of this group must call it with the same list; ranks not in
  // it get nullptr.
  absl::StatusOr<std::unique_ptr<Communicator>> NewGroup(const std::vector<int>& ranks);

  // Waits for queued ops, synchronises all ranks (barrier) and releases the
  // transport. Idempotent. The destructor calls it.
  virtual absl::Status Shutdown() = 0;

  // The last N ops of this communicator; see flight_recorder.h.
  virtual const FlightRecorder& flight_recorder() const = 0;

  // ---- Convenience wrappers: the *Async forms return the Work; the plain
  // forms wait for it. `after` is OpArgs::after.
  std::shared_ptr<Work> AllReduceAsync(void* data, size_t count, DataType dtype, ReduceOp op,
                                       const engine::Event* after = nullptr);
  absl::Status AllReduce(void* data, size_t count, DataType dtype, ReduceOp op);

  std::shared_ptr<Work> BroadcastAsync(void* data, size_t count, DataType dtype, int root,
                                       const engine::Event* after = nullptr);
  absl::Status Broadcast(void* data, size_t count, DataType dtype, int root);

  std::shared_ptr<Work> ReduceAsync(void* data, size_t count, DataType dtype, ReduceOp op, int root,
                                    const engine::Event* after = nullptr);
  absl::Status Reduce(void* data, size_t count, DataType dtype, ReduceOp op, int root);

  std::shared_ptr<Work> AllGatherAsync(const void* input, void* output, size_t count,
                                       DataType dtype, const engine::Event* after = nullptr);
  absl::Status AllGather(const void* input, void* output, size_t count, DataType dtype);

  std::shared_ptr<Work> ReduceScatterAsync(const void* input, void* output, size_t count,
                                           DataType dtype, ReduceOp op,
                                           const engine::Event* after = nullptr);
  absl::Status ReduceScatter(const void* input, void* output, size_t count, DataType dtype,
                             ReduceOp op);

  std::shared_ptr<Work> SendAsync(const void* data, size_t count, DataType dtype, int peer,
                                  uint32_t tag = 0, const engine::Event* after = nullptr);
  absl::Status Send(const void* data, size_t count, DataType dtype, int peer, uint32_t tag = 0);

  std::shared_ptr<Work> RecvAsync(void* data, size_t count, DataType dtype, int peer,
                                  uint32_t tag = 0, const engine::Event* after = nullptr);
  absl::Status Recv(void* data, size_t count, DataType dtype, int peer, uint32_t tag = 0);

  std::shared_ptr<Work> SendRecvAsync(const void* send_data, size_t send_count, int send_peer,
                                      void* recv_data, size_t recv_count, int recv_peer,
                                      DataType dtype, uint32_t tag = 0,
                                      const engine::Event* after = nullptr);
  absl::Status SendRecv(const void* send_data, size_t send_count, int send_peer, void* recv_data,
                        size_t recv_count, int recv_peer, DataType dtype, uint32_t tag = 0);

  std::shared_ptr<Work> BarrierAsync();
  absl::Status Barrier();

  std::shared_ptr<Work> AllToAllVAsync(const void* input, std::vector<size_t> send_counts,
                                       void* output, std::vector<size_t> recv_counts,
                                       DataType dtype, const engine::Event* after = nullptr);
  absl::Status AllToAllV(const void* input, std::vector<size_t> send_counts, void* output,
                         std::vector<size_t> recv_counts, DataType dtype);
};

// A Work that is already complete with `status` (used for argument errors and
// poisoned communicators). BlockStream returns `status` at once.
std::shared_ptr<Work> CompletedWork(uint64_t seq, absl::Status status);

// A Work that a backend completes later, from its own thread: Complete() once
// with the op's status; Wait() blocks until then (or returns DEADLINE_EXCEEDED
// after `timeout`, the op still running); BlockStream waits on the host
// (Work's default). Thread-safe.
class PendingWork final : public Work {
 public:
  explicit PendingWork(uint64_t seq) : seq_(seq) {}
  absl::Status Wait(absl::Duration timeout) override;
  bool Done() const override;
  uint64_t seq() const override { return seq_; }
  void Complete(absl::Status status);

 private:
  const uint64_t seq_;
  mutable absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

// Checks `args` against a group of `size` ranks with this rank `rank`.
absl::Status ValidateOpArgs(const OpArgs& args, int rank, int size);

}  // namespace shardtrain::comm

#endif  // SHARDTRAIN_WORKER_COMM_COMMUNICATOR_H_
