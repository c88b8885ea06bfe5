#include "worker/comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <cstring>
#include <deque>
#include <iostream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "worker/comm/failure_report.h"

namespace shardtrain::comm {
namespace {

absl::Status NcclStatus(ncclResult_t r, absl::string_view what) {
  const std::string msg =
      absl::StrCat(what, ": NCCL error ", static_cast<int>(r), " (", ncclGetErrorString(r), ")");
  switch (r) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::InvalidArgumentError(msg);
    case ncclRemoteError:
    case ncclSystemError:
      return absl::AbortedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

absl::Status CudaStatus(cudaError_t e, absl::string_view what) {
  return absl::InternalError(
      absl::StrCat(what, ": CUDA error ", static_cast<int>(e), " (", cudaGetErrorString(e), ")"));
}

ncclDataType_t ToNccl(DataType d) {
  switch (d) {
    case DataType::kFloat32:
      return ncclFloat32;
    case DataType::kBFloat16:
      return ncclBfloat16;
    case DataType::kFloat16:
      return ncclFloat16;
  }
  return ncclFloat32;
}

ncclRedOp_t ToNccl(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kMax:
      return ncclMax;
  }
  return ncclSum;
}

// Waits until the last call on a non-blocking communicator has finished
// (state leaves ncclInProgress), up to `deadline`.
absl::Status WaitNotInProgress(ncclComm_t comm, absl::Time deadline, absl::string_view what) {
  while (true) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) return NcclStatus(r, what);
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) return NcclStatus(state, what);
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(what, " did not complete in time"));
    }
    absl::SleepFor(absl::Microseconds(200));
  }
}

// Handle of an NCCL op. Owns the CUDA event recorded on the communicator's
// stream right after the op, which the watchdog polls to complete it and
// BlockStream hands to other streams; the event lives as long as the handle
// (so it may outlive the communicator).
class NcclWork final : public Work {
 public:
  NcclWork(uint64_t seq, cudaEvent_t event) : pending_(seq), event_(event) {}
  ~NcclWork() override {
    if (event_ != nullptr) cudaEventDestroy(event_);
  }
  absl::Status Wait(absl::Duration timeout) override { return pending_.Wait(timeout); }
  bool Done() const override { return pending_.Done(); }
  uint64_t seq() const override { return pending_.seq(); }

  // Device-side: `stream` waits for the event, the host does not. A host
  // stream (native() == nullptr) falls back to a host wait.
  absl::Status BlockStream(engine::Stream& stream) override {
    // Finished (the watchdog saw the event complete) or failed: nothing is
    // left to order; report the status.
    if (Done()) return Wait(absl::ZeroDuration());
    if (stream.native() == nullptr) return Wait(absl::InfiniteDuration());
    // Not done means Submit recorded the event (a failed launch completes
    // the work before Submit returns).
    cudaError_t e = cudaStreamWaitEvent(static_cast<cudaStream_t>(stream.native()), event_, 0);
    if (e != cudaSuccess) return CudaStatus(e, "cudaStreamWaitEvent (Work::BlockStream)");
    return absl::OkStatus();
  }

  void Complete(absl::Status status) { pending_.Complete(std::move(status)); }
  cudaEvent_t event() const { return event_; }

