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

namespace tandem::cpu::detail {

namespace {

// The activations' panel layout: 8 x 64 codes | 16 float scales | 16 int32 corrections per chunk.
constexpr int64_t kChunkBytesX = 640, kScalesAt = 512, kCorrectionsAt = 576;
constexpr int64_t kChunkScaleBytes = kInterleaveChunk / kQuantBlock * 2;  // 16 f16 weight scales per chunk

// A whole row group is one sequential range (kernels/weight.h); it is prefetched this far ahead of
// each load, into L2. On Zen 4 one core read a group stream at 20-22 GB/s this way and at 12-15
// with the same prefetches into L1 (docs/kernels.md).
constexpr int64_t kGroupStreamAhead = 8 << 10;

void prefetch_ahead(const uint8_t* p) { _mm_prefetch((const char*)(p + kGroupStreamAhead), _MM_HINT_T1); }

// A tile is R rows of one row group (all of it, or the part from `row` on) times T tokens. Per
// chunk it takes its rows RS at a time (RS x T int32 accumulators in registers), so that the
// group's codes are read in the order they lie in memory, chunk by chunk.
template <WeightFormat F, int R, int T, int RS>
struct InterleavedTile {
  static constexpr int64_t kCodeBytes = F == WeightFormat::Q8 ? kInterleaveChunk : kInterleaveChunk / 2;

  // Rows [S, S + N) of the tile over one chunk, added into sums.
  template <int S, int N>
  static void rows_of_chunk(const uint8_t* codes, const uint8_t* scales, const uint8_t* xc, int64_t x_stride,
                            bool stream, float* sums) {
    __m512i acc[N][T];
#pragma GCC unroll 12
    for (int t = 0; t < T; ++t) {
      const __m512i corr = _mm512_load_si512(xc + t * x_stride + kCorrectionsAt);
#pragma GCC unroll 8
      for (int r = 0; r < N; ++r) acc[r][t] = corr;
    }
    if constexpr (F == WeightFormat::Q8) {
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) {
        __m512i wv[N];
#pragma GCC unroll 8
        for (int r = 0; r < N; ++r) {
          const uint8_t* p = codes + (S + r) * kCodeBytes + 64 * k;
          if (stream) prefetch_ahead(p);
          wv[r] = _mm512_loadu_si512(p);
        }
#pragma GCC unroll 12
        for (int t = 0; t < T; ++t) {
          const __m512i xv = _mm512_load_si512(xc + t * x_stride + 64 * k);
#pragma GCC unroll 8
          for (int r = 0; r < N; ++r) acc[r][t] = _mm512_dpbusd_epi32(acc[r][t], wv[r], xv);
        }
      }
    } else {
      const __m512i nibble = _mm512_set1_epi8(0x0f);
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        __m512i packed[N], lo[N];
#pragma GCC unroll 8
        for (int r = 0; r < N; ++r) {
          const uint8_t* p = codes + (S + r) * kCodeBytes + 64 * k;
          if (stream) prefetch_ahead(p);
          packed[r] = _mm512_loadu_si512(p);
          lo[r] = _mm512_and_si512(packed[r], nibble);
        }
#pragma GCC unroll 12
        for (int t = 0; t < T; ++t) {
          const __m512i xv = _mm512_load_si512(xc + t * x_stride + 64 * k);
#pragma GCC unroll 8
          for (int r = 0; r < N; ++r) acc[r][t] = _mm512_dpbusd_epi32(acc[r][t], lo[r], xv);
        }
#pragma GCC unroll 8
        for (int r = 0; r < N; ++r) lo[r] = _mm512_and_si512(_mm512_srli_epi16(packed[r], 4), nibble);
#pragma GCC unroll 12
        for (int t = 0; t < T; ++t) {
          const __m512i xv = _mm512_load_si512(xc + t * x_stride + 64 * (k + 4));
#pragma GCC unroll 8
          for (int r = 0; r < N; ++r) acc[r][t] = _mm512_dpbusd_epi32(acc[r][t], lo[r], xv);
        }
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < N; ++r) {
      const uint8_t* sp = scales + (S + r) * kChunkScaleBytes;
      if (stream && (S + r) % 2 == 0) prefetch_ahead(sp);  // two rows' scales per line
      const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)sp));
#pragma GCC unroll 12
      for (int t = 0; t < T; ++t) {
        const __m512 dx = _mm512_load_ps(reinterpret_cast<const float*>(xc + t * x_stride + kScalesAt));
        float* s = sums + 16 * ((S + r) * T + t);
        _mm512_store_ps(s, _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][t]), _mm512_mul_ps(dw, dx), _mm512_load_ps(s)));
      }
    }
  }

  template <int S>
  static void chunk(const uint8_t* codes, const uint8_t* scales, const uint8_t* xc, int64_t x_stride, bool stream,
                    float* sums) {
    if constexpr (S < R) {
      constexpr int N = RS < R - S ? RS : R - S;
      rows_of_chunk<S, N>(codes, scales, xc, x_stride, stream, sums);
      chunk<S + N>(codes, scales, xc, x_stride, stream, sums);
    }
  }

  static void run(const WeightMatrix& w, int64_t row, const uint8_t* xb, int64_t x_stride, int64_t k0, int64_t k1,
                  float* y, int64_t y_stride, bool accumulate, bool prefetch_next) {
    const int64_t ch0 = k0 / kInterleaveChunk, ch1 = k1 / kInterleaveChunk;
    const InterleavedRow place = interleaved_row(w, row);  // rows [row, row + R) share its group
    // Decode tiles cover whole groups, which lie back to back: one stream, prefetched ahead.
    const bool stream = prefetch_next && row % kInterleaveGroupRows == 0 && R == interleaved_group_rows(w, row);
    // Float sums live in L1, not registers: the int32 accumulators need those (as in the panels).
    alignas(64) float sums[R * T * 16];
    for (int i = 0; i < R * T; ++i) _mm512_store_ps(sums + 16 * i, _mm512_setzero_ps());
    for (int64_t ch = ch0; ch < ch1; ++ch)
      chunk<0>(place.codes + ch * place.chunk_step, place.scales + ch * place.chunk_step, xb + ch * kChunkBytesX,
               x_stride, stream, sums);
    for (int t = 0; t < T; ++t) {
      float* out = y + t * y_stride + row;
      for (int r = 0; r < R; ++r) {
        const float s = _mm512_reduce_add_ps(_mm512_load_ps(sums + 16 * (r * T + t)));
        out[r] = accumulate ? out[r] + s : s;
      }
    }
  }
};

