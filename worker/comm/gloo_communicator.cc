#include "worker/comm/gloo_communicator.h"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <iostream>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/common/error.h"
#include "gloo/math.h"
#include "gloo/reduce.h"
#include "gloo/rendezvous/context.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/unbound_buffer.h"
#include "worker/comm/failure_report.h"
#include "worker/comm/gloo_rings.h"
#include "worker/comm/gloo_store_adapter.h"

namespace shardtrain::comm {
namespace {

// Slots of our own unbound-buffer traffic, far from Gloo's collective slots
// (prefix byte << 56 with prefixes 0x01..0x08).
constexpr uint64_t kP2PSlotBase = 0xA2ull << 56;

std::chrono::milliseconds ToMs(absl::Duration d) {
  return std::chrono::milliseconds(std::max<int64_t>(1, absl::ToInt64Milliseconds(d)));
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<RendezvousStore> store, int rank, int size, GlooOptions options,
                   std::shared_ptr<gloo::transport::Device> device)
      : store_(std::move(store)),
        rank_(rank),
        size_(size),
        options_(std::move(options)),
        key_prefix_(absl::StrCat(options_.prefix, "/", options_.group_name)),
        device_(std::move(device)),
        recorder_(options_.flight_recorder_capacity) {}

  ~GlooCommunicator() override { Shutdown().IgnoreError(); }

  absl::Status Connect() {
    if (size_ == 1) return absl::OkStatus();
    try {
      GlooStoreAdapter adapter(store_.get(), key_prefix_, options_.timeout);
      auto ctx = std::make_shared<gloo::rendezvous::Context>(rank_, size_);
      ctx->setTimeout(ToMs(options_.timeout));
      ctx->connectFullMesh(adapter, device_);
      ctx_ = std::move(ctx);
      rings_.set_context(ctx_);
    } catch (const std::exception& e) {
      const std::string what = e.what();
      const bool deadline = what.find("not set within") != std::string::npos ||
                            what.find("Timed out") != std::string::npos;
      const std::string msg = absl::StrCat("Gloo rendezvous of group ", key_prefix_, " (rank ",
                                           rank_, " of ", size_, ") failed: ", what);
      return deadline ? absl::DeadlineExceededError(msg) : absl::UnavailableError(msg);
    }
    return absl::OkStatus();
  }