 private:
  PendingWork pending_;
  const cudaEvent_t event_;  // null only if creating it failed (then failed)
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<RendezvousStore> store, int rank, int size, NcclOptions options,
                   ncclComm_t comm)
      : store_(std::move(store)),
        rank_(rank),
        size_(size),
        options_(std::move(options)),
        key_prefix_(absl::StrCat(options_.prefix, "/", options_.group_name)),
        recorder_(options_.flight_recorder_capacity),
        comm_(comm) {}

  ~NcclCommunicator() override { Shutdown().IgnoreError(); }

  absl::Status Init() {
    cudaSetDevice(options_.device);
    cudaError_t e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
    if (e != cudaSuccess) return CudaStatus(e, "cudaStreamCreate");
    e = cudaMalloc(&scratch_, sizeof(float));
    if (e != cudaSuccess) return CudaStatus(e, "cudaMalloc");
    cudaMemset(scratch_, 0, sizeof(float));
    watchdog_ = std::thread([this] { Watchdog(); });
    return absl::OkStatus();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& group_name() const override { return options_.group_name; }
  bool device_memory() const override { return true; }
  const FlightRecorder& flight_recorder() const override { return recorder_; }
  absl::Status health() const override {
    absl::MutexLock lock(&mu_);
    return poison_;
  }

  std::shared_ptr<Work> Submit(const OpArgs& args) override {
    if (absl::Status s = ValidateOpArgs(args, rank_, size_); !s.ok()) {
      return CompletedWork(0, s);
    }
    // A host event (no CUDA handle) is waited for on the host, before taking
    // the lock so that the watchdog keeps completing earlier ops meanwhile.
    const bool device_after = args.after != nullptr && args.after->native() != nullptr;
    absl::Status host_after;
    if (args.after != nullptr && !device_after) host_after = args.after->Synchronize();
    absl::MutexLock lock(&mu_);
    if (!poison_.ok()) {
      return CompletedWork(0, absl::FailedPreconditionError(absl::StrCat(
                                  "communicator ", key_prefix_,
                                  " is poisoned by an earlier failure: ", poison_.message())));
    }
    if (comm_ == nullptr) {
      return CompletedWork(0, absl::FailedPreconditionError(
                                  absl::StrCat("communicator ", key_prefix_, " is shut down")));
    }
    const uint64_t seq = ++next_seq_;
    FlightRecord rec;
    rec.seq = seq;
    rec.op = args.type;
    rec.group = options_.group_name;
    rec.bytes = args.count * DataTypeSize(args.dtype);
    rec.dtype = args.dtype;
    rec.peer =
        (args.type == OpType::kBroadcast || args.type == OpType::kReduce) ? args.root : args.peer;
    rec.enqueue_time = absl::Now();
    recorder_.Queued(rec);
    const absl::Duration timeout =
        args.timeout > absl::ZeroDuration() ? args.timeout : options_.timeout;
    cudaSetDevice(options_.device);
    cudaEvent_t event = nullptr;
    cudaError_t e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    if (e != cudaSuccess) event = nullptr;
    auto work = std::make_shared<NcclWork>(seq, event);
    Pending p{seq, args, absl::Now(), absl::Now() + timeout, work};
    p.args.after = nullptr;  // only valid during Submit
    absl::Status launched =
        e == cudaSuccess ? absl::OkStatus() : CudaStatus(e, "cudaEventCreateWithFlags");
    if (launched.ok() && !host_after.ok()) {
      launched = absl::Status(host_after.code(), absl::StrCat("its OpArgs::after event failed: ",
                                                              host_after.message()));
    }
    if (launched.ok() && device_after) {
      e = cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(args.after->native()), 0);
      if (e != cudaSuccess) launched = CudaStatus(e, "cudaStreamWaitEvent (OpArgs::after)");
    }
    if (launched.ok()) launched = Launch(args);
    if (launched.ok()) {
      launched = WaitNotInProgress(comm_, p.deadline, OpTypeName(args.type));
    }
    if (launched.ok()) {
      e = cudaEventRecord(event, stream_);
      if (e != cudaSuccess) launched = CudaStatus(e, "cudaEventRecord");
    }
    recorder_.Running(seq);
    if (!launched.ok()) {
      FailLocked(p, launched);
      return work;
    }
    pending_.push_back(std::move(p));
    return work;
  }

  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override {
    absl::MutexLock lock(&mu_);
    if (!poison_.ok() || comm_ == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("Split on unusable communicator ", key_prefix_, ": ", poison_.message()));
    }
    const int k = ++split_count_;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t child = nullptr;
    cudaSetDevice(options_.device);
    ncclResult_t r =
        ncclCommSplit(comm_, color == kNoColor ? NCCL_SPLIT_NOCOLOR : color, key, &child, &config);
    const absl::Time deadline = absl::Now() + options_.timeout;
    if (r != ncclSuccess && r != ncclInProgress) return NcclStatus(r, "ncclCommSplit");
    if (absl::Status s = WaitNotInProgress(comm_, deadline, "ncclCommSplit"); !s.ok()) {
      return s;
    }
    if (child == nullptr) return std::unique_ptr<Communicator>();
    if (absl::Status s = WaitNotInProgress(child, deadline, "ncclCommSplit child"); !s.ok()) {
      ncclCommAbort(child);
      return s;
    }
    int child_rank = 0, child_size = 0;
    ncclCommUserRank(child, &child_rank);
    ncclCommCount(child, &child_size);
    NcclOptions opts = options_;
    opts.group_name = absl::StrCat(options_.group_name, ".split", k, ".c", color);
    auto c = std::make_unique<NcclCommunicator>(store_, child_rank, child_size, opts, child);
    if (absl::Status s = c->Init(); !s.ok()) return s;
    return std::unique_ptr<Communicator>(std::move(c));
  }

  absl::Status Shutdown() override {
    absl::Status status;
    bool healthy;
    {
      absl::MutexLock lock(&mu_);
      if (shut_down_) return absl::OkStatus();
      shut_down_ = true;
      healthy = poison_.ok() && comm_ != nullptr;
    }
    if (healthy && watchdog_.joinable()) status = Barrier();
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    if (watchdog_.joinable()) watchdog_.join();
    absl::MutexLock lock(&mu_);
    if (comm_ != nullptr) {
      if (status.ok() && ncclCommFinalize(comm_) == ncclSuccess) {
        WaitNotInProgress(comm_, absl::Now() + options_.timeout, "ncclCommFinalize").IgnoreError();
        ncclCommDestroy(comm_);
      } else {
        ncclCommAbort(comm_);
      }
      comm_ = nullptr;
    }
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (scratch_ != nullptr) cudaFree(scratch_);
    stream_ = nullptr;
    scratch_ = nullptr;
    return status;
  }

 private:
  struct Pending {
    uint64_t seq;
    OpArgs args;
    absl::Time start;
    absl::Time deadline;
    std::shared_ptr<NcclWork> work;  // owns the completion event
  };

  absl::Status Launch(const OpArgs& a) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const ncclDataType_t dt = ToNccl(a.dtype);
    const ncclRedOp_t op = ToNccl(a.reduce);
    ncclResult_t r = ncclSuccess;
    switch (a.type) {
      case OpType::kAllReduce:
        r = ncclAllReduce(a.output, a.output, a.count, dt, op, comm_, stream_);
        break;
      case OpType::kBroadcast:
        r = ncclBroadcast(a.output, a.output, a.count, dt, a.root, comm_, stream_);
        break;
      case OpType::kReduce:
        r = ncclReduce(a.output, a.output, a.count, dt, op, a.root, comm_, stream_);
        break;
      case OpType::kAllGather:
        r = ncclAllGather(a.input, a.output, a.count, dt, comm_, stream_);
        break;
      case OpType::kReduceScatter:
        r = ncclReduceScatter(a.input, a.output, a.count, dt, op, comm_, stream_);
        break;
      case OpType::kSend:
        r = ncclSend(a.input, a.count, dt, a.peer, comm_, stream_);
        break;
      case OpType::kRecv:
        r = ncclRecv(a.output, a.count, dt, a.peer, comm_, stream_);
        break;
      case OpType::kSendRecv: {
        ncclGroupStart();
        ncclResult_t r1 = ncclSend(a.input, a.count, dt, a.peer, comm_, stream_);
        ncclResult_t r2 = ncclRecv(a.output, a.recv_count, dt, a.recv_peer, comm_, stream_);
        r = ncclGroupEnd();
        if (r1 != ncclSuccess && r1 != ncclInProgress) r = r1;
        if (r2 != ncclSuccess && r2 != ncclInProgress) r = r2;
        break;
      }
      case OpType::kBarrier:
        r = ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_);
        break;
      case OpType::kAllToAllV: {
        // One group of a send to and a receive from every rank with
        // elements to move (its own block too: NCCL copies it).
        const size_t esz = DataTypeSize(a.dtype);
        size_t in = 0, out = 0;
        ncclGroupStart();
        for (int p = 0; p < static_cast<int>(a.send_counts.size()); ++p) {
          const size_t ns = a.send_counts[p], nr = a.recv_counts[p];
          ncclResult_t rs = ncclSuccess, rr = ncclSuccess;
          if (ns > 0) {
            rs = ncclSend(static_cast<const char*>(a.input) + in * esz, ns, dt, p, comm_, stream_);
          }
          if (nr > 0) {
            rr = ncclRecv(static_cast<char*>(a.output) + out * esz, nr, dt, p, comm_, stream_);
          }
          if (rs != ncclSuccess && rs != ncclInProgress) r = rs;
          if (rr != ncclSuccess && rr != ncclInProgress) r = rr;
          in += ns;
          out += nr;
        }
        const ncclResult_t end = ncclGroupEnd();
        if (r == ncclSuccess) r = end;
        break;
      }
    }
    if (r == ncclSuccess || r == ncclInProgress) return absl::OkStatus();
    return NcclStatus(r, OpTypeName(a.type));
  }

  // Polls outstanding ops in order; completes them or fails the front one.
  void Watchdog() {
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        if (stop_ && pending_.empty()) return;
        while (!pending_.empty()) {
          Pending& p = pending_.front();
          cudaError_t e = cudaEventQuery(p.work->event());
          if (e == cudaSuccess) {
            recorder_.Done(p.seq);
            p.work->Complete(absl::OkStatus());
            pending_.pop_front();
            continue;
          }
          absl::Status cause;
          ncclResult_t async = ncclSuccess;
          if (e != cudaErrorNotReady) {
            cause = CudaStatus(e, "cudaEventQuery");
          } else if (ncclCommGetAsyncError(comm_, &async) == ncclSuccess && async != ncclSuccess &&
                     async != ncclInProgress) {
            cause = NcclStatus(async, "asynchronous NCCL error");
          } else if (absl::Now() > p.deadline) {
            cause = absl::DeadlineExceededError(
                absl::StrCat("timed out after ", absl::FormatDuration(p.deadline - p.start)));
          } else {
            break;
          }
          Pending failed = std::move(p);
          pending_.pop_front();
          FailLocked(failed, cause);
        }
      }
      absl::SleepFor(absl::Milliseconds(1));
    }
  }

  // Aborts the NCCL communicator, exchanges failure reports, fails `p` and
  // every other outstanding op, poisons the communicator.
  void FailLocked(Pending& p, const absl::Status& cause) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (comm_ != nullptr) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
    }
    const FailureReports reports = ExchangeFailureReports(
        *store_, key_prefix_, rank_, size_, p.seq, p.args.type, options_.failure_report_grace);
    const absl::Status status = FailureStatus(p.args.type, p.seq, key_prefix_, rank_, size_,
                                              p.args.count * DataTypeSize(p.args.dtype),
                                              p.args.dtype, absl::Now() - p.start, cause, reports);
    recorder_.Failed(p.seq, status.message());
    p.work->Complete(status);
    poison_ = status;
    for (Pending& q : pending_) {
      absl::Status s = absl::AbortedError(absl::StrCat(OpTypeName(q.args.type), " seq=", q.seq,
                                                       " aborted: communicator ", key_prefix_,
                                                       " was poisoned by: ", status.message()));
      recorder_.Failed(q.seq, s.message());
      q.work->Complete(s);
    }
    pending_.clear();
    if (options_.dump_on_failure) {
      std::cerr << "[shardtrain comm] " << status.ToString()
                << "\n[shardtrain comm] flight recorder of " << key_prefix_ << " rank " << rank_
                << ":\n"
                << recorder_.DumpText() << std::flush;
    }
  }

  const std::shared_ptr<RendezvousStore> store_;
  const int rank_;
  const int size_;
  const NcclOptions options_;
  const std::string key_prefix_;
  FlightRecorder recorder_;
  std::thread watchdog_;

  mutable absl::Mutex mu_;
  ncclComm_t comm_ ABSL_GUARDED_BY(mu_);
  cudaStream_t stream_ = nullptr;
  float* scratch_ = nullptr;
  std::deque<Pending> pending_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  int split_count_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status poison_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

