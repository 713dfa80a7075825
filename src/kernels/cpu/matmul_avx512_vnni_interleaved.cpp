// AVX-512 VNNI matmul for Q8/Q4 weights stored in the Interleaved layout (kernels/weight.h), for
// 1-15 tokens; more tokens go to the prefill panels (matmul_avx512_vnni_panel.cpp), which pack
// this layout by a copy or a nibble unpack. The layout is the panels' order, made once when the
// weights are loaded: lane j of every weight vector belongs to block j of a 512-column chunk, as
// in the activations' panel layout, so 8 vpdpbusd finish 16 block sums in one int32 accumulator
// and a single convert + scale + add follows per chunk. Against the plain-layout decode kernels
// (matmul_avx512_vnni.cpp) that is a quarter of the float work per weight byte.
//
// Q4 holds vectors k and k + 4 of a chunk in the low and high nibbles of one 64-byte vector: a
// mask and a shift give both.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/tiled_matmul.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
// GCC 12 flags the intrinsic headers' own _mm512_undefined_*() placeholders as uninitialized.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "kernels/cpu/avx512_sums.h"

namespace tandem::cpu::detail {

namespace {

// The activations' panel layout: 8 x 64 codes | 16 float scales | 16 int32 corrections per chunk.
constexpr int64_t kChunkBytesX = 640, kScalesAt = 512, kCorrectionsAt = 576;
constexpr int64_t kChunkScaleBytes = 16 * 2;  // 16 f16 weight scales per chunk

// Into L2, like the decode kernels of the plain layout (matmul_avx512_vnni.cpp), one line beside
// each load as they do: issuing a chunk's 8-16 prefetches per row in one burst before its loads
// read Q8 from DRAM 10% slower on one Zen 4 core (20-21 against 22-24 GB/s).
void prefetch(const uint8_t* p) { _mm_prefetch((const char*)p, _MM_HINT_T1); }

template <WeightFormat F, int R, int T>
struct InterleavedTile {
  static constexpr int64_t kChunkBytesW = F == WeightFormat::Q8 ? 512 : 256;
  // Rows of Q4 are half as long as Q8's: prefetch two tiles ahead to keep as many bytes in flight.
  static constexpr int kPrefetchTiles = F == WeightFormat::Q8 ? 1 : 2;

