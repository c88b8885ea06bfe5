// Pieces gpt.cc and gpt_block.cc share: the unit-use scope that calls the
// parameter hook, zeroing scratch, and the profiling phase timer. Internal
// to the CPU engine.
#ifndef SHARDTRAIN_WORKER_ENGINE_CPU_GPT_INTERNAL_H_
#define SHARDTRAIN_WORKER_ENGINE_CPU_GPT_INTERNAL_H_

#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>

#include "worker/engine/cpu/gpt.h"

namespace shardtrain::engine::cpu {

class Gpt::UnitScope {
 public:
  UnitScope(const Gpt& gpt, int tensor)
      : hook_(gpt.param_hook_), unit_(gpt.layout_.tensors()[tensor].unit) {
    if (hook_) hook_(unit_, true);
  }
  ~UnitScope() {
    if (hook_) hook_(unit_, false);
  }
  UnitScope(const UnitScope&) = delete;
  UnitScope& operator=(const UnitScope&) = delete;

 private:
  const std::function<void(int, bool)>& hook_;
  const int unit_;
};

// Sets n floats at p to 0 on the pool's threads (the backward's scratch).
inline void ZeroFill(float* p, int64_t n, ThreadPool* pool) {
  pool->ParallelFor(
      n, [&](int64_t i0, int64_t i1) { std::memset(p + i0, 0, sizeof(float) * (i1 - i0)); },
      1 << 14);
}

// Times a phase into `slot` when profiling.
class PhaseTimer {
 public:
  PhaseTimer(bool on, double* slot) : on_(on), slot_(slot) {
    if (on_) t0_ = std::chrono::steady_clock::now();
  }
  ~PhaseTimer() {
    if (on_) {
      *slot_ +=
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count();
    }
  }

 private:
  bool on_;
  double* slot_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace shardtrain::engine::cpu

#endif  // SHARDTRAIN_WORKER_ENGINE_CPU_GPT_INTERNAL_H_