  void Start() {
    thread_ = std::thread([this] { Loop(); });
    if (size_ > 1) watcher_ = std::thread([this] { WatchPeers(); });
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& group_name() const override { return options_.group_name; }
  const FlightRecorder& flight_recorder() const override { return recorder_; }

  absl::Status health() const override {
    absl::MutexLock lock(&mu_);
    return poison_;
  }

  std::shared_ptr<Work> Submit(const OpArgs& args) override {
    if (absl::Status s = ValidateOpArgs(args, rank_, size_); !s.ok()) {
      return CompletedWork(0, s);
    }
    absl::MutexLock lock(&mu_);
    if (!poison_.ok()) {
      return CompletedWork(0, absl::FailedPreconditionError(absl::StrCat(
                                  "communicator ", key_prefix_,
                                  " is poisoned by an earlier failure: ", poison_.message())));
    }
    if (stopping_) {
      return CompletedWork(0, absl::FailedPreconditionError(
                                  absl::StrCat("communicator ", key_prefix_, " is shut down")));
    }
    const uint64_t seq = ++next_seq_;
    auto work = std::make_shared<PendingWork>(seq);
    FlightRecord rec;
    rec.seq = seq;
    rec.op = args.type;
    rec.group = options_.group_name;
    rec.bytes = args.count * DataTypeSize(args.dtype);
    rec.dtype = args.dtype;
    rec.peer =
        (args.type == OpType::kBroadcast || args.type == OpType::kReduce) ? args.root : args.peer;
    rec.enqueue_time = absl::Now();
    rec.state = OpState::kQueued;
    recorder_.Queued(rec);
    queue_.push_back(Item{args, seq, work});
    return work;
  }

  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override {
    if (absl::Status h = health(); !h.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("Split on poisoned communicator: ", h.message()));
    }
    const int k = ++split_count_;
    const std::string base = absl::StrCat(key_prefix_, "/split", k, "/");
    if (absl::Status s = store_->Set(absl::StrCat(base, rank_), absl::StrCat(color, ",", key));
        !s.ok()) {
      return s;
    }
    // (key, parent rank) of every member with our colour.
    std::vector<std::pair<int, int>> members;
    const absl::Time deadline = absl::Now() + options_.timeout;
    for (int r = 0; r < size_; ++r) {
      absl::StatusOr<std::string> v = store_->Get(
          absl::StrCat(base, r), std::max(absl::ZeroDuration(), deadline - absl::Now()));
      if (!v.ok()) {
        return absl::DeadlineExceededError(absl::StrCat("Split #", k, " of group ", key_prefix_,
                                                        ": rank ", r,
                                                        " did not arrive: ", v.status().message()));
      }
      std::pair<std::string, std::string> parts = absl::StrSplit(*v, ',');
      int c = 0, kk = 0;
      if (!absl::SimpleAtoi(parts.first, &c) || !absl::SimpleAtoi(parts.second, &kk)) {
        return absl::InternalError(absl::StrCat("Split: bad entry '", *v, "'"));
      }
      if (c == color) members.emplace_back(kk, r);
    }
    if (color == kNoColor) return std::unique_ptr<Communicator>();
    std::sort(members.begin(), members.end());
    int new_rank = -1;
    for (size_t i = 0; i < members.size(); ++i) {
      if (members[i].second == rank_) new_rank = static_cast<int>(i);
    }
    GlooOptions child = options_;
    child.group_name = absl::StrCat(options_.group_name, ".split", k, ".c", color);
    child.failure_domains.push_back(absl::StrCat(key_prefix_, "/failures"));
    return CreateGlooCommunicator(store_, new_rank, static_cast<int>(members.size()), child,
                                  device_);
  }

  absl::Status Shutdown() override {
    {
      absl::MutexLock lock(&mu_);
      if (shut_down_) return absl::OkStatus();
      shut_down_ = true;
    }
    absl::Status status;
    if (thread_.joinable()) {
      // A final barrier so no peer is still using the connections we close.
      if (health().ok() && size_ > 1) status = Barrier();
      {
        absl::MutexLock lock(&mu_);
        stopping_ = true;
      }
      thread_.join();
    }
    {
      absl::MutexLock lock(&abort_mu_);
      watcher_stop_ = true;
    }
    if (watcher_.joinable()) watcher_.join();
    ctx_.reset();
    rings_.set_context(nullptr);
    return status;
  }

 private:
  struct Item {
    OpArgs args;
    uint64_t seq;
    std::shared_ptr<PendingWork> work;
  };

