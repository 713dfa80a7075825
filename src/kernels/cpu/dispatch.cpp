// Table selection and the threaded matmul. matmul() runs hundreds of times per decoded token, so
// it allocates nothing in steady state (grow-only thread-local buffers) and makes one pass over
// the pool (two for quantized weights with many tokens: quantize, then multiply).
#include <algorithm>
#include <cstdlib>
#include <memory>
#include <new>

#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/prefetch_tuning.h"

namespace tandem::cpu {

namespace {

// Rows per thread come in multiples of this: a multiple of every ISA's register tile height, and
// 16 floats of y (one cache line) per token, so threads rarely write the same line.
constexpr int64_t kRowGrain = 16;
// Below this many multiply-adds a matmul runs on the calling thread: waking the pool costs more.
constexpr int64_t kMinParallelWork = 1 << 16;
// With fewer tokens than this the calling thread quantizes the activations alone.
constexpr int64_t kMinParallelQuantize = 16;
// Decode and batched decode (up to this many tokens) hand rows out in runs of kRowGrain-row
// chunks to whichever thread is free (ThreadPool::parallel_chunks): on a shared host one core is
// often slowed for milliseconds, and with one fixed range per thread every matmul then waited for
// it. Float prefill (more tokens) keeps one range per thread: its panels pack the activations once
// per call and range, and runs of 4 chunks measured 5-30% slower. Quantized prefill packs only
// weights (the activations are quantized once per matmul, before the pass), so it hands rows out
// too, in runs of at least kPrefillChunkUnits chunks: `kernels_bench Prefill/q4i` on two Zen 3
// cores 236-286 -> 325-358 GOP/s (q8i 152-201 -> 181-230), E4B q4 prefill of 512 tokens 53.8 ->
// 56.6 tok/s mean over 7 alternated pairs (q8 36.5 -> 38.2 over 3). Each row's result is the same
// in any range, so this changes no output. Float weights whose activations a table prepares (AMX
// BF16) keep one range per thread as float prefill does: their prefill packs weight tiles for a
// block of rows and reuses each token tile's activations across it.
constexpr int64_t kMaxChunkedTokens = 15;
constexpr int64_t kPrefillChunkUnits = 4;
// At most this many matrices go through one pass; a larger group takes one pass per matrix.
constexpr size_t kMaxGroup = 8;

// 64-byte aligned, grow-only scratch memory.
class ScratchBuffer {
 public:
  uint8_t* get(size_t bytes) {
    if (bytes > capacity_) {
      const size_t size = (bytes + 63) / 64 * 64;
      data_.reset(static_cast<uint8_t*>(std::aligned_alloc(64, size)));
      if (!data_) throw std::bad_alloc();
      capacity_ = size;
    }
    return data_.get();
  }

