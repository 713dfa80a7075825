#pragma once
// Measures how fast this machine streams memory into the cores, so that benchmarks can report
// decode speed as a fraction of the DRAM roofline measured in the same run.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <span>
#include <vector>

#include "core/byte_range.h"
#include "core/huge_pages.h"
#include "core/thread_pool.h"

namespace tandem {

// A buffer far larger than the caches, on 2 MB pages where the kernel allows, written once (each
// pool thread first touches its own part, so pages land on its memory node and page faults are
// never timed), that can be read again and again: a benchmark on a shared host probes between its timed sections, so that each section is
// compared with the bandwidth the machine offered around it.
class ReadBandwidthProbe {
 public:
  ReadBandwidthProbe(ThreadPool& pool, size_t bytes);
  // Best of `passes` timed rounds, every pool thread streaming its own contiguous part with SIMD
  // loads, each round reading it once plainly and once with each of a few software prefetch
  // distances (memory_bandwidth.cpp). Returns 1e9 bytes per second.
  double measure(int passes);
  // Bytes it keeps resident (rounded to whole pages per thread).
  size_t bytes() const { return bytes_; }

 private:
  ThreadPool& pool_;
  size_t chunk_ = 0, bytes_ = 0;
  std::unique_ptr<uint8_t, HugePageFree> buffer_;
};

// Reads [p, p + bytes) the way the probe does (4 equal parts side by side, one cache line of each
// per step, SIMD loads; with prefetch_ahead > 0 each line also prefetched into L1 that many bytes
// ahead in its part) and returns a sum of the data, so that the loads are kept.
uint64_t read_in_parts(const uint8_t* p, size_t bytes, size_t prefetch_ahead = 0);

// The same memory with overlapping and adjacent ranges joined, in address order.
std::vector<ByteRange> merge_ranges(std::vector<ByteRange> ranges);

// What read_share hands a thread: whole 64-byte lines in blocks of this many bytes.
constexpr size_t kReadBlock = 256;

// Thread t's share (of nt equal shares) of `merged` laid end to end, as the aligned pieces it
// reads: whole lines from each piece's first line boundary, in whole blocks of kReadBlock. Each
// range loses less than 64 + kReadBlock bytes at either end and at every share boundary.
std::vector<ByteRange> read_share(std::span<const ByteRange> merged, int t, int nt);

// Best of `passes` rounds of reads of `merged` (from merge_ranges: overlaps would be read twice),
// every pool thread reading its read_share as the probe reads its buffer, in each of its ways.
// Returns 1e9 bytes per second of the bytes read. Read bandwidth depends on where in physical
// memory the bytes lie (a dev VM read 512 MB buffers at 55 to 80 GB/s, each buffer at its own
// speed), so the speed of reading the very bytes a kernel streams is the ceiling that kernel is
// held to (docs/benchmarks.md, "Where the bytes lie").
double measure_read_bandwidth_of(ThreadPool& pool, std::span<const ByteRange> merged, int passes);

// One probe with a buffer of its own, freed on return.
double measure_read_bandwidth_gb_s(ThreadPool& pool, size_t bytes = size_t(1) << 30, int passes = 3);

}  // namespace tandem
