// Attention benchmarks over a paged KV cache with the full-attention shapes of E4B (head size 512,
// 2 KV heads, 4 query heads per KV head) and E2B (one KV head for 8 query heads: "E2B/" cases), in
// blocks of 16 keys, with the active ISA and one thread per core:
//   Decode/<kv dtype>/<context>    one query row at the last position of a context: GB/s of keys and
//                                  values read, and "roofline" = that divided by the higher read
//                                  bandwidth probed just before and after it (decode at long contexts
//                                  streams the cache as it streams weights; at 256 keys the cache
//                                  sits in L2, so that case shows the kernel's own pace)
//   Cold/<kv dtype>/640            decode at E4B's bench context (a 512-token prompt plus 128), each
//                                  call on one of enough copies of the cache for 1.5 GB, so that it
//                                  streams from DRAM as a model step does after the weights evicted it
//                                  (128 copies, 335 MB in bf16, stayed in an Intel Xeon's 480 MB L3;
//                                  now, as in E4B q4 decode at 576 positions, ~100 us a call in bf16)
//   Sliding/Cold/<kv dtype>/640    the same for E4B's sliding layers (head size 256, the last 512
//                                  keys; in E4B q4 decode ~54 us a call in bf16)
//   Batch8/<kv dtype>/<context>    8 sequences of that context, one row each: GB/s
//   Prefill/<kv dtype>/<context>   the last 512 rows of a prompt of that context at once: GFLOP/s
//                                  (2 flops per query element and key for the scores, 2 for the values)
// Run: build/bench/attention_bench [--benchmark_filter=Decode] ; TANDEM_ISA=avx2 to compare paths,
// TANDEM_BENCH_THREADS=1 for one core.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench_common.h"
#include "core/dtype.h"
#include "core/huge_pages.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/kernels.h"

namespace {

using namespace tandem;
using bench::bench_threads;
using bench::pool;
using bench::read_bandwidth;
using bench::RooflineReporter;

constexpr int kBlockSize = 16, kPrefillRows = 512;

struct Shape {
  const char* prefix;
  int kv_heads, group;
  int head_dim = 512;
  int window = 0;  // sliding-window layers: the last `window` keys
};
constexpr Shape kE4B{"", 2, 4}, kE2B{"E2B/", 1, 8}, kE4BSliding{"Sliding/", 2, 4, 256, 512};

// The caches of `sequences` sequences of `context` positions each, in blocks handed out in order
// (as a fresh cache hands them to a prompt) and laid out as KvCache lays out its pools, filled
// with a repeating pattern of valid values.
struct BenchCache {
  KvLayerView kv;
  std::unique_ptr<uint8_t, HugePageFree> memory;
  std::vector<std::vector<int32_t>> tables;

  BenchCache(const Shape& shape, KvDType dtype, int sequences, int context) {
    kv.dtype = dtype;
    kv.block_size = kBlockSize;
    kv.head_dim = shape.head_dim;
    kv.kv_heads = shape.kv_heads;
    const int64_t blocks_per_seq = (context + kBlockSize - 1) / kBlockSize;
    kv.block_stride = int64_t(kBlockSize) * shape.head_dim;  // head-major, as KvCache lays out its pools
    kv.head_stride = kv.block_stride * blocks_per_seq * sequences;
    const size_t elems = size_t(kBlockSize) * shape.head_dim * shape.kv_heads * blocks_per_seq * sequences;
    const size_t bytes = elems * kv_dtype_size(dtype);
    memory.reset(static_cast<uint8_t*>(huge_page_alloc(2 * bytes)));
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 0.5f);
    std::vector<float> pattern(4096);
    for (float& v : pattern) v = normal(rng);
    if (dtype == KvDType::F32) {
      float* p = reinterpret_cast<float*>(memory.get());
      for (size_t i = 0; i < 2 * elems; ++i) p[i] = pattern[i % pattern.size()];
    } else {
      uint16_t* p = reinterpret_cast<uint16_t*>(memory.get());
      for (size_t i = 0; i < 2 * elems; ++i) p[i] = f32_to_bf16(pattern[i % pattern.size()]);
    }
    kv.keys = memory.get();
    kv.values = memory.get() + bytes;
    for (int s = 0; s < sequences; ++s) {
      tables.emplace_back();
      for (int64_t b = 0; b < blocks_per_seq; ++b) tables.back().push_back(int32_t(s * blocks_per_seq + b));
    }
  }
};

