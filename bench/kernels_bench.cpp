// Kernel benchmarks on E4B-like shapes, with the active ISA and one thread per core:
//   Matvec/<format>/<rows>x<cols>   n = 1 (decode): GB/s of weights streamed, and "roofline" = that
//                                   divided by the higher read bandwidth probed just before and after it
//   Batch8/<format>/<rows>x<cols>   n = 8 (batched decode of 8 sequences): GFLOP/s and GB/s
//                                   (TANDEM_BENCH_BATCH=N: BatchN, N sequences)
//   Prefill/<format>/<rows>x<cols>  n = 512 tokens (TANDEM_BENCH_TOKENS=N for another count): GFLOP/s
//                                   (2 flops per weight and token)
// <format> q8i / q4i / bf16i / f16i: the interleaved row groups (Q8/Q4 with AVX-512 VNNI, BF16/F16
//                                   with AVX-512), as resident weights may load.
// TANDEM_BENCH_HOT=ROWS: one small matrix of ROWS rows, read from cache: the kernels' compute rate.
// Run: build-*/bench/kernels_bench [--benchmark_filter=Matvec] ; TANDEM_ISA=avx2 to compare paths,
// TANDEM_BENCH_THREADS=1 for one core.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "bench_common.h"
#include "core/dtype.h"
#include "core/huge_pages.h"
#include "kernels/cpu/kernels.h"

namespace {

using namespace tandem;
using bench::bench_threads;
using bench::pool;
using bench::read_bandwidth;
using bench::RooflineReporter;

// A weight matrix filled with a repeating block of valid random values (no NaN, no subnormals),
// on 2 MB pages like the resident weights of a model (and the bandwidth probe).
struct BenchMatrix {
  std::unique_ptr<uint8_t, HugePageFree> data;
  WeightMatrix w;

  BenchMatrix(WeightFormat format, int64_t rows, int64_t cols, WeightLayout layout) {
    w.format = format;
    w.rows = rows;
    w.cols = cols;
    w.row_stride = row_bytes(format, cols);
    const size_t bytes = size_t(rows * w.row_stride);
    // Quantized scales follow the codes in the same buffer, as the resident loader places them.
    const size_t scale_bytes = is_quantized(format) ? size_t(rows * (cols / kQuantBlock) * 2) : 0;
    data.reset(static_cast<uint8_t*>(huge_page_alloc(bytes + scale_bytes)));
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> value(-1.0f, 1.0f);
    std::vector<uint8_t> pattern(1 << 16);
    for (size_t i = 0; i < pattern.size(); i += 4) {
      const float v = value(rng);
      uint32_t u;
      std::memcpy(&u, &v, 4);
      if (format == WeightFormat::F16) u = uint32_t(f32_to_f16(v)) * 0x10001u;
      if (format == WeightFormat::BF16) u = uint32_t(f32_to_bf16(v)) * 0x10001u;
      if (format == WeightFormat::Q8 || format == WeightFormat::Q4) u = rng();
      std::memcpy(&pattern[i], &u, 4);
    }
    for (size_t off = 0; off < bytes; off += pattern.size())
      std::memcpy(data.get() + off, pattern.data(), std::min(pattern.size(), bytes - off));
    w.data = data.get();
    if (format == WeightFormat::Q8 || format == WeightFormat::Q4) {
      w.scale_stride = cols / kQuantBlock * 2;
      const size_t n = scale_bytes / 2;
      const uint16_t h = f32_to_f16(0.01f);
      for (size_t i = 0; i < n; ++i) std::memcpy(data.get() + bytes + 2 * i, &h, 2);
      w.scales = data.get() + bytes;
    }
    if (layout == WeightLayout::Interleaved) {
      const std::vector<uint8_t> plain(data.get(), data.get() + bytes + scale_bytes);
      interleave_row_groups(w, plain.data(), w.scales ? plain.data() + bytes : nullptr, data.get(), 0,
                            interleaved_group_count(w));
      w.layout = layout;
    }
  }
};

void run_matmul(benchmark::State& state, WeightFormat format, WeightLayout layout, int64_t rows, int64_t cols,
                int64_t n) {
  double bandwidth = n == 1 ? read_bandwidth() : 0.0;
  // Decode and batches (n <= 64) cycle through copies adding up to >= 512 MB, so that the weights come
  // from DRAM and not from a large L3, as they do in a real model.
  std::vector<std::unique_ptr<BenchMatrix>> copies;
  const int64_t hot_rows = std::getenv("TANDEM_BENCH_HOT") ? std::atoll(std::getenv("TANDEM_BENCH_HOT")) : 0;
  if (hot_rows) rows = hot_rows;
  do {
    copies.push_back(std::make_unique<BenchMatrix>(format, rows, cols, layout));
  } while (n <= 64 && !std::getenv("TANDEM_BENCH_HOT") && copies.size() * copies.front()->w.streamed_bytes() < (size_t(512) << 20));
  const BenchMatrix& m = *copies.front();
  std::vector<float> x(size_t(n * cols)), y(size_t(n * rows));
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  for (auto& v : x) v = value(rng);
  const cpu::KernelTable& k = cpu::active_kernels();
  size_t next = 0;
  for (auto _ : state) {
    cpu::matmul(pool(), k, copies[next]->w, x.data(), cols, n, y.data(), rows);
    next = (next + 1) % copies.size();
    benchmark::DoNotOptimize(y.data());
  }
  if (n == 1) bandwidth = std::max(bandwidth, read_bandwidth());  // the higher: never flatter the roofline
  const double iters = double(state.iterations());
  state.counters["GB/s"] = benchmark::Counter(double(m.w.streamed_bytes()) * iters / 1e9, benchmark::Counter::kIsRate);
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * double(rows) * double(cols) * double(n) * iters / 1e9, benchmark::Counter::kIsRate);
  if (n == 1) state.counters["read_GB/s"] = bandwidth;  // the reporter adds roofline = GB/s / read_GB/s
  state.SetLabel(std::string(weight_format_name(format)) + (layout == WeightLayout::Interleaved ? " interleaved " : " ") +
                 std::string(isa_name(k.isa)));
}