bool CudaDeviceAvailable() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

absl::StatusOr<std::string> ExchangeNcclUniqueId(RendezvousStore& store, const std::string& key,
                                                 int rank, absl::Duration timeout) {
  if (rank == 0) {
    ncclUniqueId id;
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) return NcclStatus(r, "ncclGetUniqueId");
    std::string bytes(id.internal, sizeof(id.internal));
    if (absl::Status s = store.Set(key, bytes); !s.ok()) return s;
    return bytes;
  }
  absl::StatusOr<std::string> bytes = store.Get(key, timeout);
  if (!bytes.ok()) return bytes.status();
  if (bytes->size() != sizeof(ncclUniqueId)) {
    return absl::InternalError(absl::StrCat("NCCL unique id at '", key, "' has ", bytes->size(),
                                            " bytes, want ", sizeof(ncclUniqueId)));
  }
  return bytes;
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(
    std::shared_ptr<RendezvousStore> store, int rank, int size, const NcclOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("CreateNcclCommunicator: rank ", rank, " / size ", size, " invalid"));
  }
  if (store == nullptr) return absl::InvalidArgumentError("null store");
  if (!CudaDeviceAvailable()) {
    return absl::FailedPreconditionError("CreateNcclCommunicator: no CUDA device");
  }
  cudaError_t e = cudaSetDevice(options.device);
  if (e != cudaSuccess) return CudaStatus(e, "cudaSetDevice");
  const std::string prefix = absl::StrCat(options.prefix, "/", options.group_name);
  absl::StatusOr<std::string> id_bytes =
      ExchangeNcclUniqueId(*store, absl::StrCat(prefix, "/nccl_id"), rank, options.timeout);
  if (!id_bytes.ok()) return id_bytes.status();
  ncclUniqueId id;
  std::memcpy(id.internal, id_bytes->data(), sizeof(id.internal));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    if (comm != nullptr) ncclCommAbort(comm);
    return NcclStatus(r, "ncclCommInitRankConfig");
  }
  if (absl::Status s = WaitNotInProgress(comm, absl::Now() + options.timeout,
                                         absl::StrCat("NCCL init of ", prefix));
      !s.ok()) {
    ncclCommAbort(comm);
    return s;
  }
  auto c = std::make_unique<NcclCommunicator>(std::move(store), rank, size, options, comm);
  if (absl::Status s = c->Init(); !s.ok()) return s;
  return std::unique_ptr<Communicator>(std::move(c));
}

}  // namespace shardtrain::comm
