// ThreadPool: the engine's single pool of compute threads. Every parallel
// loop of the engine, including matmuls (each thread calls a single-threaded
// OpenBLAS sgemm on its slice), runs on it, so 2 cores never host more than 2
// busy engine threads (no OpenMP/OpenBLAS-pthread oversubscription).
//
// Idle workers spin briefly (~100 us) and then block on a condition variable,
// so an idle engine costs no CPU. Not thread-safe: Run() must be called from
// one thread at a time, and never from inside a task.
#ifndef SHARDTRAIN_WORKER_ENGINE_THREAD_POOL_H_
#define SHARDTRAIN_WORKER_ENGINE_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace shardtrain::engine {

class ThreadPool {
 public:
  // threads >= 1 (the calling thread counts as one: threads - 1 are started).
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_; }

  // Runs fn(tid) for every tid in [0, size()) (tid 0 on the caller) and
  // returns when all have finished.
  void Run(const std::function<void(int)>& fn);

  // Splits [0, n) into size() contiguous chunks and runs f(begin, end) on
  // each; runs serially when n < 2 * min_grain. The split depends only on n
  // and size().
  template <class F>
  void ParallelFor(int64_t n, F&& f, int64_t min_grain = 1) {
    if (n <= 0) return;
    if (n_ == 1 || n < 2 * min_grain) {
      f(int64_t{0}, n);
      return;
    }
    const int64_t parts = n_;
    Run([&](int tid) {
      const int64_t b = n * tid / parts, e = n * (tid + 1) / parts;
      if (b < e) f(b, e);
    });
  }

 private:
  void WorkerLoop(int tid);

  const int n_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  const std::function<void(int)>* fn_ = nullptr;
};

// Runs f(begin, end) over [0, n) on `pool`, or serially when pool is null.
template <class F>
void ParallelFor(ThreadPool* pool, int64_t n, F&& f, int64_t min_grain = 1) {
  if (pool == nullptr) {
    if (n > 0) f(int64_t{0}, n);
  } else {
    pool->ParallelFor(n, std::forward<F>(f), min_grain);
  }
}

}  // namespace shardtrain::engine

#endif  // SHARDTRAIN_WORKER_ENGINE_THREAD_POOL_H_
