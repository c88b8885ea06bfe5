// A rank's reports to the coordinator, delivered in order and none lost to
// an outage: a coordinator that is down, restarting or failing over.
//
// A report goes out at once when nothing waits before it (the usual case:
// the caller gets the coordinator's answer, as with a direct call). When the
// coordinator cannot be reached (UNAVAILABLE) or does not answer in time
// (DEADLINE_EXCEEDED: hung, paused), the report is held, and every
// later one queues behind it; a sender thread re-sends the oldest with
// backoff until the coordinator answers, then the rest in order. Training
// never waits on it. The queue is bounded: past max_queued_steps step
// reports, the oldest step report is dropped (and counted); checkpoint,
// event and final reports are never dropped.
//
// What the coordinator acknowledged but holds only in memory until more
// reports arrive (a step some rank has not reported yet, a checkpoint shard
// not yet committed) is kept as well (Keep): when the coordinator's
// instance id changes (SawInstance: it restarted, or another one leads),
// the kept reports are re-sent before anything else, so the new process
// ends up with everything the old one was told. The coordinator ignores a
// re-sent report it already recorded.
//
// Thread-safe. Items' send functions run on the caller's thread (sent at
// once) or the sender thread, one at a time, never concurrently.
#ifndef SHARDTRAIN_WORKER_REPORT_OUTBOX_H_
#define SHARDTRAIN_WORKER_REPORT_OUTBOX_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "absl/status/status.h"

namespace shardtrain::worker {

class ReportOutbox {
 public:
  // What an item reports; the order of Keep's re-sends (steps, then shards).
  enum class Kind { kStep = 0, kShard = 1, kOther = 2 };
  struct Item {
    Kind kind = Kind::kOther;
    int64_t step = 0;  // the training step it is about (kStep, kShard)
    std::string what;  // for the log: "step 23", "checkpoint step 40"
    // Sends the report once and handles the answer. UNAVAILABLE or
    // DEADLINE_EXCEEDED: not delivered; the item is sent again later. Any other
    // error is final for this item (the caller's send handles what it means).
    std::function<absl::Status()> send;
  };

  // log: one line to the worker's log. stop: the job must end now (Drain
  // gives up). max_queued_steps >= 1.
  ReportOutbox(std::function<void(const std::string&)> log, const std::atomic<bool>* stop,
               size_t max_queued_steps = 100'000);
  // Stops the sender (waits for an item in flight); reports still queued
  // are dropped, and said so in the log.
  ~ReportOutbox();
  ReportOutbox(const ReportOutbox&) = delete;
  ReportOutbox& operator=(const ReportOutbox&) = delete;

  // Sends `item` now when nothing is queued or in flight, else queues it
  // behind the rest. Returns the send's status when it was sent now (not
  // undelivered), and OK with *queued = true when it waits in the queue.
  absl::Status Send(Item item, bool* queued = nullptr);
  // Queues `item` behind the rest without trying it now.
  void Queue(Item item);
  // Waits until every queued report was delivered (or refused); false when
  // the stop flag was set first.
  bool Drain();
  // Whether reports wait in the queue (not counting one in flight).
  bool backlogged() const;
  // Whether the calling thread is running an item Send is sending now (not
  // the sender thread's).
  bool sending_now() const;
  // Set when the outbox is being destroyed: long sends (a commit's wait)
  // give up.
  const std::atomic<bool>& closing() const { return closing_; }

  // Keeps `item` (replacing one of the same kind and step) to re-send when
  // the coordinator's instance changes.
  void Keep(Item item);
  // Forgets the kept items of `kind` with step < below.
  void ForgetKept(Kind kind, int64_t below);
  // The instance id an answer carried (empty: none, ignored). When it
  // differs from the last one seen, the kept items go to the front of the
  // queue, steps first, in step order.
  void SawInstance(const std::string& instance);
  // Reports dropped because the queue was full, since the start.
  int64_t dropped() const;

 private:
  void Push(Item item);  // mu_ held
  void Run();            // the sender thread
  // Called with mu_ held after an item was delivered: logs the end of an
  // outage once the queue is empty.
  void Delivered();

  const std::function<void(const std::string&)> log_;
  const std::atomic<bool>* const stop_;
  const size_t max_queued_steps_;
  std::atomic<bool> closing_{false};

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;                        // GUARDED_BY(mu_)
  size_t queued_steps_ = 0;                       // GUARDED_BY(mu_): kStep items in queue_
  bool busy_ = false;                             // GUARDED_BY(mu_): an item is being sent
  std::thread::id inline_sender_;                 // GUARDED_BY(mu_): Send's thread while it sends
  std::map<std::pair<int, int64_t>, Item> kept_;  // GUARDED_BY(mu_)
  std::string instance_;                          // GUARDED_BY(mu_)
  int64_t dropped_ = 0;                           // GUARDED_BY(mu_)
  // The outage in progress: since when, how many reports were held.
  bool outage_ = false;  // GUARDED_BY(mu_)
  std::chrono::steady_clock::time_point outage_since_;
  int64_t held_ = 0;
  std::thread sender_;  // last: started once the rest is set up
};

}  // namespace shardtrain::worker

#endif  // SHARDTRAIN_WORKER_REPORT_OUTBOX_H_
