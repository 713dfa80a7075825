#pragma once
// A persistent pool of worker threads. The calling thread takes part in every job, so a pool of
// N threads starts N-1 workers. Jobs are handed over without allocation: workers spin briefly on a
// generation counter and then sleep on it, which keeps per-job latency in the microseconds for the
// hundreds of small parallel regions of one decode step.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace tandem {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);  // n_threads <= 0: one per available core
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Calls fn(thread_index, n_threads) once on every thread and returns when all are done.
  // An exception thrown by any thread is rethrown here. Called from inside a job, it runs inline.
  template <typename F>
  void run(F&& fn) {
    run_erased(&fn, [](void* f, int t, int n) { (*static_cast<std::remove_reference_t<F>*>(f))(t, n); });
  }

  // Splits [0, n) into one contiguous range per thread (multiples of `grain` where possible) and
  // calls fn(begin, end) for each non-empty range.
  template <typename F>
  void parallel_for(int64_t n, F&& fn, int64_t grain = 1) {
    if (n <= 0) return;
    run([&](int t, int nt) {
      auto [begin, end] = split_range(n, t, nt, grain);
      if (begin < end) fn(begin, end);
    });
  }

  // Hands out [0, n) in chunks of `chunk` (the last may be shorter) to whichever thread asks next,
  // calling fn(begin, end) for each: a thread that is slowed down (a busy host taking its core)
  // does fewer chunks instead of holding everyone up at the end.
  template <typename F>
  void parallel_chunks(int64_t n, int64_t chunk, F&& fn) {
    if (n <= 0) return;
    chunk = std::max<int64_t>(1, chunk);
    std::atomic<int64_t> next{0};
    run([&](int, int) {
      for (int64_t begin; (begin = next.fetch_add(chunk, std::memory_order_relaxed)) < n;)
        fn(begin, std::min(n, begin + chunk));
    });
  }

  static std::pair<int64_t, int64_t> split_range(int64_t n, int t, int nt, int64_t grain);
  static int default_threads();

 private:
  using Trampoline = void (*)(void*, int, int);
  void run_erased(void* fn, Trampoline trampoline);
  void worker_loop(int index);
  void execute(int index);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex run_mutex_;  // one job at a time when several threads share the pool
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  void* job_ = nullptr;
  Trampoline trampoline_ = nullptr;
  std::mutex error_mutex_;
  std::exception_ptr error_;
};

}  // namespace tandem
