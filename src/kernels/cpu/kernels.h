#pragma once
// The CPU kernels, one table of function pointers per instruction set (scalar, AVX2+FMA,
// AVX-512), chosen at run time from cpuid. Every kernel is single-threaded; matmul() below splits
// rows across the thread pool. Activations are float32; weights come in any WeightFormat.
#include <cstdint>
#include <span>

#include "core/cpu_features.h"
#include "core/thread_pool.h"
#include "kernels/ops.h"
#include "kernels/weight.h"

namespace tandem::cpu {

// Rows [r0, r1) of one matrix: y[t * y_stride + r] = W(r, :) . x_t for r in [r0, r1) and each token t.
struct RowRun {
  const WeightMatrix* w = nullptr;
  int64_t r0 = 0, r1 = 0;
  float* y = nullptr;
  int64_t y_stride = 0;
};

// gelu_gate's result is 0 where 2u = 2 * sqrt(2 / pi) * (g + 0.044715 g^3) is below this: there
// tanh(u) is -1 in float (from 2u = -18.022 on), so the reference's 0.5 g (1 + tanh(u)) is 0.
constexpr float kGeluZeroBelow = -18.03f;

// How many row runs a core reads side by side (KernelTable::matvec_streams).
constexpr int kMatvecStreams = 4;
// Most tokens KernelTable::matvec_streams takes: batches of up to this many read float row groups
// as one token does (docs/kernels.md, "Session 52"); a CPU may send fewer (prefetch_tuning.h).
constexpr int kMatvecStreamTokens = 8;

struct KernelTable {
  Isa isa;
  // y[i * y_stride + r] = sum_c W(r, c) * x[i * x_stride + c]  for r in [r0, r1), i in [0, n).
  void (*matmul_rows)(const WeightMatrix& w, int64_t r0, int64_t r1, const float* x, int64_t x_stride,
                      int64_t n, float* y, int64_t y_stride);
  // out = x * (mean(x^2) + eps)^-0.5 * (weight ? weight : 1); out may alias x.
  void (*rms_norm)(float* out, const float* x, const float* weight, int64_t dim, float eps);
  // gate[i] = gelu_tanh(gate[i]) * up[i]
  void (*gelu_gate)(float* gate, const float* up, int64_t n);
  // x[i] = cap * tanh(x[i] / cap)
  void (*softcap)(float* x, int64_t n, float cap);
  // x[i] += y[i]
  void (*add)(float* x, const float* y, int64_t n);
  // x[i] *= s
  void (*scale)(float* x, int64_t n, float s);
  // sum_i a[i] * b[i]
  float (*dot)(const float* a, const float* b, int64_t n);
  // y[i] += a * x[i]
  void (*axpy)(float* y, float a, const float* x, int64_t n);

  // Quantized weights (Q8/Q4) in two steps, so that matmul() quantizes the activations once per
  // call and not once per thread: the activations become int8 per block of 32 values (scale =
  // max|x|/127, round to nearest), in a layout private to this table, then integer dot products.
  // matmul_rows does both steps itself for Q8/Q4. All three are nullptr in the scalar table, whose
  // matmul_rows multiplies the float activations by the exactly dequantized weights.
  //
  // The layout may depend on the weights' format and layout and on n, the number of tokens of
  // the matmul (decode and prefill kernels want different ones). Bytes one token takes in it (a
  // multiple of 64):
  int64_t (*quantized_activation_stride)(const WeightMatrix& w, int64_t n);
  // Quantizes tokens [first, first + count) of the n rows of x (w.cols values each, row i at
  // x + i * x_stride) into out (64-byte aligned, token i at out + i * out_stride).
  void (*quantize_activations)(const WeightMatrix& w, int64_t n, const float* x, int64_t x_stride, int64_t first,
                               int64_t count, uint8_t* out, int64_t out_stride);
  // matmul_rows for Q8/Q4 weights on all n tokens from quantize_activations (same table, w.cols, n).
  void (*matmul_rows_quantized)(const WeightMatrix& w, int64_t r0, int64_t r1, const uint8_t* xq,
                                int64_t xq_stride, int64_t n, float* y, int64_t y_stride);
  // Whether matmul_rows_quantized reads Q8, Q4, and matmul_rows BF16/F16, in WeightLayout::Interleaved
  // (else only Plain).
  bool interleaved_q8 = false;
  bool interleaved_q4 = false;
  bool interleaved_float = false;