struct Shape {
  const char* name;
  int64_t rows, cols;
};

// E4B's MLP (gate/up, down) and LM head, then the small matrices whose per-call costs weigh: the
// sliding layers' q and o projections and the per-layer-input gate and projection.
constexpr Shape kShapes[] = {{"10240x2560", 10240, 2560}, {"2560x10240", 2560, 10240}, {"262144x2560", 262144, 2560},
                             {"2048x2560", 2048, 2560},   {"2560x2048", 2560, 2048},   {"256x2560", 256, 2560},
                             {"2560x256", 2560, 256}};
constexpr WeightFormat kFormats[] = {WeightFormat::F32, WeightFormat::F16, WeightFormat::BF16, WeightFormat::Q8,
                                     WeightFormat::Q4};

// Matvec, Batch8 and Prefill of one format, layout and shape.
void register_shape(WeightFormat f, WeightLayout layout, const Shape& s) {
  const std::string fmt = std::string(weight_format_name(f)) + (layout == WeightLayout::Interleaved ? "i" : "");
  const bool wall_clock = bench_threads() > 1;
  auto* matvec = benchmark::RegisterBenchmark(("Matvec/" + fmt + "/" + s.name).c_str(),
                                              [=](benchmark::State& st) { run_matmul(st, f, layout, s.rows, s.cols, 1); });
  matvec->Unit(benchmark::kMicrosecond)->MinTime(0.5);
  if (wall_clock) matvec->UseRealTime();
  if (s.rows > 100000) return;
  const char* batch_env = std::getenv("TANDEM_BENCH_BATCH");
  const int64_t batch_tokens = batch_env ? std::clamp<int64_t>(std::atoll(batch_env), 2, 64) : 8;
  auto* batch = benchmark::RegisterBenchmark(("Batch" + std::to_string(batch_tokens) + "/" + fmt + "/" + s.name).c_str(),
                                             [=](benchmark::State& st) { run_matmul(st, f, layout, s.rows, s.cols, batch_tokens); });
  batch->Unit(benchmark::kMicrosecond)->MinTime(0.5);
  if (wall_clock) batch->UseRealTime();
  const char* tokens_env = std::getenv("TANDEM_BENCH_TOKENS");
  const int64_t tokens = tokens_env ? std::max<int64_t>(1, std::atoll(tokens_env)) : 512;
  auto* prefill = benchmark::RegisterBenchmark(("Prefill/" + fmt + "/" + s.name).c_str(),
                                               [=](benchmark::State& st) { run_matmul(st, f, layout, s.rows, s.cols, tokens); });
  prefill->Unit(benchmark::kMillisecond)->MinTime(0.5);
  if (wall_clock) prefill->UseRealTime();
}

}  // namespace

int main(int argc, char** argv) {
  for (WeightFormat f : kFormats) {
    for (const Shape& s : kShapes) {
      if (f == WeightFormat::F32 && s.rows > 100000) continue;  // 2.7 GB: not a format anyone decodes in
      register_shape(f, WeightLayout::Plain, s);
      // Interleaved: the row groups resident weights may get (Q8/Q4 for the AVX-512 VNNI and the
      // AVX2 kernels, BF16/F16 for the AVX-512 ones). Matrices whose columns the row groups' chunks do not divide
      // (Q8/Q4 2560 x 256) stay plain in a model, so they are timed only that way.
      if (f != WeightFormat::F32 && cpu::active_kernels().reads_interleaved(f) && s.cols % interleaved_chunk_cols(f) == 0)
        register_shape(f, WeightLayout::Interleaved, s);
    }
  }
  benchmark::Initialize(&argc, argv);
  RooflineReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
