#pragma once
// A persistent pool of worker threads. The calling thread takes part in every job, so a pool of
// N threads starts N-1 workers. Jobs are handed over without allocation: workers spin briefly on a
// generation counter and then sleep on it, which keeps per-job latency in the microseconds for the
// hundreds of small parallel regions of one decode step.
#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <exception>
#include <memory>
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

  // Hands out [0, n) in runs of whole chunks of `chunk` (the last chunk may be shorter), calling
  // fn(begin, end) for each run. Every thread works through its own contiguous share front to
  // back, so its reads stay one sequential stream that prefetches can run ahead of; a thread that
  // is done takes runs from the back of the others' shares, so a thread that is slowed down (a
  // busy host taking its core) does less instead of holding everyone up at the end. Each run is
  // three quarters of what is left of the share it comes from (at least one chunk): runs start
  // long (few calls) and shrink to single chunks, so the threads finish within about a chunk of
  // each other. (A quarter, before: E4B q4 decode with the two alternated every 16 tokens in one
  // process read 1.7-4.3% less of the probe (6 runs, 4 A/Bs), q8 1.7% less; seven eighths read
  // less than either. The matvec kernels read a call's rows as a few streams, and a call's tail
  // that fits no stream runs alone: fewer, longer calls read better.)
  template <typename F>
  void parallel_chunks(int64_t n, int64_t chunk, F&& fn) {
    if (n <= 0) return;
    chunk = std::max<int64_t>(1, chunk);
    if ((n + chunk - 1) / chunk > INT32_MAX) chunk = (n + INT32_MAX - 1) / INT32_MAX;  // indices fit ChunkShare
    const int64_t chunks = (n + chunk - 1) / chunk;
    const int shares_count = n_threads_;
    ChunkShare stack_shares[kStackShares];
    std::unique_ptr<ChunkShare[]> heap_shares;
    ChunkShare* shares = stack_shares;
    if (shares_count > kStackShares) {
      heap_shares.reset(new ChunkShare[size_t(shares_count)]);
      shares = heap_shares.get();
    }
    for (int u = 0; u < shares_count; ++u) {
      auto [first, end] = split_range(chunks, u, shares_count, 1);
      shares[u].reset(first, end);
    }
    auto call = [&](ChunkShare::Run r) { fn(r.first * chunk, std::min(n, r.end * chunk)); };
    // Run inline (from inside a job) only thread 0 exists; it drains every share.
    run([&](int t, int) {
      for (ChunkShare::Run r; (r = shares[t].take_front()).first >= 0;) call(r);
      for (int k = 1; k < shares_count; ++k)
        for (ChunkShare::Run r; (r = shares[(t + k) % shares_count].take_back()).first >= 0;) call(r);
    });
  }

  static std::pair<int64_t, int64_t> split_range(int64_t n, int t, int nt, int64_t grain);
  static int default_threads();  // the CPUs this process may run on (usable_cpus)

 private:
  // The chunks [front, back) of one thread's share, packed in one word so that the owner (taking
  // from the front) and the others (taking from the back) never both get the same chunk.
  struct alignas(64) ChunkShare {
    struct Run {
      int64_t first = -1, end = -1;  // first < 0: the share is empty
    };
    std::atomic<uint64_t> range{0};
    void reset(int64_t front, int64_t back) { range.store(pack(front, back), std::memory_order_relaxed); }
    Run take_front() { return take(true); }
    Run take_back() { return take(false); }

   private:
    static uint64_t pack(int64_t front, int64_t back) { return uint64_t(front) << 32 | uint64_t(back); }
    Run take(bool from_front) {
      uint64_t old = range.load(std::memory_order_relaxed);
      for (;;) {
        const int64_t front = int64_t(old >> 32), back = int64_t(old & 0xffffffffu);
        if (front >= back) return {};
        const int64_t count = std::max<int64_t>(1, (back - front) * 3 / 4);
        const uint64_t next = from_front ? pack(front + count, back) : pack(front, back - count);
        if (range.compare_exchange_weak(old, next, std::memory_order_relaxed))
          return from_front ? Run{front, front + count} : Run{back - count, back};
      }
    }
  };
  static constexpr int kStackShares = 64;  // 4 KB of stack; more threads than this allocate per call

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