// `sequences` sequences of `context` positions, each with its last `rows` rows as queries.
void run_attention(benchmark::State& state, const Shape& shape, KvDType dtype, int sequences, int context, int rows,
                   int copies = 1) {
  double bandwidth = rows == 1 ? read_bandwidth() : 0.0;
  if (copies > 1) {  // enough copies for ~1.5 GB: more than any L3 (a 480 MB one held 128 of E4B's sliding caches)
    const double copy_bytes = 2.0 * context * shape.kv_heads * shape.head_dim * double(kv_dtype_size(dtype)) * sequences;
    copies = std::max(copies, int(1.5e9 / copy_bytes) + 1);
  }
  const BenchCache cache(shape, dtype, sequences * copies, context);
  const int q_heads = shape.kv_heads * shape.group;
  std::vector<float> q(size_t(sequences) * rows * q_heads * shape.head_dim), out(q.size());
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  for (float& v : q) v = normal(rng);
  std::vector<int32_t> positions;
  for (int r = 0; r < rows; ++r) positions.push_back(context - rows + r);
  std::vector<KvSequence> seqs;
  for (int s = 0; s < sequences * copies; ++s) {
    KvSequence ks;
    ks.first_row = (s % sequences) * rows;
    ks.rows = rows;
    ks.positions = positions.data();
    ks.blocks = cache.tables[size_t(s)].data();
    seqs.push_back(ks);
  }
  AttentionBatch b;
  b.q = q.data();
  b.q_stride = int64_t(q_heads) * shape.head_dim;
  b.out = out.data();
  b.out_stride = b.q_stride;
  b.q_heads = q_heads;
  b.group = shape.group;
  b.window = shape.window;
  b.kv = cache.kv;
  const cpu::KernelTable& k = cpu::active_kernels();
  std::vector<float> scratch;
  int copy = 0;
  for (auto _ : state) {
    b.sequences = std::span<const KvSequence>(seqs.data() + size_t(sequences) * copy, size_t(sequences));
    copy = (copy + 1) % copies;
    cpu::paged_attention(pool(), k, b, scratch);
    benchmark::DoNotOptimize(out.data());
  }
  if (rows == 1) bandwidth = std::max(bandwidth, read_bandwidth());
  const double iters = double(state.iterations());
  const int keys_read = shape.window > 0 ? std::min(context, shape.window) : context;
  const double cache_bytes =
      2.0 * double(keys_read) * shape.kv_heads * shape.head_dim * double(kv_dtype_size(dtype)) * sequences;
  state.counters["GB/s"] = benchmark::Counter(cache_bytes * iters / 1e9, benchmark::Counter::kIsRate);
  // Row r sees context - rows + r + 1 keys, at most the window.
  double keys_seen = 0;
  for (int r = 0; r < rows; ++r) {
    const int keys = context - rows + r + 1;
    keys_seen += shape.window > 0 ? std::min(keys, shape.window) : keys;
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(4.0 * shape.head_dim * q_heads * keys_seen * sequences * iters / 1e9, benchmark::Counter::kIsRate);
  if (rows == 1) state.counters["read_GB/s"] = bandwidth;
  state.SetLabel(std::string(kv_dtype_name(dtype)) + " " + std::string(isa_name(k.isa)));
}

void register_case(const Shape& shape, const std::string& name, KvDType dtype, int sequences, int context,
                   int rows, int copies = 1) {
  auto* bench = benchmark::RegisterBenchmark((shape.prefix + name).c_str(), [=](benchmark::State& st) {
    run_attention(st, shape, dtype, sequences, context, rows, copies);
  });
  bench->Unit(benchmark::kMicrosecond)->MinTime(0.5);
  if (bench_threads() > 1) bench->UseRealTime();
}

}  // namespace

int main(int argc, char** argv) {
  for (KvDType dtype : {KvDType::F32, KvDType::BF16}) {
    const std::string d(kv_dtype_name(dtype));
    for (int context : {256, 4096, 32768, 131072})
      register_case(kE4B, "Decode/" + d + "/" + std::to_string(context), dtype, 1, context, 1);
    register_case(kE4B, "Cold/" + d + "/640", dtype, 1, 640, 1, 128);
    register_case(kE4BSliding, "Cold/" + d + "/640", dtype, 1, 640, 1, 128);
    register_case(kE4B, "Batch8/" + d + "/8192", dtype, 8, 8192, 1);
    for (int context : {4096, 32768})
      register_case(kE4B, "Prefill/" + d + "/" + std::to_string(context), dtype, 1, context, kPrefillRows);
    for (int context : {256, 32768}) register_case(kE2B, "Decode/" + d + "/" + std::to_string(context), dtype, 1, context, 1);
  }
  benchmark::Initialize(&argc, argv);
  RooflineReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
