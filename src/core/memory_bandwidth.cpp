#include "core/memory_bandwidth.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#include "core/cpu_features.h"
#include "core/huge_pages.h"

namespace tandem {

namespace {

// A core reads DRAM fastest with several streams in flight (one stream leaves the line-fill
// buffers partly idle), as the matmul kernels read several weight rows at once; so each thread
// reads 4 equal parts of its share side by side, one cache line of each per step (measured on Zen 5:
// 1 stream 25 GB/s, 2-4 streams 28, 8 streams 22). The sum is
// returned so that the loads cannot be optimized away.
constexpr int kStreams = 4;
static_assert(kReadBlock == 64 * kStreams, "read_share hands out whole lines of each of read_in_parts' parts");

// Where the hardware prefetchers alone leave DRAM idle, software prefetches into L1 a little ahead
// of each part read more: on an Intel Xeon with AMX (session 42) the plain read measured 30-33
// GB/s and the same read with every line prefetched 2 KB ahead 35-37 (1 KB 33-34, 4 KB 33-34),
// and the decode kernels prefetching so read faster than the plain probe. A probe that reads
// slower than the kernels it judges would flatter them, so it reads both ways and keeps the best.
constexpr size_t kProbeAheads[] = {0, 1024, 2048, 4096};

template <bool Prefetch>
__attribute__((target("avx2"))) uint64_t read_avx2(const uint8_t* p, size_t bytes, size_t ahead) {
  const size_t part = bytes / kStreams / 64 * 64;
  __m256i acc[kStreams];
  for (auto& a : acc) a = _mm256_setzero_si256();
  for (size_t i = 0; i < part; i += 64)
    for (int j = 0; j < kStreams; ++j) {
      const uint8_t* q = p + size_t(j) * part + i;
      if constexpr (Prefetch) _mm_prefetch(reinterpret_cast<const char*>(q + ahead), _MM_HINT_T0);
      acc[j] = _mm256_add_epi64(acc[j], _mm256_add_epi64(_mm256_load_si256((const __m256i*)q),
                                                         _mm256_load_si256((const __m256i*)(q + 32))));
    }
  for (int j = 1; j < kStreams; ++j) acc[0] = _mm256_add_epi64(acc[0], acc[j]);
  return uint64_t(_mm256_extract_epi64(acc[0], 0));
}

template <bool Prefetch>
uint64_t read_sse2(const uint8_t* p, size_t bytes, size_t ahead) {
  const size_t part = bytes / kStreams / 64 * 64;
  __m128i acc[kStreams];
  for (auto& a : acc) a = _mm_setzero_si128();
  for (size_t i = 0; i < part; i += 64)
    for (int j = 0; j < kStreams; ++j) {
      const uint8_t* q = p + size_t(j) * part + i;
      if constexpr (Prefetch) _mm_prefetch(reinterpret_cast<const char*>(q + ahead), _MM_HINT_T0);
      const __m128i a = _mm_add_epi64(_mm_load_si128((const __m128i*)q), _mm_load_si128((const __m128i*)(q + 16)));
      const __m128i b =
          _mm_add_epi64(_mm_load_si128((const __m128i*)(q + 32)), _mm_load_si128((const __m128i*)(q + 48)));
      acc[j] = _mm_add_epi64(acc[j], _mm_add_epi64(a, b));
    }
  for (int j = 1; j < kStreams; ++j) acc[0] = _mm_add_epi64(acc[0], acc[j]);
  return uint64_t(_mm_cvtsi128_si64(acc[0]));
}

// The best rate of `passes` rounds of read_all(ahead) over `bytes`, one read per kProbeAheads
// distance each round.
template <typename ReadAll>
double best_read_rate(int passes, size_t bytes, ReadAll read_all) {
  double best = 0;
  for (int pass = 0; pass < std::max(1, passes); ++pass)
    for (const size_t ahead : kProbeAheads) {
      const auto start = std::chrono::steady_clock::now();
      read_all(ahead);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      best = std::max(best, double(bytes) / seconds / 1e9);
    }
  return best;
}

}  // namespace

ReadBandwidthProbe::ReadBandwidthProbe(ThreadPool& pool, size_t bytes) : pool_(pool) {
  const int nt = pool.size();
  chunk_ = std::max<size_t>(4096, bytes / size_t(nt) / 4096 * 4096);
  bytes_ = chunk_ * size_t(nt);
  // On 2 MB pages, as the resident weights are: on 4 KB pages the same read runs 3-15% slower on
  // the dev VM, and the roofline would then credit the kernels with the page size's advantage.
  buffer_.reset(static_cast<uint8_t*>(huge_page_alloc(bytes_)));
  uint8_t* base = buffer_.get();
  pool.run([&](int t, int) {
    uint64_t* q = reinterpret_cast<uint64_t*>(base + size_t(t) * chunk_);
    uint64_t state = 0x9e3779b97f4a7c15ull * uint64_t(t + 1);
    for (size_t i = 0; i < chunk_ / 8; ++i) {
      state ^= state << 13, state ^= state >> 7, state ^= state << 17;
      q[i] = state;
    }
  });
}

uint64_t read_in_parts(const uint8_t* p, size_t bytes, size_t prefetch_ahead) {
  static const bool avx2 = cpu_features().avx2;
  // The prefetches may reach past the part: a prefetch never faults.
  if (prefetch_ahead == 0) return avx2 ? read_avx2<false>(p, bytes, 0) : read_sse2<false>(p, bytes, 0);
  return avx2 ? read_avx2<true>(p, bytes, prefetch_ahead) : read_sse2<true>(p, bytes, prefetch_ahead);
}

double ReadBandwidthProbe::measure(int passes) {
  const uint8_t* base = buffer_.get();
  std::atomic<uint64_t> sink{0};  // keeps the loads
  return best_read_rate(passes, bytes_, [&](size_t ahead) {
    pool_.run([&](int t, int) {
      const uint8_t* p = base + size_t(t) * chunk_;
      sink.fetch_add(read_in_parts(p, chunk_, ahead), std::memory_order_relaxed);
    });
  });
}

std::vector<ByteRange> merge_ranges(std::vector<ByteRange> ranges) {
  // As addresses: the ranges lie in unrelated objects, which pointers may not be ordered across.
  const auto at = [](const uint8_t* p) { return reinterpret_cast<uintptr_t>(p); };
  std::erase_if(ranges, [](const ByteRange& r) { return r.data == nullptr || r.bytes == 0; });
  std::sort(ranges.begin(), ranges.end(), [&](const ByteRange& a, const ByteRange& b) { return at(a.data) < at(b.data); });
  std::vector<ByteRange> merged;
  for (const ByteRange& r : ranges) {
    if (!merged.empty() && at(r.data) <= at(merged.back().data) + merged.back().bytes) {
      ByteRange& last = merged.back();
      last.bytes = std::max(last.bytes, size_t(at(r.data) + r.bytes - at(last.data)));
    } else {
      merged.push_back(r);
    }
  }
  return merged;
}

std::vector<ByteRange> read_share(std::span<const ByteRange> merged, int t, int nt) {
  size_t total = 0;
  for (const ByteRange& r : merged) total += r.bytes;
  const size_t share_begin = total * size_t(t) / size_t(nt), share_end = total * size_t(t + 1) / size_t(nt);
  std::vector<ByteRange> pieces;
  size_t offset = 0;  // of the current range, with the ranges laid end to end
  for (const ByteRange& r : merged) {
    const size_t lo = std::max(share_begin, offset), hi = std::min(share_end, offset + r.bytes);
    const uintptr_t first = reinterpret_cast<uintptr_t>(r.data) + (lo - offset);
    offset += r.bytes;
    if (lo >= hi) continue;
    const uintptr_t aligned = (first + 63) / 64 * 64, end = first + (hi - lo);
    if (end <= aligned) continue;
    const size_t bytes = (end - aligned) / kReadBlock * kReadBlock;
    if (bytes > 0) pieces.push_back({reinterpret_cast<const uint8_t*>(aligned), bytes});
  }
  return pieces;
}

double measure_read_bandwidth_of(ThreadPool& pool, std::span<const ByteRange> merged, int passes) {
  const int nt = pool.size();
  std::vector<std::vector<ByteRange>> shares;
  size_t bytes = 0;
  for (int t = 0; t < nt; ++t) {
    shares.push_back(read_share(merged, t, nt));
    for (const ByteRange& piece : shares.back()) bytes += piece.bytes;
  }
  if (bytes == 0) return 0;
  std::atomic<uint64_t> sink{0};  // keeps the loads
  return best_read_rate(passes, bytes, [&](size_t ahead) {
    pool.run([&](int t, int) {
      uint64_t sum = 0;
      for (const ByteRange& piece : shares[size_t(t)]) sum += read_in_parts(piece.data, piece.bytes, ahead);
      sink.fetch_add(sum, std::memory_order_relaxed);
    });
  });
}

double measure_read_bandwidth_gb_s(ThreadPool& pool, size_t bytes, int passes) {
  return ReadBandwidthProbe(pool, bytes).measure(passes);
}

}  // namespace tandem
