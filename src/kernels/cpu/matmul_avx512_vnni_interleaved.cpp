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

#include "kernels/cpu/avx512_load_once.h"
#include "kernels/cpu/avx512_sums.h"

namespace tandem::cpu::detail {

namespace {

// The activations' panel layout: 8 x 64 codes | 16 float scales | 16 int32 corrections per chunk.
constexpr int64_t kChunkBytesX = 640, kScalesAt = 512, kCorrectionsAt = 576;

// Batched tiles prefetch into L2, one line beside each load: issuing a chunk's 8-16 prefetches per
// row in one burst before its loads read Q8 from DRAM 10% slower on one Zen 4 core (20-21 against
// 22-24 GB/s). A decode tile reads its whole row group as one sequential stream and leaves it to
// the hardware prefetchers, which follow it like a plain read; in a read test a software prefetch
// 4 KB ahead of such a stream slowed it (docs/kernels.md, Row groups).
void prefetch(const uint8_t* p) { _mm_prefetch((const char*)p, _MM_HINT_T1); }

template <WeightFormat F, int R, int T>
struct InterleavedTile {
  static constexpr int kVectors = F == WeightFormat::Q8 ? 8 : 4;  // 64-byte weight vectors per chunk and row

  // One 512-column chunk: 8 vpdpbusd per accumulator, then each block's sum scaled into the sums.
  // w0/s0: the tile's first row's vectors and scales of this chunk; the other rows follow at 64 and
  // 32 bytes, the next vector of a row at vs bytes.
  template <bool First>
  static void chunk(const uint8_t* w0, const uint8_t* s0, int64_t vs, int64_t ahead, const uint8_t* xc,
                    int64_t x_stride, float* sums) {
    __m512i acc[R][T];
#pragma GCC unroll 12
    for (int t = 0; t < T; ++t) {
      const __m512i corr = _mm512_load_si512(xc + t * x_stride + kCorrectionsAt);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r][t] = corr;
    }
    if constexpr (T == 1) {
      (void)ahead;
      // One token: each weight vector meets one activation vector, so it is loaded where it is
      // used and only the accumulators stay in registers.
      const __m512i nibble = _mm512_set1_epi8(0x0f);
#pragma GCC unroll 1
      for (int k = 0; k < kVectors; ++k) {
        const uint8_t* wk = w0 + k * vs;
        if constexpr (F == WeightFormat::Q8) {
          const __m512i xv = _mm512_load_si512(xc + 64 * k);
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], _mm512_loadu_si512(wk + 64 * r), xv);
        } else {
          const __m512i xlo = _mm512_load_si512(xc + 64 * k), xhi = _mm512_load_si512(xc + 64 * (k + 4));
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) {
            const __m512i v = load_once(wk + 64 * r);
            acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], _mm512_and_si512(v, nibble), xlo);
            acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble), xhi);
          }
        }
      }
    } else if constexpr (F == WeightFormat::Q8) {
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) {
        __m512i wv[R];
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          prefetch(w0 + ahead + k * vs + 64 * r);
          wv[r] = _mm512_loadu_si512(w0 + k * vs + 64 * r);
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
      // Unrolled: a rolled loop kept the 16 accumulators in a fresh set of registers per pass
      // and copied them back (and spilled three), 15% slower in L1.
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        __m512i packed[R], codes[R];
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          prefetch(w0 + ahead + k * vs + 64 * r);
          packed[r] = _mm512_loadu_si512(w0 + k * vs + 64 * r);
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
    // The token scales are loaded once: the stores to sums may alias xc for all GCC knows.
    __m512 dx[T];
#pragma GCC unroll 12
    for (int t = 0; t < T; ++t) dx[t] = _mm512_load_ps(reinterpret_cast<const float*>(xc + t * x_stride + kScalesAt));
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(s0 + 32 * r)));
#pragma GCC unroll 12
      for (int t = 0; t < T; ++t) add_block_sums<First>(sums + 16 * (r * T + t), acc[r][t], _mm512_mul_ps(dw, dx[t]));
    }
  }

  static void run(const WeightMatrix& w, int64_t row, const uint8_t* xb, int64_t x_stride, int64_t k0, int64_t k1,
                  float* y, int64_t y_stride, bool accumulate, bool prefetch_next) {
    const int64_t group_rows = interleaved_group_rows(w, row);
    if constexpr (R > 1) {
      if (row % kInterleaveRows + R > group_rows) {  // across two row groups: only for unaligned row ranges
        for (int r = 0; r < R; ++r)
          InterleavedTile<F, 1, T>::run(w, row + r, xb, x_stride, k0, k1, y, y_stride, accumulate, prefetch_next);
        return;
      }
    }
    const int64_t ch0 = k0 / kInterleaveChunk, ch1 = k1 / kInterleaveChunk;
    const int64_t vs = 64 * group_rows, chunk_step = group_rows * interleaved_chunk_row_bytes(F);
    const uint8_t* wc = interleaved_vector(w, row, ch0, 0);
    const uint8_t* sc = interleaved_scales(w, row, ch0);
    // The same rows of the next group, at the same columns: warmed while this tile reads (batches
    // only). Without prefetch_next the line about to be loaded is named instead, which costs less
    // than a branch.
    const bool ahead_ok = prefetch_next && T > 1;
    const int64_t group_bytes = kInterleaveRows * (w.row_stride + w.scale_stride);
    const int64_t ahead = ahead_ok ? group_bytes : 0;
    // Float sums live in L1, not registers: the int32 accumulators need those (as in the panels).
    alignas(64) float sums[R * T * 16];
    for (int64_t ch = ch0; ch < ch1; ++ch) {
      if (ahead_ok)
        for (int64_t b = 0; b < 32 * R; b += 64) prefetch(sc + group_bytes + b);
      const uint8_t* xc = xb + ch * kChunkBytesX;
      if (ch == ch0)
        chunk<true>(wc, sc, vs, ahead, xc, x_stride, sums);
      else
        chunk<false>(wc, sc, vs, ahead, xc, x_stride, sums);
      wc += chunk_step;
      sc += chunk_step;
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
  // One token: a tile is a whole row group, so it reads one sequential stream (see WeightLayout).
  static const TileSet q8_decode = make_tiles<WeightFormat::Q8, kInterleaveRows, 1>();
  static const TileSet q4_decode = make_tiles<WeightFormat::Q4, kInterleaveRows, 1>();
  // 2-15 tokens (batched decode): 4 rows (a row group) x 4 tokens. On Zen 4 (Batch8, 2 threads from
  // DRAM, GOP/s) it beat 2 x 8, the best on Zen 5 before the sums were reduced four at a time: q4
  // 490-530 against 290-345, q8 380-390 against 300-345; 4 x 2, 5 x 4, 3 x 8 and 1 x 8 were slower on
  // one core. With groups of 16 rows, 4-row tiles (each reading a quarter of every 1 KB) and
  // 16-row tiles in 4-row sub-tiles were 7-30% slower in E4B batches of 8.
  static const TileSet q8 = make_tiles<WeightFormat::Q8, 4, 4>();
  static const TileSet q4 = make_tiles<WeightFormat::Q4, 4, 4>();
  const bool q4_format = w.format == WeightFormat::Q4;
  if (n == 1) return tiled_matmul(q4_format ? q4_decode : q8_decode, w, r0, r1, xq, xq_stride, n, y, y_stride);
  tiled_matmul(q4_format ? q4 : q8, w, r0, r1, xq, xq_stride, n, y, y_stride);
}

}  // namespace tandem::cpu::detail

#pragma GCC diagnostic pop
#pragma GCC pop_options
