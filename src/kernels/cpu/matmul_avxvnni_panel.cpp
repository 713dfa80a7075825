// matmul_avx2_quant_panel.cpp (read that first) with AVX-VNNI's vpdpbusd, and the entry points of
// the AVX2 table's quantized kernels on CPUs that have it (Isa::Avx2Vnni; the interleaved tiles
// are in matmul_avxvnni_interleaved.cpp). A panel's codes multiply unsigned (Q8 packed as q + 128,
// Q4's nibbles q + 8) by the signed activations, one instruction per 32 multiply-adds where the
// vpmaddubsw tiles take four (Q8) or two (Q4); each chunk's accumulator starts from the
// activations' corrections (PanelCorrections::DpbusdBlockSums: -8 x each block's code sum, times
// 16 for Q8), so it ends at the same int32 block sums, and the results are the same to the bit.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "kernels/cpu/isa_kernels.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avxvnni")

#include "kernels/cpu/avx2_quant_helpers.h"
#include "kernels/cpu/avx2_quant_panel_tiles.h"

namespace tandem::cpu::detail {

namespace {

// The activations stay in memory as vpdpbusd's third operand, so R x T accumulators and R weight
// vectors share the 16 registers.
constexpr int kTileRows = 3, kTileTokens = 4;

// CorrectionShift: log2 of the weights' offset over Q4's 8 (Q8: 128 = 8 << 4).
template <int CorrectionShift>
struct DpbusdTile {
  template <int R, int T>
  struct Tile {
    template <bool First>
    static void chunk(const uint8_t* wc, int64_t prb, const uint8_t* xc, int64_t x_stride, float* sums) {
      __m256i acc[R][T];
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        const __m256i corrections = _mm256_slli_epi32(
            _mm256_load_si256((const __m256i*)(xc + t * x_stride + kActivationCorrections)), CorrectionShift);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) acc[r][t] = corrections;
      }
#pragma GCC unroll 1
      for (int k = 0; k < 8; ++k) {
        __m256i wv[R];
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) wv[r] = _mm256_load_si256((const __m256i*)(wc + r * prb + 32 * k));
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) {
          const __m256i& xv = *reinterpret_cast<const __m256i*>(xc + t * x_stride + kActivationVectorBytes * k);
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) acc[r][t] = add_dpbusd(acc[r][t], wv[r], xv);
        }
      }
      scale_chunk<First>(wc, prb, xc, x_stride, acc, sums);
    }
  };
};

template <int R, int T>
using Q8Tile = DpbusdTile<4>::Tile<R, T>;
template <int R, int T>
using Q4Tile = DpbusdTile<0>::Tile<R, T>;

}  // namespace

void avxvnni_panel_matmul(const WeightMatrix& w, int64_t r0, int64_t r1, const uint8_t* xq, int64_t xq_stride,
                          int64_t n, float* y, int64_t y_stride) {
  static const auto q8 = make_panel_tiles<Q8Tile, kTileRows, kTileTokens>();
  static const auto q4 = make_panel_tiles<Q4Tile, kTileRows, kTileTokens>();
  panel_matmul(w.format == WeightFormat::Q4 ? q4 : q8, true, w, r0, r1, xq, xq_stride, n, y, y_stride);
}

void avxvnni_quantize_activations(const WeightMatrix& w, int64_t n, const float* x, int64_t x_stride, int64_t first,
                                  int64_t count, uint8_t* out, int64_t out_stride) {
  if (n < kQuantPanelMinTokens && w.layout != WeightLayout::Interleaved)
    return avx2_quantize_activations(w, n, x, x_stride, first, count, out, out_stride);
  for (int64_t i = first; i < first + count; ++i)
    avx2_panel_quantize(w.format, w.cols, x + i * x_stride, out + i * out_stride, PanelCorrections::DpbusdBlockSums);
}

void avxvnni_matmul_rows_quantized(const WeightMatrix& w, int64_t r0, int64_t r1, const uint8_t* xq,
                                   int64_t xq_stride, int64_t n, float* y, int64_t y_stride) {
  if (n >= kQuantPanelMinTokens) return avxvnni_panel_matmul(w, r0, r1, xq, xq_stride, n, y, y_stride);
  if (w.layout == WeightLayout::Interleaved)
    return avxvnni_interleaved_matmul(w, r0, r1, xq, xq_stride, n, y, y_stride);
  avx2_matmul_rows_quantized(w, r0, r1, xq, xq_stride, n, y, y_stride);  // plain weights: vpmaddubsw tiles
}

}  // namespace tandem::cpu::detail

#pragma GCC pop_options
