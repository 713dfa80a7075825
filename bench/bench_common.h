#pragma once
// What the Google Benchmark programs here share: one thread pool sized by TANDEM_BENCH_THREADS,
// the read bandwidth probed beside a benchmark, and a console reporter that adds
// roofline = GB/s / read_GB/s to every run that reports both counters.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "core/memory_bandwidth.h"
#include "core/thread_pool.h"

namespace tandem::bench {

// TANDEM_BENCH_THREADS=1 measures one core; its rates then use the thread's CPU time, which on a
// shared machine leaves out the time other processes held the core.
inline int bench_threads() {
  const char* env = std::getenv("TANDEM_BENCH_THREADS");
  return env ? std::max(1, std::atoi(env)) : ThreadPool::default_threads();
}

inline ThreadPool& pool() {
  static ThreadPool p(bench_threads());
  return p;
}

// The read bandwidth next to one benchmark: a shared host's drifts by 1.5x within seconds
// (docs/benchmarks.md), so each streaming benchmark is compared with probes taken right before
// and after it (the higher of the two: never flatter the roofline).
inline double read_bandwidth() {
  static ReadBandwidthProbe probe(pool(), size_t(512) << 20);
  return probe.measure(3);
}

class RooflineReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    std::vector<Run> copy = runs;
    for (Run& r : copy) {
      auto gb = r.counters.find("GB/s"), bw = r.counters.find("read_GB/s");
      if (gb != r.counters.end() && bw != r.counters.end() && bw->second.value > 0)
        r.counters["roofline"] = gb->second.value / bw->second.value;  // rates are final here
    }
    ConsoleReporter::ReportRuns(copy);
  }
};

}  // namespace tandem::bench
