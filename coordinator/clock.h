// Time source of the coordinator core, injectable so lease expiry can be
// tested without sleeping. Thread-safe.
#ifndef SHARDTRAIN_COORDINATOR_CLOCK_H_
#define SHARDTRAIN_COORDINATOR_CLOCK_H_

#include <atomic>
#include <chrono>
#include <cstdint>

namespace shardtrain::coordinator {

class Clock {
 public:
  virtual ~Clock() = default;
  // Milliseconds since the Unix epoch.
  virtual int64_t NowMs() const = 0;
};

class RealClock final : public Clock {
 public:
  int64_t NowMs() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
};

// Moves only when told to.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(int64_t start_ms = 1'700'000'000'000) : now_(start_ms) {}
  int64_t NowMs() const override { return now_.load(); }
  void AdvanceMs(int64_t ms) { now_ += ms; }

 private:
  std::atomic<int64_t> now_;
};

}  // namespace shardtrain::coordinator

#endif  // SHARDTRAIN_COORDINATOR_CLOCK_H_
