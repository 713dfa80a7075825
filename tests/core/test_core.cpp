// Floor 1: dtype conversions, the thread pool, CPU feature detection.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>

#include <unistd.h>

#include "core/cpu_features.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/memory_bandwidth.h"
#include "core/thread_pool.h"
#include "core/process_limits.h"

namespace tandem {
namespace {

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties go to the even mantissa (1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8))), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-std::numeric_limits<float>::infinity())), -std::numeric_limits<float>::infinity());
}

TEST(DType, F16RoundTripsEveryValue) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const float f = f16_to_f32(uint16_t(bits));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16(f), uint16_t(bits)) << std::hex << bits;
  }
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(f32_to_f16(1e6f), 0x7c00);                    // overflow -> inf
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -26)), 0x0000);   // below half the smallest subnormal
}

// Every position of a buffer, every non-finite kind, each format: the scan finds the first one, with
// finite neighbours whose exponents are all ones but one bit (the largest finite values) and zeros.
TEST(DType, FirstNonFiniteFindsEveryInfAndNaN) {
  const float kinds[] = {INFINITY, -INFINITY, NAN, -NAN};
  for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    const size_t elem = dtype_size(dtype);
    auto encode = [&](float f) -> uint32_t {
      return dtype == DType::F32 ? std::bit_cast<uint32_t>(f) : dtype == DType::F16 ? f32_to_f16(f) : f32_to_bf16(f);
    };
    const float largest = dtype == DType::F32 ? 3.4e38f : dtype == DType::F16 ? 65504.0f : 3.38e38f;
    for (size_t n : {1, 3, 31, 32, 33, 100, 257}) {
      std::vector<uint8_t> buffer(n * elem);
      for (size_t i = 0; i < n; ++i) {
        const uint32_t v = encode(i % 3 == 0 ? largest : i % 3 == 1 ? -largest : 0.0f);
        std::memcpy(buffer.data() + i * elem, &v, elem);
      }
      EXPECT_EQ(first_non_finite(dtype, buffer.data(), buffer.size()), -1) << dtype_name(dtype) << " " << n;
      for (size_t at = 0; at < n; ++at)
        for (float kind : kinds) {
          std::vector<uint8_t> bad = buffer;
          const uint32_t v = encode(kind);
          std::memcpy(bad.data() + at * elem, &v, elem);
          if (at + 2 < n) std::memcpy(bad.data() + (at + 2) * elem, &v, elem);  // only the first counts
          ASSERT_EQ(first_non_finite(dtype, bad.data(), bad.size()), int64_t(at)) << dtype_name(dtype) << " " << n;
        }
    }
  }
}

TEST(DType, Names) {
  EXPECT_EQ(dtype_from_name("BF16"), DType::BF16);
  EXPECT_FALSE(dtype_from_name("bf16").has_value());
  EXPECT_EQ(dtype_size(DType::F32), 4u);
  EXPECT_EQ(dtype_name(DType::I8), "I8");
}

TEST(UsableCpus, CgroupQuotasGiveWholeCpus) {
  EXPECT_EQ(cpus_of_cpu_max("max 100000\n"), std::nullopt);
  EXPECT_EQ(cpus_of_cpu_max("200000 100000\n"), 2);
  EXPECT_EQ(cpus_of_cpu_max("150000 100000"), 1);  // 1.5 CPUs: a second spinning thread would be throttled
  EXPECT_EQ(cpus_of_cpu_max("50000 100000"), 1);
  EXPECT_EQ(cpus_of_cpu_max("800000 100000"), 8);
  EXPECT_EQ(cpus_of_cpu_max(""), std::nullopt);
  EXPECT_EQ(cpus_of_cpu_max("lots 100000"), std::nullopt);
  EXPECT_EQ(cpus_of_cfs_quota(-1, 100000), std::nullopt);
  EXPECT_EQ(cpus_of_cfs_quota(400000, 100000), 4);
  EXPECT_EQ(cpus_of_cfs_quota(20000, 100000), 1);
}