  // 1 to kMatvecStreamTokens tokens (n, each w.cols floats at x + t * x_stride) over row runs of
  // BF16/F16 matrices of one width in WeightLayout::Interleaved, kMatvecStreams runs read side by
  // side at a time. One core keeps more DRAM reads in flight on several streams far apart than on
  // one, as the bandwidth probe reads (docs/kernels.md, "Streams"), so matmul() hands each thread
  // runs from kMatvecStreams places of a pass. Each row's sum is the one matmul_rows gives, for
  // every token. nullptr where a table has none. (The Q8/Q4 row groups have streams of their own,
  // inside each ISA's interleaved kernel, with software prefetches.)
  void (*matvec_streams)(std::span<const RowRun> runs, const float* x, int64_t x_stride, int64_t n) = nullptr;

  // Float weights this table also takes through the two steps above (its "quantized" activations
  // are then a packed float form), per matrix and token count; nullptr: none. The AMX table
  // packs activations for its BF16 tiles this way, once per matmul and not once per thread. That
  // layout is not one stride per token: it spans the whole n * stride buffer, and concurrent calls
  // for disjoint token ranges write disjoint bytes of it.
  bool (*prepares_float)(const WeightMatrix& w, int64_t n) = nullptr;

  // Whether matmul() runs w through quantize_activations and matmul_rows_quantized.
  bool prepares_activations(const WeightMatrix& w, int64_t n) const {
    return quantize_activations && (is_quantized(w.format) || (prepares_float && prepares_float(w, n)));
  }

  bool reads_in_streams(const WeightMatrix& w) const {
    return matvec_streams && w.layout == WeightLayout::Interleaved &&
           (w.format == WeightFormat::BF16 || w.format == WeightFormat::F16);
  }
  bool reads_interleaved(WeightFormat format) const {
    if (format == WeightFormat::Q8) return interleaved_q8;
    if (format == WeightFormat::Q4) return interleaved_q4;
    return interleaved_float;
  }
  bool reads_layout(const WeightMatrix& w) const {
    return w.layout == WeightLayout::Plain || reads_interleaved(w.format);
  }
};

const KernelTable& scalar_kernels();
const KernelTable& avx2_kernels();      // only call when the CPU has AVX2+FMA+F16C
const KernelTable& avx2vnni_kernels();  // ... and AVX-VNNI
const KernelTable& avx512_kernels();    // only call when the CPU has AVX-512 F/BW/VL/DQ
const KernelTable& avx512amx_kernels();  // ... and AMX-BF16 (cpu_features().amx_bf16)
const KernelTable& kernels_for(Isa isa);
const KernelTable& active_kernels();  // kernels_for(active_isa())

// The layout the active kernels multiply w fastest in, from cache and for batches of tokens:
// Interleaved for matrices that can_interleave() when the active kernels read that layout (Q8/Q4
// with AVX-512 VNNI, BF16/F16 with AVX-512), else w's own layout. One token streaming Q8 from DRAM
// reads the plain layout about as fast (docs/kernels.md), which is why the CLI's auto layout keeps
// Q8 plain for one sequence.
WeightLayout preferred_layout(const WeightMatrix& w);

// y = x · W^T for n rows of x, rows of W split across the pool's threads.
void matmul(ThreadPool& pool, const KernelTable& k, const WeightMatrix& w, const float* x, int64_t x_stride,
            int64_t n, float* y, int64_t y_stride);

// matmul() for each target, all over the same x (matmul() is a group of one). Matrices that share
// format, layout and width run as one pass over the pool with x quantized once: each decode step
// then hands work to the threads fewer times, and their row streams run on from one matrix into
// the next. Other groups take one pass per matrix.
// A target with a softcap has its rows multiplied in pieces of at most kSoftcapPieceRows, each
// soft-capped by k.softcap while its results are still in the core's cache.
void matmul_group(ThreadPool& pool, const KernelTable& k, std::span<const MatmulTarget> targets, const float* x,
                  int64_t x_stride, int64_t n);
// 8 tokens' 32 KB each stay in L2. E4B q4 on the Intel Xeon, per-call timers in `tandem bench`:
// the LM head and its soft-cap 21.6 -> 21.0 ms of a batch of 8's ~155 ms step (the separate pass
// read 8 MB of logits back from memory); one token's 11.8 ms either way.
constexpr int64_t kSoftcapPieceRows = 8192;
// Pieces start on a multiple of every table's vector width, so each value meets the same softcap
// code (vector body or scalar tail) as in one call over the row.
static_assert(kSoftcapPieceRows % 16 == 0);

}  // namespace tandem::cpu