 private:
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t, Free> data_;
  size_t capacity_ = 0;
};

thread_local ScratchBuffer t_rows_scratch;    // matmul_rows called directly, on any thread
thread_local ScratchBuffer t_matmul_scratch;  // matmul(), read by every thread of the pool

}  // namespace

const KernelTable& kernels_for(Isa isa) {
  switch (isa) {
    case Isa::Avx512Amx: return isa_supported(isa) ? avx512amx_kernels() : avx512_kernels();
    case Isa::Avx512: return avx512_kernels();
    case Isa::Avx2Vnni: return isa_supported(isa) ? avx2vnni_kernels() : avx2_kernels();
    case Isa::Avx2: return avx2_kernels();
    case Isa::Scalar: break;
  }
  return scalar_kernels();
}

const KernelTable& active_kernels() { return kernels_for(active_isa()); }

WeightLayout preferred_layout(const WeightMatrix& w) {
  return can_interleave(w) && active_kernels().reads_interleaved(w.format) ? WeightLayout::Interleaved : w.layout;
}

float* detail::thread_scratch_floats(int slot, size_t floats) {
  thread_local ScratchBuffer slots[4];
  return reinterpret_cast<float*>(slots[slot].get(floats * sizeof(float)));
}

void detail::quantize_then_matmul_rows(const KernelTable& k, const WeightMatrix& w, int64_t r0, int64_t r1,
                                       const float* x, int64_t x_stride, int64_t n, float* y, int64_t y_stride) {
  if (r0 >= r1 || n <= 0) return;
  if (!k.reads_layout(w))  // rearranged for another table's kernels
    return scalar_kernels().matmul_rows(w, r0, r1, x, x_stride, n, y, y_stride);
  const int64_t stride = k.quantized_activation_stride(w, n);
  uint8_t* xq = t_rows_scratch.get(size_t(stride * n));
  k.quantize_activations(w, n, x, x_stride, 0, n, xq, stride);
  k.matmul_rows_quantized(w, r0, r1, xq, stride, n, y, y_stride);
}

void matmul(ThreadPool& pool, const KernelTable& table, const WeightMatrix& w, const float* x, int64_t x_stride,
            int64_t n, float* y, int64_t y_stride) {
  const MatmulTarget target{&w, y, y_stride};
  matmul_group(pool, table, std::span(&target, 1), x, x_stride, n);
}

namespace {

// Whether x quantized for a's kernels is also what b's kernels read.
bool same_activations(const KernelTable& k, const WeightMatrix& a, const WeightMatrix& b, int64_t n) {
  if (a.format != b.format || a.cols != b.cols || a.layout != b.layout) return false;
  return !k.prepares_activations(a, n) || k.quantized_activation_stride(a, n) == k.quantized_activation_stride(b, n);
}

}  // namespace

void matmul_group(ThreadPool& pool, const KernelTable& table, std::span<const MatmulTarget> targets, const float* x,
                  int64_t x_stride, int64_t n) {
  if (targets.empty() || n <= 0) return;
  bool one_pass = targets.size() <= kMaxGroup;
  for (const MatmulTarget& t : targets) one_pass = one_pass && same_activations(table, *targets[0].w, *t.w, n);
  if (!one_pass) {
    for (const MatmulTarget& t : targets) matmul_group(pool, table, std::span(&t, 1), x, x_stride, n);
    return;
  }
  // The matrices' rows end to end, in units of kRowGrain rows; no unit spans two matrices.
  int64_t first_unit[kMaxGroup + 1] = {0}, work = 0;
  for (size_t i = 0; i < targets.size(); ++i) {
    const WeightMatrix& w = *targets[i].w;
    first_unit[i + 1] = first_unit[i] + (std::max<int64_t>(0, w.rows) + kRowGrain - 1) / kRowGrain;
    work += std::max<int64_t>(0, w.rows) * w.cols * n;
  }
  const int64_t units = first_unit[targets.size()];
  if (units == 0) return;
  const WeightMatrix& w0 = *targets[0].w;
  // Weights rearranged for another table's kernels (tests compare tables on one matrix): the
  // scalar table reads every layout.
  const KernelTable& k = table.reads_layout(w0) ? table : scalar_kernels();
  const bool parallel = pool.size() > 1 && work >= kMinParallelWork && units > 1;

  const bool prepared = k.prepares_activations(w0, n);  // quantized (Q8/Q4), or split for AMX tiles
  const int64_t stride = prepared ? k.quantized_activation_stride(w0, n) : 0;
  uint8_t* xq = prepared ? t_matmul_scratch.get(size_t(stride * n)) : nullptr;
  if (prepared && parallel && n >= kMinParallelQuantize) {
    pool.parallel_for(n, [&](int64_t i0, int64_t i1) {
      k.quantize_activations(w0, n, x, x_stride, i0, i1 - i0, xq, stride);
    });
  } else if (prepared) {
    k.quantize_activations(w0, n, x, x_stride, 0, n, xq, stride);
  }

  if (n <= std::min(kMatvecStreamTokens, detail::prefetch_tuning().float_stream_tokens) && !prepared &&
      k.reads_in_streams(w0)) {
    // Unit j of this pass is unit j of each of its kMatvecStreams parts: a thread taking units in
    // order reads that many far-apart places of the weights side by side.
    const int64_t per_stream = (units + kMatvecStreams - 1) / kMatvecStreams;
    auto multiply_streams = [&](int64_t j0, int64_t j1) {
      RowRun runs[kMatvecStreams];
      float caps[kMatvecStreams];
      for (int64_t j = j0; j < j1; ++j) {
        size_t count = 0, i = 0;
        for (int64_t u = j; u < units && count < size_t(kMatvecStreams); u += per_stream) {
          while (u >= first_unit[i + 1]) ++i;
          const WeightMatrix& w = *targets[i].w;
          const int64_t r0 = (u - first_unit[i]) * kRowGrain;
          caps[count] = targets[i].softcap;
          runs[count++] = {&w, r0, std::min(w.rows, r0 + kRowGrain), targets[i].y, targets[i].y_stride};
        }
        k.matvec_streams(std::span(runs, count), x, x_stride, n);
        for (size_t r = 0; r < count; ++r)
          if (caps[r] > 0)
            for (int64_t t = 0; t < n; ++t)
              table.softcap(runs[r].y + t * runs[r].y_stride + runs[r].r0, runs[r].r1 - runs[r].r0, caps[r]);
      }
    };
    if (parallel) pool.parallel_chunks(per_stream, 1, multiply_streams);
    else multiply_streams(0, per_stream);
    return;
  }
  auto multiply = [&](int64_t u0, int64_t u1) {
    for (size_t i = 0; i < targets.size() && u0 < u1; ++i) {
      if (u0 >= first_unit[i + 1]) continue;
      const int64_t end = std::min(u1, first_unit[i + 1]);
      const MatmulTarget& t = targets[i];
      const int64_t r0 = (u0 - first_unit[i]) * kRowGrain, r1 = std::min(t.w->rows, (end - first_unit[i]) * kRowGrain);
      const int64_t piece = t.softcap > 0 ? kSoftcapPieceRows : r1 - r0;
      for (int64_t p0 = r0; p0 < r1; p0 += piece) {
        const int64_t p1 = std::min(r1, p0 + piece);
        if (prepared) k.matmul_rows_quantized(*t.w, p0, p1, xq, stride, n, t.y, t.y_stride);
        else k.matmul_rows(*t.w, p0, p1, x, x_stride, n, t.y, t.y_stride);
        if (t.softcap > 0)
          for (int64_t tok = 0; tok < n; ++tok) table.softcap(t.y + tok * t.y_stride + p0, p1 - p0, t.softcap);
      }
      u0 = end;
    }
  };
  if (!parallel) multiply(0, units);
  else if (n <= kMaxChunkedTokens) pool.parallel_chunks(units, 1, multiply);
  else if (prepared && is_quantized(w0.format)) pool.parallel_chunks(units, kPrefillChunkUnits, multiply);
  else pool.parallel_for(units, multiply);
}

}  // namespace tandem::cpu