TEST(UsableMemory, CgroupLimitsInBytes) {
  EXPECT_EQ(bytes_of_memory_limit("max\n"), std::nullopt);  // v2: none
  EXPECT_EQ(bytes_of_memory_limit("8589934592\n"), 8589934592u);
  EXPECT_EQ(bytes_of_memory_limit("9223372036854771712\n"), std::nullopt);  // v1: none
  EXPECT_EQ(bytes_of_memory_limit("0"), std::nullopt);
  EXPECT_EQ(bytes_of_memory_limit("8G"), std::nullopt);
  const size_t bytes = usable_memory_bytes();
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  EXPECT_GT(bytes, 0u);
  EXPECT_LE(bytes, size_t(pages) * size_t(page));
}

TEST(UsableCpus, AtLeastOneAndNoMoreThanTheHostHas) {
  const int n = usable_cpus();
  EXPECT_GE(n, 1);
  EXPECT_LE(n, int(std::max(1u, std::thread::hardware_concurrency())));
  EXPECT_EQ(ThreadPool::default_threads(), n);
}

TEST(ThreadPool, ParallelForCoversEveryIndexOnce) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 7, 64, 1000, 4097}) {
      std::vector<std::atomic<int>> hits(size_t(n) + 1);
      pool.parallel_for(n, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
      }, 16);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << threads << " " << n << " " << i;
    }
  }
}

TEST(ThreadPool, ParallelChunksCoverEveryIndexOnceInRunsOfWholeChunks) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 15, 16, 17, 1000}) {
      std::vector<std::atomic<int>> hits(size_t(n) + 1);
      std::atomic<int> odd_chunks{0};
      pool.parallel_chunks(n, 16, [&](int64_t b, int64_t e) {
        if (b % 16 != 0 || ((e - b) % 16 != 0 && e != n)) odd_chunks++;
        for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
      });
      EXPECT_EQ(odd_chunks.load(), 0);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << threads << " " << n << " " << i;
    }
  }
}

