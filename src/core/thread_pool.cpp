#include "core/thread_pool.h"

#include <algorithm>

#include "core/process_limits.h"

namespace tandem {

namespace {
thread_local bool t_inside_job = false;
constexpr int kSpinIterations = 20000;

inline void cpu_relax() { __builtin_ia32_pause(); }
}  // namespace

int ThreadPool::default_threads() { return usable_cpus(); }

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads > 0 ? n_threads : default_threads()) {
  workers_.reserve(size_t(n_threads_ - 1));
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  generation_.fetch_add(1);
  generation_.notify_all();
  for (auto& w : workers_) w.join();
}

std::pair<int64_t, int64_t> ThreadPool::split_range(int64_t n, int t, int nt, int64_t grain) {
  grain = std::max<int64_t>(1, grain);
  const int64_t units = (n + grain - 1) / grain;
  const int64_t base = units / nt, extra = units % nt;
  const int64_t first = t * base + std::min<int64_t>(t, extra);
  const int64_t count = base + (t < extra ? 1 : 0);
  return {std::min(n, first * grain), std::min(n, (first + count) * grain)};
}

void ThreadPool::execute(int index) {
  t_inside_job = true;
  try {
    trampoline_(job_, index, n_threads_);
  } catch (...) {
    std::lock_guard lock(error_mutex_);
    if (!error_) error_ = std::current_exception();
  }
  t_inside_job = false;
}

void ThreadPool::run_erased(void* fn, Trampoline trampoline) {
  if (n_threads_ == 1 || t_inside_job) {
    trampoline(fn, 0, 1);
    return;
  }
  std::lock_guard lock(run_mutex_);
  job_ = fn;
  trampoline_ = trampoline;
  error_ = nullptr;
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  execute(0);
  int spins = 0;
  while (pending_.load(std::memory_order_acquire) != 0) {
    if (++spins < kSpinIterations) {
      cpu_relax();
    } else {
      std::this_thread::yield();
    }
  }
  if (error_) std::rethrow_exception(error_);
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t g;
    int spins = 0;
    while ((g = generation_.load(std::memory_order_acquire)) == seen) {
      if (++spins < kSpinIterations) {
        cpu_relax();
      } else {
        generation_.wait(seen, std::memory_order_acquire);
      }
    }
    seen = g;
    if (stop_.load()) return;
    execute(index);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace tandem