  // One 512-column chunk: 8 vpdpbusd per accumulator, then each block's sum scaled into the sums.
  template <bool First>
  static void chunk(const uint8_t* const* wp, const uint8_t* const* sp, int64_t ahead, const uint8_t* xc,
                    int64_t x_stride, float* sums) {
    __m512i acc[R][T];
#pragma GCC unroll 12
    for (int t = 0; t < T; ++t) {
      const __m512i corr = _mm512_load_si512(xc + t * x_stride + kCorrectionsAt);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r][t] = corr;
    }
    if constexpr (F == WeightFormat::Q8) {
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) {
        __m512i wv[R];
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          prefetch(wp[r] + ahead + 64 * k);
          wv[r] = _mm512_loadu_si512(wp[r] + 64 * k);
        }
#pragma GCC unroll 12
        for (int t = 0; t < T; ++t) {
          const __m512i xv = _mm512_load_si512(xc + t * x_stride + 64 * k);
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) acc[r][t] = _mm512_dpbusd_epi32(acc[r][t], wv[r], xv);
        }
      }
    } else {
      const __m512i nibble = _mm512_set1_epi8(0x0f);
      // Not unrolled: unrolled, GCC hoists all 32 loads of an 8-row chunk and spills (Q4 from DRAM
      // 20 -> 22 GB/s on one Zen 4 core without the spills; Q8, with no nibble unpacking, keeps it).
#pragma GCC unroll 1
      for (int k = 0; k < 4; ++k) {
        __m512i packed[R], codes[R];
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          prefetch(wp[r] + ahead + 64 * k);
          packed[r] = _mm512_loadu_si512(wp[r] + 64 * k);
          codes[r] = _mm512_and_si512(packed[r], nibble);
        }
#pragma GCC unroll 12
        for (int t = 0; t < T; ++t) {
          const __m512i xv = _mm512_load_si512(xc + t * x_stride + 64 * k);
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) acc[r][t] = _mm512_dpbusd_epi32(acc[r][t], codes[r], xv);
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) codes[r] = _mm512_and_si512(_mm512_srli_epi16(packed[r], 4), nibble);
#pragma GCC unroll 12
        for (int t = 0; t < T; ++t) {
          const __m512i xv = _mm512_load_si512(xc + t * x_stride + 64 * (k + 4));
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) acc[r][t] = _mm512_dpbusd_epi32(acc[r][t], codes[r], xv);
        }
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)sp[r]));
#pragma GCC unroll 12
      for (int t = 0; t < T; ++t) {
        const __m512 dx = _mm512_load_ps(reinterpret_cast<const float*>(xc + t * x_stride + kScalesAt));
        add_block_sums<First>(sums + 16 * (r * T + t), acc[r][t], _mm512_mul_ps(dw, dx));
      }
    }
  }

  static void run(const WeightMatrix& w, int64_t row, const uint8_t* xb, int64_t x_stride, int64_t k0, int64_t k1,
                  float* y, int64_t y_stride, bool accumulate, bool prefetch_next) {
    const int64_t ch0 = k0 / kInterleaveChunk, ch1 = k1 / kInterleaveChunk;
    const uint8_t* wp[R];
    const uint8_t* sp[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      wp[r] = w.data + (row + r) * w.row_stride + ch0 * kChunkBytesW;
      sp[r] = w.scales + (row + r) * w.scale_stride + ch0 * kChunkScaleBytes;
    }
    if (prefetch_next)
      for (int r = 0; r < R; ++r)
        for (int64_t b = 0; b < (ch1 - ch0) * kChunkScaleBytes; b += 64)
          prefetch(sp[r] + kPrefetchTiles * R * w.scale_stride + b);
    // The rows kPrefetchTiles tiles below, at the same columns: warmed while this tile reads. Without
    // prefetch_next the line about to be loaded is named instead, which costs less than a branch.
    const int64_t ahead = prefetch_next ? kPrefetchTiles * R * w.row_stride : 0;
    // Float sums live in L1, not registers: the int32 accumulators need those (as in the panels).
    alignas(64) float sums[R * T * 16];
    for (int64_t ch = ch0; ch < ch1; ++ch) {
      const uint8_t* xc = xb + ch * kChunkBytesX;
      if (ch == ch0)
        chunk<true>(wp, sp, ahead, xc, x_stride, sums);
      else
        chunk<false>(wp, sp, ahead, xc, x_stride, sums);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        wp[r] += kChunkBytesW;
        sp[r] += kChunkScaleBytes;
      }
    }
    float totals[R * T + 3];
    reduce_sums<R * T>(sums, totals);
    for (int t = 0; t < T; ++t) {
      float* out = y + t * y_stride + row;
      for (int r = 0; r < R; ++r) out[r] = accumulate ? out[r] + totals[r * T + t] : totals[r * T + t];
    }
  }
};

template <WeightFormat F>
struct ForFormat {
  template <int R, int T>
  struct Tile : InterleavedTile<F, R, T> {};
};

template <WeightFormat F, int R, int T>
TileSet make_tiles() {
  TileSet set;
  fill_tiles<ForFormat<F>::template Tile, R, T>(set);
  set.k_align = kInterleaveChunk;
  // 640 bytes per 512 columns, rounded down: longer column chunks (fewer tile calls, each ending in
  // R x T reductions) at 25 KB of activations per token tile, still within L1.
  set.x_bytes_per_col = 1;
  return set;
}

}  // namespace

void avx512vnni_interleaved_matmul(const WeightMatrix& w, int64_t r0, int64_t r1, const uint8_t* xq,
                                   int64_t xq_stride, int64_t n, float* y, int64_t y_stride) {
  // One token: 8 rows keep 8 independent accumulator chains and 8 rows of cache lines in flight.
  static const TileSet q8_decode = make_tiles<WeightFormat::Q8, 8, 1>();
  static const TileSet q4_decode = make_tiles<WeightFormat::Q4, 8, 1>();
  // 2-15 tokens (batched decode): 4 rows x 4 tokens. On Zen 4 (Batch8, 2 threads from DRAM, GOP/s)
  // it beat 2 x 8, the best on Zen 5 before the sums were reduced four at a time: q4 490-530
  // against 290-345, q8 380-390 against 300-345; 4 x 2, 5 x 4, 3 x 8 and 1 x 8 were slower on one core.
  static const TileSet q8 = make_tiles<WeightFormat::Q8, 4, 4>();
  static const TileSet q4 = make_tiles<WeightFormat::Q4, 4, 4>();
  const bool q4_format = w.format == WeightFormat::Q4;
  if (n == 1) return tiled_matmul(q4_format ? q4_decode : q8_decode, w, r0, r1, xq, xq_stride, n, y, y_stride);
  tiled_matmul(q4_format ? q4 : q8, w, r0, r1, xq, xq_stride, n, y, y_stride);
}

}  // namespace tandem::cpu::detail

#pragma GCC diagnostic pop
#pragma GCC pop_options