  void Loop() {
    while (true) {
      Item item;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]()
                         ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !queue_.empty() || stopping_; };
        mu_.Await(absl::Condition(&ready));
        if (queue_.empty()) return;  // stopping_ and drained
        item = std::move(queue_.front());
        queue_.pop_front();
      }
      absl::Status poisoned = health();
      if (!poisoned.ok()) {
        absl::Status s = absl::AbortedError(
            absl::StrCat(OpTypeName(item.args.type), " seq=", item.seq, " aborted: communicator ",
                         key_prefix_, " was poisoned by: ", poisoned.message()));
        recorder_.Failed(item.seq, s.message());
        item.work->Complete(s);
        continue;
      }
      recorder_.Running(item.seq);
      const absl::Time start = absl::Now();
      {
        absl::MutexLock lock(&abort_mu_);
        running_since_ = start;
      }
      const absl::Time deadline = start + OpTimeout(item.args);
      absl::Status s = AwaitAfter(item.args, deadline);
      if (s.ok()) s = Execute(item.args, std::max(deadline - absl::Now(), absl::Milliseconds(1)));
      {
        absl::MutexLock lock(&abort_mu_);
        running_since_ = absl::InfiniteFuture();
      }
      if (s.ok()) {
        recorder_.Done(item.seq);
        item.work->Complete(s);
        continue;
      }
      s = HandleFailure(item, s, absl::Now() - start);
      item.work->Complete(s);
    }
  }

  absl::Duration OpTimeout(const OpArgs& a) const {
    return a.timeout > absl::ZeroDuration() ? a.timeout : options_.timeout;
  }

  // Waits on the host until `a.after` completed (OpArgs::after), until
  // `deadline` at most; another rank's failure aborts the wait. Polls
  // Query() rather than blocking in Synchronize() so that an event that
  // never completes fails the op at its timeout instead of hanging this
  // thread (and Shutdown) for good.
  absl::Status AwaitAfter(const OpArgs& a, absl::Time deadline) {
    if (a.after == nullptr) return absl::OkStatus();
    absl::Duration backoff = absl::Microseconds(20);
    while (!a.after->Query()) {
      {
        absl::MutexLock lock(&abort_mu_);
        if (!peer_failure_.empty()) {
          return absl::AbortedError(
              absl::StrCat("aborted while waiting for its OpArgs::after event: ", peer_failure_));
        }
      }
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat("Timed out waiting ",
                                                        absl::FormatDuration(OpTimeout(a)),
                                                        " for its OpArgs::after event"));
      }
      absl::SleepFor(backoff);
      backoff = std::min(backoff * 2, absl::Milliseconds(1));
    }
    if (absl::Status s = a.after->Synchronize(); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("its OpArgs::after event failed: ", s.message()));
    }
    return absl::OkStatus();
  }

  // Runs the op; `timeout` is what is left of its deadline.
  absl::Status Execute(const OpArgs& a, absl::Duration timeout) {
    try {
      if (size_ == 1) {
        ExecuteLocal(a);
      } else {
        ExecuteGloo(a, timeout);
      }
    } catch (const gloo::IoException& e) {
      const std::string what = e.what();
      if (what.find("Timed out") != std::string::npos) {
        return absl::DeadlineExceededError(what);
      }
      return absl::AbortedError(what);
    } catch (const std::exception& e) {
      return absl::InternalError(e.what());
    }
    return absl::OkStatus();
  }

  // A group of one: every collective is the identity (or a copy).
  void ExecuteLocal(const OpArgs& a) {
    const size_t bytes = a.count * DataTypeSize(a.dtype);
    switch (a.type) {
      case OpType::kAllGather:
      case OpType::kReduceScatter:
      case OpType::kAllToAllV:  // to itself: send_counts[0] == recv_counts[0] == count
        if (bytes) std::memcpy(a.output, a.input, bytes);
        return;
      default:
        return;  // AllReduce (sum/avg/max of one), Broadcast, Reduce, Barrier
    }
  }

  // Returns a pointer to fp32 data for an in-place reduction of `n` elements
  // of `buf`: the buffer itself for fp32, else a converted scratch copy.
  float* AsFloat(DataType dtype, void* buf, size_t n) {
    if (dtype == DataType::kFloat32) return static_cast<float*>(buf);
    if (scratch_.size() < n) scratch_.resize(n);
    ToFloat32(dtype, buf, scratch_.data(), n);
    return scratch_.data();
  }

  static gloo::AllreduceOptions::Func ReduceFunc(ReduceOp op) {
    if (op == ReduceOp::kMax) {
      return static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::max<float>);
    }
    return static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>);
  }

  void ExecuteGloo(const OpArgs& a, absl::Duration timeout) {
    const auto ms = ToMs(timeout);
    const size_t bytes = a.count * DataTypeSize(a.dtype);
    switch (a.type) {
      case OpType::kAllReduce: {
        if (a.count == 0) return;
        float* f = AsFloat(a.dtype, a.output, a.count);
        if (options_.allreduce_algorithm == GlooOptions::AllreduceAlgorithm::kGlooRing) {
          gloo::AllreduceOptions o(ctx_);
          o.setOutput(f, a.count);
          o.setReduceFunction(ReduceFunc(a.reduce));
          o.setTag(1);
          o.setTimeout(ms);
          gloo::allreduce(o);
        } else {
          rings_.AllReduce(f, a.count, a.reduce, timeout);
        }
        if (a.reduce == ReduceOp::kAvg) ScaleFloats(f, a.count, 1.0f / size_);
        if (a.dtype != DataType::kFloat32) FromFloat32(a.dtype, f, a.output, a.count);
        return;
      }
      case OpType::kReduce: {
        if (a.count == 0) return;
        float* f = AsFloat(a.dtype, a.output, a.count);
        gloo::ReduceOptions o(ctx_);
        o.setOutput(f, a.count);
        o.setRoot(a.root);
        o.setReduceFunction(ReduceFunc(a.reduce));
        o.setTag(2);
        o.setTimeout(ms);
        gloo::reduce(o);
        if (rank_ == a.root) {
          if (a.reduce == ReduceOp::kAvg) ScaleFloats(f, a.count, 1.0f / size_);
          if (a.dtype != DataType::kFloat32) FromFloat32(a.dtype, f, a.output, a.count);
        }
        return;
      }
      case OpType::kBroadcast:
        if (bytes == 0) return;
        rings_.Broadcast(static_cast<uint8_t*>(a.output), bytes, a.root, timeout);
        return;
      case OpType::kAllGather:
        if (bytes == 0) return;
        rings_.AllGather(static_cast<const uint8_t*>(a.input), static_cast<uint8_t*>(a.output),
                         bytes, timeout);
        return;
      case OpType::kReduceScatter:
        if (a.count == 0) return;
        rings_.ReduceScatter(a, timeout);
        return;
      case OpType::kSend:
      case OpType::kRecv:
      case OpType::kSendRecv:
        PointToPoint(a, timeout);
        return;
      case OpType::kAllToAllV:
        rings_.AllToAllV(a, timeout);
        return;
      case OpType::kBarrier: {
        gloo::BarrierOptions o(ctx_);
        o.setTag(5);
        o.setTimeout(ms);
        gloo::barrier(o);
        return;
      }
    }
  }

  // Waits for one receive (send) completion on `b` until `deadline`. The
  // peer watcher may abort the wait when another rank reported a failure
  // (Gloo does not fail a send still waiting for a dead peer's
  // recv-ready notification). Throws gloo::IoException on failure.
  void WaitRecv(gloo::transport::UnboundBuffer* b, absl::Time deadline, absl::string_view what) {
    Wait(b, /*send=*/false, deadline, what);
  }
  void WaitSend(gloo::transport::UnboundBuffer* b, absl::Time deadline, absl::string_view what) {
    Wait(b, /*send=*/true, deadline, what);
  }
  void Wait(gloo::transport::UnboundBuffer* b, bool send, absl::Time deadline,
            absl::string_view what) {
    {
      absl::MutexLock lock(&abort_mu_);
      if (!peer_failure_.empty()) throw gloo::IoException(peer_failure_);
      waiting_on_ = b;
    }
    const bool ok = send ? b->waitSend(ToMs(deadline - absl::Now()))
                         : b->waitRecv(ToMs(deadline - absl::Now()));
    absl::MutexLock lock(&abort_mu_);
    waiting_on_ = nullptr;
    if (!ok) {
      throw gloo::IoException(absl::StrCat(
          what, ": wait aborted: ", peer_failure_.empty() ? "unknown reason" : peer_failure_));
    }
  }

  // Peer watcher: while an op has been running for longer than
  // kPeerPollInterval, polls the failure counters of its group, then of the
  // enclosing groups (GlooOptions::failure_domains), in the store every
  // interval; once another rank has failed, aborts our pending unbound-buffer
  // wait so this rank fails now rather than at its timeout. (Gloo's own
  // Reduce and Barrier cannot be aborted; they fail at their timeout.)
  void WatchPeers() {
    std::vector<std::string> keys = {absl::StrCat(key_prefix_, "/failures")};
    keys.insert(keys.end(), options_.failure_domains.begin(), options_.failure_domains.end());
    while (true) {
      bool poll = false;
      {
        absl::MutexLock lock(&abort_mu_);
        auto stop = [this]() ABSL_SHARED_LOCKS_REQUIRED(abort_mu_) { return watcher_stop_; };
        if (abort_mu_.AwaitWithTimeout(absl::Condition(&stop),
                                       options_.peer_failure_poll_interval)) {
          return;
        }
        poll = peer_failure_.empty() && !self_failed_ &&
               absl::Now() - running_since_ > options_.peer_failure_poll_interval;
      }
      if (!poll) continue;
      absl::StatusOr<std::string> v;
      size_t i = 0;
      while (i < keys.size() && !(v = store_->Get(keys[i], absl::ZeroDuration())).ok()) ++i;
      if (i == keys.size()) continue;
      absl::MutexLock lock(&abort_mu_);
      if (self_failed_) continue;
      peer_failure_ =
          absl::StrCat(i == 0 ? "another rank of group " : "a rank of an enclosing group of ",
                       key_prefix_, " failed (", keys[i], " = ", *v, ")");
      if (waiting_on_ != nullptr) {
        waiting_on_->abortWaitRecv();
        waiting_on_->abortWaitSend();
      }
    }
  }

  uint64_t NextP2PSlot(std::map<std::pair<int, uint32_t>, uint64_t>& counters, int peer,
                       uint32_t tag) {
    const uint64_t n = counters[{peer, tag}]++;
    return kP2PSlotBase | (static_cast<uint64_t>(tag & 0xffffff) << 24) | (n & 0xffffff);
  }

  void PointToPoint(const OpArgs& a, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    const size_t esz = DataTypeSize(a.dtype);
    std::unique_ptr<gloo::transport::UnboundBuffer> send_buf, recv_buf;
    const bool do_recv = (a.type == OpType::kRecv && a.count > 0) ||
                         (a.type == OpType::kSendRecv && a.recv_count > 0);
    const bool do_send = a.type != OpType::kRecv && a.count > 0;
    if (do_recv) {
      const int src = a.type == OpType::kRecv ? a.peer : a.recv_peer;
      const size_t n = a.type == OpType::kRecv ? a.count : a.recv_count;
      recv_buf = ctx_->createUnboundBuffer(a.output, n * esz);
      recv_buf->recv(src, NextP2PSlot(recv_counters_, src, a.tag));
    }
    if (do_send) {
      send_buf = ctx_->createUnboundBuffer(const_cast<void*>(a.input), a.count * esz);
      send_buf->send(a.peer, NextP2PSlot(send_counters_, a.peer, a.tag));
    }
    if (recv_buf) WaitRecv(recv_buf.get(), deadline, OpTypeName(a.type));
    if (send_buf) WaitSend(send_buf.get(), deadline, OpTypeName(a.type));
  }

  // Tears the transport down, exchanges failure reports through the store,
  // poisons the communicator and returns the status to report.
  absl::Status HandleFailure(const Item& item, const absl::Status& cause, absl::Duration elapsed) {
    // Closing our connections makes peers blocked on us fail now instead of
    // at their timeout; the failure counter wakes the peer watchers of ranks
    // blocked on someone else.
    ctx_.reset();
    rings_.set_context(nullptr);
    {
      absl::MutexLock lock(&abort_mu_);
      self_failed_ = true;
    }
    store_->Add(absl::StrCat(key_prefix_, "/failures"), 1).IgnoreError();
    for (const std::string& domain : options_.failure_domains) store_->Add(domain, 1).IgnoreError();
    const FailureReports reports =
        ExchangeFailureReports(*store_, key_prefix_, rank_, size_, item.seq, item.args.type,
                               options_.failure_report_grace);
    const absl::Status status = FailureStatus(item.args.type, item.seq, key_prefix_, rank_, size_,
                                              item.args.count * DataTypeSize(item.args.dtype),
                                              item.args.dtype, elapsed, cause, reports);
    recorder_.Failed(item.seq, status.message());
    {
      absl::MutexLock lock(&mu_);
      poison_ = status;
    }
    if (options_.dump_on_failure) {
      std::cerr << "[shardtrain comm] " << status.ToString()
                << "\n[shardtrain comm] flight recorder of " << key_prefix_ << " rank " << rank_
                << ":\n"
                << recorder_.DumpText() << std::flush;
    }
    return status;
  }

  const std::shared_ptr<RendezvousStore> store_;
  const int rank_;
  const int size_;
  const GlooOptions options_;
  const std::string key_prefix_;
  std::shared_ptr<gloo::transport::Device> device_;
  // Used only by the comm thread after construction (and by Shutdown after
  // the thread is joined).
  std::shared_ptr<gloo::Context> ctx_;
  FlightRecorder recorder_;
  std::thread thread_;
  std::thread watcher_;
  std::atomic<int> split_count_{0};

  // Shared by the comm thread and the peer watcher.
  absl::Mutex abort_mu_;
  gloo::transport::UnboundBuffer* waiting_on_ ABSL_GUARDED_BY(abort_mu_) = nullptr;
  absl::Time running_since_ ABSL_GUARDED_BY(abort_mu_) = absl::InfiniteFuture();
  std::string peer_failure_ ABSL_GUARDED_BY(abort_mu_);
  bool self_failed_ ABSL_GUARDED_BY(abort_mu_) = false;
  bool watcher_stop_ ABSL_GUARDED_BY(abort_mu_) = false;

  mutable absl::Mutex mu_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status poison_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;

  // Comm-thread state.
  std::vector<float> scratch_;  // AsFloat
  GlooRings rings_{rank_, size_,
                   [this](gloo::transport::UnboundBuffer* b, bool send, absl::Time deadline,
                          absl::string_view what) { Wait(b, send, deadline, what); }};
  std::map<std::pair<int, uint32_t>, uint64_t> send_counters_, recv_counters_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(
    std::shared_ptr<RendezvousStore> store, int rank, int size, const GlooOptions& options,
    std::shared_ptr<gloo::transport::Device> device) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat("CreateGlooCommunicator: rank ", rank,
                                                   " / size ", size,
                                                   " invalid (need 0 <= rank < size)"));
  }
  if (store == nullptr) {
    return absl::InvalidArgumentError("CreateGlooCommunicator: null store");
  }
  IgnoreSigpipe();
  if (device == nullptr && size > 1) {
    try {
      gloo::transport::tcp::attr attr;
      attr.hostname = options.hostname;
      device = gloo::transport::tcp::CreateDevice(attr);
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          absl::StrCat("Gloo TCP device on ", options.hostname, ": ", e.what()));
    }
  }
  auto comm =
      std::make_unique<GlooCommunicator>(std::move(store), rank, size, options, std::move(device));
  if (absl::Status s = comm->Connect(); !s.ok()) return s;
  comm->Start();
  return std::unique_ptr<Communicator>(std::move(comm));
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(
    std::shared_ptr<RendezvousStore> store, int rank, int size, const GlooOptions& options) {
  return CreateGlooCommunicator(std::move(store), rank, size, options, nullptr);
}

}  // namespace shardtrain::comm