TEST(ThreadPool, ParallelChunksGoToTheThreadThatIsFree) {
  ThreadPool pool(2);
  std::mutex m;
  std::map<std::thread::id, int> chunks_by_thread;
  std::thread::id slow;
  pool.parallel_chunks(20, 1, [&](int64_t b, int64_t) {
    {
      std::lock_guard lock(m);
      chunks_by_thread[std::this_thread::get_id()]++;
      if (b == 0) slow = std::this_thread::get_id();
    }
    // The thread holding the first chunk stalls (as a core taken by the host would) while the
    // other one works through the rest.
    if (b == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  });
  ASSERT_EQ(chunks_by_thread.size(), 2u);
  EXPECT_EQ(chunks_by_thread[slow], 1);
}

TEST(ThreadPool, ParallelChunksWalkOwnShareForwardAndStealFromTheBack) {
  // Each thread reads its own rows as one forward stream; a thread that is done takes the last
  // chunks of the others, so the streams meet in the middle. Runs are three quarters of what is
  // left of a share (at least one chunk).
  ThreadPool pool(2);
  std::mutex m;
  std::map<std::thread::id, std::vector<std::pair<int64_t, int64_t>>> order;
  pool.parallel_chunks(40, 1, [&](int64_t b, int64_t e) {
    {
      std::lock_guard lock(m);
      order[std::this_thread::get_id()].push_back({b, e});
    }
    if (b == 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  });
  ASSERT_EQ(order.size(), 2u);
  std::vector<std::pair<int64_t, int64_t>> slow, fast;
  for (auto& [id, seq] : order) (seq.front().first == 0 ? slow : fast) = seq;
  using Runs = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(slow, Runs({{0, 15}}));  // three quarters of its share [0, 20), then it sleeps
  EXPECT_EQ(fast, Runs({{20, 35}, {35, 38}, {38, 39}, {39, 40},  // own share
                        {17, 20}, {16, 17}, {15, 16}}));       // the other's, from the back
}

TEST(ThreadPool, ParallelChunksEndOnSingleChunks) {
  // Runs shrink as a share empties: each thread's share starts with a long run and ends with a
  // single chunk, and together the runs cover the range once. Which thread takes which run depends
  // on scheduling (under load one thread may stall mid-run while the other steals its share), so
  // nothing here is asserted per thread or in time order.
  ThreadPool pool(2);
  std::mutex m;
  std::vector<std::pair<int64_t, int64_t>> runs;
  pool.parallel_chunks(1000 * 16, 16, [&](int64_t b, int64_t e) {
    std::lock_guard lock(m);
    runs.emplace_back(b, e);
  });
  int64_t longest = 0, single_chunks = 0;
  for (const auto& [b, e] : runs) {
    longest = std::max(longest, e - b);
    single_chunks += e - b == 16;
  }
  EXPECT_GT(longest, 16 * 50);
  EXPECT_GE(single_chunks, 2);  // the last run of each of the two shares
  std::sort(runs.begin(), runs.end());
  int64_t next = 0;
  for (const auto& [b, e] : runs) {
    EXPECT_EQ(b, next);
    next = e;
  }
  EXPECT_EQ(next, 1000 * 16);
}

TEST(ThreadPool, SplitRangeRespectsGrain) {
  auto [b0, e0] = ThreadPool::split_range(100, 0, 2, 32);
  auto [b1, e1] = ThreadPool::split_range(100, 1, 2, 32);
  EXPECT_EQ(b0, 0);
  EXPECT_EQ(e0 % 32, 0);
  EXPECT_EQ(b1, e0);
  EXPECT_EQ(e1, 100);
}

TEST(ThreadPool, RunsManyJobsAndPropagatesErrors) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  for (int job = 0; job < 2000; ++job)
    pool.run([&](int t, int n) { total += t + 1; });
  EXPECT_EQ(total.load(), 2000 * 3);
  EXPECT_THROW(pool.run([](int t, int) { if (t == 1) throw Error("boom"); }), Error);
  pool.run([&](int, int) { total += 1; });  // still usable afterwards
  EXPECT_EQ(total.load(), 2000 * 3 + 2);
}

TEST(ThreadPool, NestedCallsRunInline) {
  ThreadPool pool(2);
  std::atomic<int> inner{0};
  pool.run([&](int, int) { pool.parallel_for(10, [&](int64_t b, int64_t e) { inner += int(e - b); }); });
  EXPECT_EQ(inner.load(), 20);
}

TEST(CpuFeatures, CapLowersButNeverRaisesTheIsa) {
  const Isa best = best_supported_isa();
  set_isa_cap(Isa::Scalar);
  EXPECT_EQ(active_isa(), Isa::Scalar);
  set_isa_cap(Isa::Avx512Amx);
  EXPECT_EQ(active_isa(), best);
  if (best != Isa::Scalar) {
    EXPECT_TRUE(cpu_features().avx2);
    EXPECT_TRUE(cpu_features().fma);
  }
}

// AVX-VNNI is a level of its own: a cap at it gives it only where the CPU has it (Zen 4 has
// AVX-512 without it), and plain AVX2 otherwise.
TEST(CpuFeatures, Avx2VnniOnlyWhereTheCpuHasIt) {
  const bool avx2 = isa_supported(Isa::Avx2);
  EXPECT_EQ(isa_supported(Isa::Avx2Vnni), avx2 && cpu_features().avx_vnni);
  set_isa_cap(Isa::Avx2Vnni);
  if (avx2) {
    EXPECT_EQ(active_isa(), cpu_features().avx_vnni ? Isa::Avx2Vnni : Isa::Avx2);
  }
  set_isa_cap(Isa::Avx2);
  if (avx2) {
    EXPECT_EQ(active_isa(), Isa::Avx2);
  }
  set_isa_cap(Isa::Avx512Amx);
  EXPECT_EQ(isa_name(Isa::Avx2Vnni), "avx2vnni");
}

// AMX is a level above AVX-512: a cap at it gives it only where the CPU has the tiles (and Linux
// grants their state), plain AVX-512 (or lower) otherwise.
TEST(CpuFeatures, AmxOnlyWhereTheCpuHasIt) {
  EXPECT_EQ(isa_supported(Isa::Avx512Amx), isa_supported(Isa::Avx512) && cpu_features().amx_bf16);
  set_isa_cap(Isa::Avx512Amx);
  if (isa_supported(Isa::Avx512)) {
    EXPECT_EQ(active_isa(), cpu_features().amx_bf16 ? Isa::Avx512Amx : Isa::Avx512);
  }
  set_isa_cap(Isa::Avx512);
  EXPECT_NE(active_isa(), Isa::Avx512Amx);
  set_isa_cap(Isa::Avx512Amx);
  EXPECT_EQ(isa_name(Isa::Avx512Amx), "avx512amx");
}

// The kernel tuning by CPU family reads cpuid; the kernel's /proc/cpuinfo decodes the same leaf.
TEST(CpuFeatures, VendorAndFamilyMatchProcCpuinfo) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  if (!cpuinfo) GTEST_SKIP() << "no /proc/cpuinfo";
  std::string line, vendor, flags;
  int family = -1;
  while (std::getline(cpuinfo, line) && (vendor.empty() || family < 0 || flags.empty())) {
    const auto value = [&] { return line.substr(line.find(':') + 2); };
    if (line.rfind("vendor_id", 0) == 0) vendor = value();
    if (line.rfind("cpu family", 0) == 0) family = std::stoi(value());
    if (line.rfind("flags", 0) == 0) flags = " " + value() + " ";
  }
  if (family < 0) GTEST_SKIP() << "/proc/cpuinfo names no cpu family";
  EXPECT_EQ(cpu_features().amd, vendor == "AuthenticAMD");
  EXPECT_EQ(cpu_features().family, family);
  // A flag the kernel lists is one the CPU has and the OS saves the registers of, as cpu_features
  // asks. Only that direction: kernels before 5.12 do not name avx_vnni, and boot options such as
  // clearcpuid hide flags that cpuid still reports.
  for (const auto& [flag, detected] : {std::pair{" avx512_vnni ", cpu_features().avx512_vnni},
                                       std::pair{" avx_vnni ", cpu_features().avx_vnni}})
    if (flags.find(flag) != std::string::npos) {
      EXPECT_TRUE(detected) << flag;
    }
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

TEST(ReadBandwidth, MergeRangesJoinsOverlappingAndAdjacentRangesInAddressOrder) {
  std::vector<uint8_t> m(1000);
  const uint8_t* p = m.data();
  const auto merged = merge_ranges({{p + 500, 100},  // joins [400, 500) end to end
                                    {p + 400, 100},
                                    {p + 10, 50},
                                    {p + 20, 10},  // inside [10, 60)
                                    {p + 700, 0},  // empty: dropped
                                    {nullptr, 64},
                                    {p + 580, 100},  // overlaps [500, 600)
                                    {p + 61, 9}});   // one byte past [10, 60): separate
  ASSERT_EQ(merged.size(), 3u);
  EXPECT_EQ(merged[0].data, p + 10);
  EXPECT_EQ(merged[0].bytes, 50u);
  EXPECT_EQ(merged[1].data, p + 61);
  EXPECT_EQ(merged[1].bytes, 9u);
  EXPECT_EQ(merged[2].data, p + 400);
  EXPECT_EQ(merged[2].bytes, 280u);
  EXPECT_TRUE(merge_ranges({}).empty());
}

// Unaligned ranges of odd sizes split into 1-3 shares: every piece is whole aligned lines in whole
// blocks inside one range, no two pieces overlap, and all but the edges of each range and share
// are read.
TEST(ReadBandwidth, SharesCoverTheRangesInAlignedDisjointPieces) {
  std::vector<uint8_t> m(size_t(1) << 20);
  const std::vector<ByteRange> ranges =
      merge_ranges({{m.data() + 3, 300000 + 17}, {m.data() + 400005, 500000}, {m.data() + 950001, 40}});
  size_t total = 0;
  for (const ByteRange& r : ranges) total += r.bytes;
  for (int nt : {1, 2, 3}) {
    std::vector<ByteRange> all;
    for (int t = 0; t < nt; ++t) {
      const std::vector<ByteRange> share = read_share(ranges, t, nt);
      all.insert(all.end(), share.begin(), share.end());
    }
    size_t read = 0;
    for (const ByteRange& p : all) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(p.data) % 64, 0u);
      EXPECT_EQ(p.bytes % kReadBlock, 0u);
      EXPECT_GT(p.bytes, 0u);
      EXPECT_TRUE(std::any_of(ranges.begin(), ranges.end(), [&](const ByteRange& r) {
        return p.data >= r.data && p.data + p.bytes <= r.data + r.bytes;
      }));
      read += p.bytes;
    }
    std::sort(all.begin(), all.end(), [](const ByteRange& a, const ByteRange& b) { return a.data < b.data; });
    for (size_t i = 1; i < all.size(); ++i) EXPECT_LE(all[i - 1].data + all[i - 1].bytes, all[i].data) << nt;
    // Each range and each share boundary costs less than a line and a block on either side.
    const size_t edges = 2 * (ranges.size() + size_t(nt) - 1);
    EXPECT_GE(read + edges * (64 + kReadBlock), total) << nt;
    EXPECT_LE(read, total);
  }
}

