// How fast plain reads of a buffer the size of a decode step's weights run, next to the probe that
// `tandem bench` divides decode speed by. The probe re-reads 512 MB (best of 3 rounds, each read
// plainly and with prefetches, ~15 ms a read); a decode step streams 2.6-9.3 GB of weights once,
// a matrix at a time. This program reads a buffer that size in several patterns, with no
// arithmetic, so the decode roofline can be read against what a plain read loop achieves in the
// decode's place (docs/benchmarks.md, "Plain reads of a decode step's size").
//
//   read_patterns [--gb 3] [--rounds 40] [--threads N]
//
// Each round prints the probe and these one-pass reads of a separate buffer of --gb GB (every
// thread reading as the probe does: 4 parts side by side):
//   halves      each thread one contiguous half (the probe's split, over the large buffer);
//   windows16M  16 MB windows in order, each split between the threads;
//   blocks1M    the threads take alternate 1 MB blocks (each thread's blocks in order), as two
//               threads sharing a matrix's rows do;
//   blocks64K   the same with 64 KB blocks;
//   matrices    E4B q4 layers' matrices in decode order, one pool pass (and barrier) per matrix,
//               each thread reading its half of the matrix;
//   unsynced    the same reads in one pool pass (no barrier between matrices).
//   stream1     `matrices` with each thread's half read as one sequential stream, as a one-token
//               tile of the row groups reads it (kernels/weight.h), instead of 4 parts side by side;
//   stream1pf   the same with every line prefetched into L1 8 KB ahead, as the VNNI one-token
//               tiles do on Zen 5 (kernels/cpu/prefetch_tuning.h);
//   streams2x1K 2 parts side by side, 1 KB of each in turn (a Q4 row group's chunk is 1.1 KB);
//   streams4x1K the same with 4 parts.
// and ends with the mean ratio of each to the probe over all rounds and over the rounds whose
// probe was above and below the median probe.
#include <fmt/core.h>

#include <immintrin.h>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "core/huge_pages.h"
#include "core/memory_bandwidth.h"
#include "core/thread_pool.h"