template <WeightFormat F, int RS>
struct ForFormat {
  template <int R, int T>
  struct Tile : InterleavedTile<F, R, T, RS> {};
};

template <WeightFormat F, int T, int RS>
TileSet make_tiles() {
  TileSet set;
  fill_tiles<ForFormat<F, RS>::template Tile, int(kInterleaveGroupRows), T>(set);
  set.k_align = kInterleaveChunk;
  // 640 bytes per 512 columns, rounded down: longer column chunks (fewer tile calls, each ending in
  // R x T reductions) at 25 KB of activations per token tile, still within L1.
  set.x_bytes_per_col = 1;
  return set;
}

}  // namespace

void avx512vnni_interleaved_matmul(const WeightMatrix& w, int64_t r0, int64_t r1, const uint8_t* xq,
                                   int64_t xq_stride, int64_t n, float* y, int64_t y_stride) {
  // One token: a whole group at once, 8 independent accumulator chains.
  static const TileSet q8_decode = make_tiles<WeightFormat::Q8, 1, 8>();
  static const TileSet q4_decode = make_tiles<WeightFormat::Q4, 1, 8>();
  // 2-15 tokens (batched decode): 2 rows x 8 tokens of accumulators measured best for 8 tokens on
  // Zen 5 (hot Batch8, 2 threads: 540-560 GOP/s, against 500 for 3 x 8 or 1 x 8 and 480 for 2 x 4;
  // docs/kernels.md); a tile walks its group's 4 row pairs per chunk.
  static const TileSet q8 = make_tiles<WeightFormat::Q8, 8, 2>();
  static const TileSet q4 = make_tiles<WeightFormat::Q4, 8, 2>();
  const bool q4_format = w.format == WeightFormat::Q4;
  const TileSet& tiles = n == 1 ? (q4_format ? q4_decode : q8_decode) : (q4_format ? q4 : q8);
  // Tiles must not straddle groups: rows up to the first group boundary go alone.
  const int64_t aligned = std::min(r1, (r0 + kInterleaveGroupRows - 1) / kInterleaveGroupRows * kInterleaveGroupRows);
  if (aligned > r0) tiled_matmul(tiles, w, r0, aligned, xq, xq_stride, n, y, y_stride);
  if (r1 > aligned) tiled_matmul(tiles, w, aligned, r1, xq, xq_stride, n, y, y_stride);
}

}  // namespace tandem::cpu::detail

#pragma GCC diagnostic pop
#pragma GCC pop_options