// The probe's prefetched reads (memory_bandwidth.cpp) read the same bytes as its plain read: the
// same sum for every distance, prefetches past the end included, and each part's last line counts.
TEST(ReadBandwidth, PrefetchedReadsSumTheSameBytes) {
  constexpr size_t kBytes = size_t(1) << 20;
  std::vector<uint64_t> words(kBytes / 8 + 8);
  const size_t skew = (64 - reinterpret_cast<uintptr_t>(words.data()) % 64) % 64 / 8;  // 64-byte aligned
  uint64_t* base = words.data() + skew;
  for (size_t i = 0; i < kBytes / 8; ++i) base[i] = i * 0x9e3779b97f4a7c15ull;
  const auto* p = reinterpret_cast<const uint8_t*>(base);
  const uint64_t plain = read_in_parts(p, kBytes);
  for (size_t ahead : {64, 1024, 2048, 4096}) EXPECT_EQ(read_in_parts(p, kBytes, ahead), plain) << ahead;
  base[kBytes / 8 - 8] += 1;  // the first word of the last line of the last part
  EXPECT_EQ(read_in_parts(p, kBytes, 2048), plain + 1);
  EXPECT_EQ(read_in_parts(p, kBytes), plain + 1);
}

TEST(ReadBandwidth, MeasuresAPositiveRateAndNothingToReadAsZero) {
  std::vector<uint8_t> m((size_t(8) << 20) + 333, 1);
  ThreadPool pool(2);
  const std::vector<ByteRange> ranges =
      merge_ranges({{m.data() + 3, (size_t(3) << 20) + 17}, {m.data() + (size_t(4) << 20) + 5, (size_t(4) << 20)}});
  const double gb_s = measure_read_bandwidth_of(pool, ranges, 2);
  EXPECT_GT(gb_s, 0.0);
  EXPECT_TRUE(std::isfinite(gb_s));
  EXPECT_EQ(measure_read_bandwidth_of(pool, {}, 2), 0.0);
  const ByteRange tiny[] = {{m.data() + 1, 100}};  // less than one aligned block
  EXPECT_EQ(measure_read_bandwidth_of(pool, tiny, 1), 0.0);
}

}  // namespace
}  // namespace tandem