namespace {

using tandem::ThreadPool;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Pattern {
  const char* name;
  // Reads [base, base + bytes) once with the pool; returns a sum of the data.
  uint64_t (*read)(ThreadPool& pool, const uint8_t* base, size_t bytes);
};

// One pool pass of read(t, nt) on every thread; the sum of what they return.
template <typename Read>
uint64_t on_every_thread(ThreadPool& pool, Read read) {
  std::vector<uint64_t> sums(size_t(pool.size()));
  pool.run([&](int t, int nt) { sums[size_t(t)] = read(t, nt); });
  uint64_t s = 0;
  for (uint64_t v : sums) s += v;
  return s;
}

uint64_t read_halves(ThreadPool& pool, const uint8_t* base, size_t bytes) {
  return on_every_thread(pool, [&](int t, int nt) {
    const size_t part = bytes / size_t(nt) / 4096 * 4096;
    return tandem::read_in_parts(base + size_t(t) * part, part);
  });
}

uint64_t read_windows(ThreadPool& pool, const uint8_t* base, size_t bytes, size_t window) {
  return on_every_thread(pool, [&](int t, int nt) {
    const size_t part = window / size_t(nt) / 4096 * 4096;
    uint64_t s = 0;
    for (size_t w = 0; w + window <= bytes; w += window) s += tandem::read_in_parts(base + w + size_t(t) * part, part);
    return s;
  });
}

uint64_t read_blocks(ThreadPool& pool, const uint8_t* base, size_t bytes, size_t block) {
  return on_every_thread(pool, [&](int t, int nt) {
    uint64_t s = 0;
    for (size_t b = size_t(t) * block; b + block <= bytes; b += size_t(nt) * block) s += tandem::read_in_parts(base + b, block);
    return s;
  });
}

// The bytes of one E4B decoder layer's matrices in Q4 (0.5625 bytes per weight), in the order
// a decode step reads them: q/k/v, o, gate/up, down, the PLE gate and projection.
constexpr size_t kLayerMatrixBytes[] = {3686400, 2949120, 29491200, 14745600, 368640, 368640};

// Calls visit(offset, bytes) for the matrices of consecutive layers that fit in `bytes`.
template <typename Visit>
void for_each_matrix(size_t bytes, Visit visit) {
  size_t at = 0;
  for (size_t m = 0;; m = (m + 1) % std::size(kLayerMatrixBytes)) {
    if (at + kLayerMatrixBytes[m] > bytes) return;
    visit(at, kLayerMatrixBytes[m]);
    at += kLayerMatrixBytes[m];
  }
}

// The buffer as a sequence of such matrices, one pool pass per matrix (each thread reading its
// half, as a decode matmul splits rows): the synchronisation and stream restarts of a decode
// step, without its arithmetic or the work between its matmuls.
uint64_t read_matrices(ThreadPool& pool, const uint8_t* base, size_t bytes) {
  uint64_t s = 0;
  for_each_matrix(bytes, [&](size_t at, size_t n) { s += read_halves(pool, base + at, n); });
  return s;
}

// The same reads in one pool pass: each thread walks its halves of all matrices without waiting
// for the other at each one. The difference to `matrices` is what the barriers cost.
uint64_t read_matrices_unsynchronised(ThreadPool& pool, const uint8_t* base, size_t bytes) {
  return on_every_thread(pool, [&](int t, int nt) {
    uint64_t s = 0;
    for_each_matrix(bytes, [&](size_t at, size_t n) {
      const size_t part = n / size_t(nt) / 4096 * 4096;
      s += tandem::read_in_parts(base + at + size_t(t) * part, part);
    });
    return s;
  });
}

// Reads [p, p + bytes) as S parts side by side, G bytes of each in turn, every line prefetched into
// L1 `Ahead` bytes before its load (0: no software prefetch).
template <int S, size_t G, size_t Ahead>
__attribute__((target("avx2"))) uint64_t read_streams(const uint8_t* p, size_t bytes) {
  const size_t part = bytes / S / G * G;
  __m256i acc[S];
  for (auto& a : acc) a = _mm256_setzero_si256();
  for (size_t i = 0; i < part; i += G)
    for (int j = 0; j < S; ++j) {
      const uint8_t* q = p + size_t(j) * part + i;
      for (size_t k = 0; k < G; k += 64) {
        if (Ahead) _mm_prefetch(reinterpret_cast<const char*>(q + k + Ahead), _MM_HINT_T0);
        acc[j] = _mm256_add_epi64(acc[j], _mm256_add_epi64(_mm256_load_si256((const __m256i*)(q + k)),
                                                           _mm256_load_si256((const __m256i*)(q + k + 32))));
      }
    }
  for (int j = 1; j < S; ++j) acc[0] = _mm256_add_epi64(acc[0], acc[j]);
  return uint64_t(_mm256_extract_epi64(acc[0], 0));
}

// `matrices` with each thread's half of a matrix read by read_streams<S, G, Ahead>.
template <int S, size_t G, size_t Ahead>
uint64_t read_matrices_in_streams(ThreadPool& pool, const uint8_t* base, size_t bytes) {
  uint64_t s = 0;
  for_each_matrix(bytes, [&](size_t at, size_t n) {
    s += on_every_thread(pool, [&](int t, int nt) {
      const size_t part = n / size_t(nt) / 4096 * 4096;
      return read_streams<S, G, Ahead>(base + at + size_t(t) * part, part);
    });
  });
  return s;
}

const Pattern kPatterns[] = {
    {"halves", read_halves},
    {"windows16M", [](ThreadPool& p, const uint8_t* b, size_t n) { return read_windows(p, b, n, size_t(16) << 20); }},
    {"blocks1M", [](ThreadPool& p, const uint8_t* b, size_t n) { return read_blocks(p, b, n, size_t(1) << 20); }},
    {"blocks64K", [](ThreadPool& p, const uint8_t* b, size_t n) { return read_blocks(p, b, n, size_t(64) << 10); }},
    {"matrices", read_matrices},
    {"unsynced", read_matrices_unsynchronised},
    {"stream1", read_matrices_in_streams<1, 64, 0>},
    {"stream1pf", read_matrices_in_streams<1, 64, 8192>},
    {"streams2x1K", read_matrices_in_streams<2, 1024, 0>},
    {"streams4x1K", read_matrices_in_streams<4, 1024, 0>},
};
constexpr size_t kPatternCount = std::size(kPatterns);

int usage(const char* message) {
  fmt::print(stderr, "read_patterns: {}\nusage: read_patterns [--gb GB] [--rounds N] [--threads N]\n", message);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  double gb = 3;
  int rounds = 40, threads = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) return usage(("missing value for " + arg).c_str());
    const char* value = argv[++i];
    if (arg == "--gb") gb = std::atof(value);
    else if (arg == "--rounds") rounds = std::atoi(value);
    else if (arg == "--threads") threads = std::atoi(value);
    else return usage(("unknown option " + arg).c_str());
  }
  if (!(gb >= 0.5 && gb <= 64) || rounds < 1) return usage("--gb must be in [0.5, 64] and --rounds positive");

  ThreadPool pool(threads > 0 ? threads : ThreadPool::default_threads());
  tandem::ReadBandwidthProbe probe(pool, size_t(512) << 20);
  const size_t bytes = size_t(gb * 1e9) / (size_t(64) << 20) * (size_t(64) << 20);
  std::unique_ptr<uint8_t, tandem::HugePageFree> buffer(static_cast<uint8_t*>(tandem::huge_page_alloc(bytes)));
  pool.run([&](int t, int nt) {  // each thread first touches the part it reads in `halves`
    const size_t part = bytes / size_t(nt);
    std::memset(buffer.get() + size_t(t) * part, t + 1, part);
  });

  fmt::print("{} threads, probe 512 MB (best of 3 rounds, plain and prefetched), patterns over {:.2f} GB; GB/s\nprobe", pool.size(), bytes / 1e9);
  for (const Pattern& p : kPatterns) fmt::print(" {}", p.name);
  fmt::print("\n");
  std::vector<double> probes;
  std::vector<std::vector<double>> rates(kPatternCount);
  volatile uint64_t sink = 0;
  for (int r = 0; r < rounds; ++r) {
    probes.push_back(probe.measure(3));
    fmt::print("{:.1f}", probes.back());
    for (size_t i = 0; i < kPatternCount; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      sink = sink + kPatterns[i].read(pool, buffer.get(), bytes);
      rates[i].push_back(double(bytes) / seconds_since(t0) / 1e9);
      fmt::print(" {:.1f}", rates[i].back());
    }
    fmt::print("\n");
  }

  std::vector<double> sorted = probes;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];
  auto mean_ratio = [&](size_t i, int side) {  // side: 0 all rounds, 1 probe above the median, -1 at or below
    double sum = 0;
    int n = 0;
    for (size_t r = 0; r < probes.size(); ++r) {
      if ((side > 0 && probes[r] <= median) || (side < 0 && probes[r] > median)) continue;
      sum += rates[i][r] / probes[r];
      ++n;
    }
    return n ? fmt::format("{:.3f}", sum / n) : std::string("-");
  };
  fmt::print("\nmean ratio to the probe (median probe {:.1f} GB/s)\n{:<12} {:>6} {:>13} {:>13}\n", median, "pattern",
             "all", "probe above", "probe at/below");
  for (size_t i = 0; i < kPatternCount; ++i)
    fmt::print("{:<12} {:>6} {:>13} {:>13}\n", kPatterns[i].name, mean_ratio(i, 0), mean_ratio(i, 1),
               mean_ratio(i, -1));
  return 0;
}
