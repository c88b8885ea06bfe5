#include "worker/engine/thread_pool.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define SHARDTRAIN_CPU_RELAX() _mm_pause()
#else
#define SHARDTRAIN_CPU_RELAX() std::this_thread::yield()
#endif

namespace shardtrain::engine {
namespace {
constexpr int kSpinIterations = 4000;  // ~100 us of pause instructions
}  // namespace

ThreadPool::ThreadPool(int threads) : n_(threads < 1 ? 1 : threads) {
  for (int t = 1; t < n_; ++t) threads_.emplace_back([this, t] { WorkerLoop(t); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
    generation_.fetch_add(1);
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::Run(const std::function<void(int)>& fn) {
  if (n_ == 1) {
    fn(0);
    return;
  }
  fn_ = &fn;
  pending_.store(n_ - 1, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
  fn(0);
  int spins = 0;
  while (pending_.load(std::memory_order_acquire) != 0) {
    if (++spins < kSpinIterations * 4) {
      SHARDTRAIN_CPU_RELAX();
    } else {
      std::this_thread::yield();
    }
  }
}

void ThreadPool::WorkerLoop(int tid) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t g = generation_.load(std::memory_order_acquire);
    for (int i = 0; g == seen && i < kSpinIterations; ++i) {
      SHARDTRAIN_CPU_RELAX();
      g = generation_.load(std::memory_order_acquire);
    }
    if (g == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      g = generation_.load(std::memory_order_acquire);
    }
    if (stop_.load()) return;
    seen = g;
    (*fn_)(tid);
    pending_.fetch_sub(1, std::memory_order_release);
  }
}

}  // namespace shardtrain::engine
