#include "worker/report_outbox.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace shardtrain::worker {
namespace {

using Clock = std::chrono::steady_clock;

// Not delivered: the coordinator is unreachable, or did not answer in time
// (hung, paused, failing over). Every report is safe to send again.
bool Undelivered(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s);
}
constexpr auto kFirstBackoff = std::chrono::milliseconds(250);
constexpr auto kMaxBackoff = std::chrono::seconds(1);
constexpr size_t kMaxKept = 4096;  // kept reports beyond this: the oldest goes

}  // namespace

ReportOutbox::ReportOutbox(std::function<void(const std::string&)> log,
                           const std::atomic<bool>* stop, size_t max_queued_steps)
    : log_(std::move(log)), stop_(stop), max_queued_steps_(std::max<size_t>(1, max_queued_steps)) {
  sender_ = std::thread([this] { Run(); });
}

ReportOutbox::~ReportOutbox() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
  }
  cv_.notify_all();
  sender_.join();
  if (!queue_.empty()) {
    log_(absl::StrCat(queue_.size(),
                      " reports never reached the coordinator (the run ended "
                      "first); the first: ",
                      queue_.front().what));
  }
}

void ReportOutbox::Push(Item item) {
  if (item.kind == Kind::kStep) {
    if (queued_steps_ >= max_queued_steps_) {
      auto oldest = std::find_if(queue_.begin(), queue_.end(),
                                 [](const Item& i) { return i.kind == Kind::kStep; });
      if (dropped_ == 0) {
        log_(absl::StrCat("more than ", max_queued_steps_,
                          " step reports held: dropping the oldest (", oldest->what, ") and on"));
      }
      queue_.erase(oldest);
      --queued_steps_;
      ++dropped_;
    }
    ++queued_steps_;
  }
  queue_.push_back(std::move(item));
}

absl::Status ReportOutbox::Send(Item item, bool* queued) {
  if (queued) *queued = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (busy_ || !queue_.empty()) {
      Push(std::move(item));
      ++held_;
      cv_.notify_all();
      return absl::OkStatus();
    }
    busy_ = true;
    inline_sender_ = std::this_thread::get_id();
  }
  absl::Status s = item.send();
  std::lock_guard<std::mutex> lock(mu_);
  busy_ = false;
  inline_sender_ = std::thread::id();
  if (Undelivered(s)) {
    if (!outage_) {
      outage_ = true;
      outage_since_ = Clock::now();
      held_ = 0;
      log_(absl::StrCat("coordinator unreachable (", s.message(), "): holding ", item.what,
                        " and every later report, to send in order once it answers"));
    }
    ++held_;
    if (item.kind == Kind::kStep) ++queued_steps_;
    queue_.push_front(std::move(item));
    cv_.notify_all();
    return absl::OkStatus();
  }
  cv_.notify_all();
  if (queued) *queued = false;
  return s;
}

void ReportOutbox::Queue(Item item) {
  std::lock_guard<std::mutex> lock(mu_);
  Push(std::move(item));
  cv_.notify_all();
}

bool ReportOutbox::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  while (busy_ || !queue_.empty()) {
    if (stop_ && *stop_) return false;
    cv_.wait_for(lock, std::chrono::milliseconds(100));
  }
  return true;
}

bool ReportOutbox::backlogged() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !queue_.empty();
}

bool ReportOutbox::sending_now() const {
  std::lock_guard<std::mutex> lock(mu_);
  return inline_sender_ == std::this_thread::get_id();
}

void ReportOutbox::Keep(Item item) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::pair<int, int64_t> key{static_cast<int>(item.kind), item.step};
  kept_.insert_or_assign(key, std::move(item));
  if (kept_.size() > kMaxKept) kept_.erase(kept_.begin());
}

void ReportOutbox::ForgetKept(Kind kind, int64_t below) {
  std::lock_guard<std::mutex> lock(mu_);
  const int k = static_cast<int>(kind);
  kept_.erase(kept_.lower_bound({k, INT64_MIN}), kept_.lower_bound({k, below}));
}

void ReportOutbox::SawInstance(const std::string& instance) {
  if (instance.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (instance_.empty() || instance_ == instance) {
    instance_ = instance;
    return;
  }
  instance_ = instance;
  if (kept_.empty()) return;
  log_(absl::StrCat("the coordinator restarted (instance ", instance, "): re-sending ",
                    kept_.size(), " reports it acknowledged before"));
  // kept_ is ordered by (kind, step): steps first, then shards, each in
  // step order; pushed to the front in reverse keeps that order.
  for (auto it = kept_.rbegin(); it != kept_.rend(); ++it) {
    if (it->second.kind == Kind::kStep) ++queued_steps_;
    queue_.push_front(it->second);
  }
  kept_.clear();
  cv_.notify_all();
}

int64_t ReportOutbox::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

void ReportOutbox::Delivered() {
  if (!outage_ || busy_ || !queue_.empty()) return;
  outage_ = false;
  const double seconds = std::chrono::duration<double>(Clock::now() - outage_since_).count();
  log_(absl::StrFormat(
      "coordinator answers again: %d held reports delivered after %.1f s%s", held_, seconds,
      dropped_ > 0 ? absl::StrCat("; ", dropped_, " step reports dropped (queue full)")
                   : std::string()));
  held_ = 0;
}

void ReportOutbox::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  auto backoff = std::chrono::duration_cast<Clock::duration>(kFirstBackoff);
  while (true) {
    cv_.wait(lock, [&] { return closing_ || (!busy_ && !queue_.empty()); });
    if (closing_) return;
    Item item = std::move(queue_.front());
    queue_.pop_front();
    if (item.kind == Kind::kStep) --queued_steps_;
    busy_ = true;
    lock.unlock();
    absl::Status s = item.send();
    lock.lock();
    busy_ = false;
    if (Undelivered(s)) {
      if (!outage_) {
        outage_ = true;
        outage_since_ = Clock::now();
        log_(absl::StrCat("coordinator unreachable (", s.message(), "): holding ", item.what,
                          " and every later report"));
      }
      if (item.kind == Kind::kStep) ++queued_steps_;
      queue_.push_front(std::move(item));
      cv_.notify_all();
      cv_.wait_for(lock, backoff, [&] { return closing_.load(); });
      backoff = std::min<Clock::duration>(backoff * 2, kMaxBackoff);
      continue;
    }
    backoff = kFirstBackoff;
    if (!s.ok()) log_(absl::StrCat(item.what, " not reported: ", s.ToString()));
    Delivered();
    cv_.notify_all();
  }
}

}  // namespace shardtrain::worker
