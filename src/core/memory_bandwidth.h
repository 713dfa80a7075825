#pragma once
// Measures how fast this machine streams memory into the cores, so that benchmarks can report
// decode speed as a fraction of the DRAM roofline measured in the same run.
#include <cstddef>

#include "core/thread_pool.h"

namespace tandem {

// Best of `passes` timed reads of a `bytes` buffer (far larger than the caches), every pool thread
// streaming its own contiguous part with SIMD loads. The buffer is written once before timing, so
// page faults are not measured. Returns 1e9 bytes per second.
double measure_read_bandwidth_gb_s(ThreadPool& pool, size_t bytes = size_t(1) << 30, int passes = 3);

}  // namespace tandem
