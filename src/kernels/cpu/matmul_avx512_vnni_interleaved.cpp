// AVX-512 VNNI matmul for Q8/Q4 weights stored in the Interleaved layout (kernels/weight.h), for
// 1-15 tokens, on Intel up to 48 (Q8) or 40 (Q4, prefetch_tuning.h); more tokens go to the prefill
// panels (matmul_avx512_vnni_panel.cpp), which pack
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
#include <cstring>
#include <utility>

#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/prefetch_tuning.h"
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

// Hint: where the tile's prefetches go (_MM_HINT_T1: L2, _MM_HINT_T0: L1; prefetch_tuning.h).
template <WeightFormat F, int R, int T, int Hint = _MM_HINT_T1>
struct InterleavedTile {
  static void prefetch(const uint8_t* p) { _mm_prefetch((const char*)p, static_cast<_mm_hint>(Hint)); }

  static constexpr int kVectors = F == WeightFormat::Q8 ? 8 : 4;  // 64-byte weight vectors per chunk and row

  // One token's products over one chunk of the tile's rows, added to acc: each weight vector meets
  // one activation vector, so it is loaded where it is used and only the accumulators stay in
  // registers.
  static void one_token_products(const uint8_t* w0, int64_t vs, int64_t ahead, const uint8_t* xc,
                                 __m512i (&acc)[R][T]) {
    const __m512i nibble = _mm512_set1_epi8(0x0f);
#pragma GCC unroll 1
    for (int k = 0; k < kVectors; ++k) {
      const uint8_t* wk = w0 + k * vs;
      if (ahead)
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) prefetch(wk + 64 * r + ahead);
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
  }

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
      one_token_products(w0, vs, ahead, xc, acc);
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
          const __m512i xv = load_once(xc + t * x_stride + 64 * k);
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
          packed[r] = load_once(w0 + k * vs + 64 * r);
          codes[r] = _mm512_and_si512(packed[r], nibble);
        }
#pragma GCC unroll 12
        for (int t = 0; t < T; ++t) {
          const __m512i xv = load_once(xc + t * x_stride + 64 * k);
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) acc[r][t] = _mm512_dpbusd_epi32(acc[r][t], codes[r], xv);
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) codes[r] = _mm512_and_si512(_mm512_srli_epi16(packed[r], 4), nibble);
#pragma GCC unroll 12
        for (int t = 0; t < T; ++t) {
          const __m512i xv = load_once(xc + t * x_stride + 64 * (k + 4));
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

  // Chunks [ch0, ch1) of the tile's rows and tokens into its float sums; `first`: the sums hold
  // nothing yet, so the first chunk stores instead of adding. ahead: bytes to the lines that are
  // prefetched beside each load (batches: 0 is the line about to be loaded, which costs less than a
  // branch; one token: 0 is none), and any other ahead prefetches the chunk's scales at + ahead.
  static void chunks(const WeightMatrix& w, int64_t row, const uint8_t* xb, int64_t x_stride, int64_t ch0,
                     int64_t ch1, bool first, int64_t ahead, float* sums) {
    const int64_t group_rows = interleaved_group_rows(w, row);
    const int64_t vs = 64 * group_rows, chunk_step = group_rows * interleaved_chunk_row_bytes(F);
    const uint8_t* wc = interleaved_vector(w, row, ch0, 0);
    const uint8_t* sc = interleaved_scales(w, row, ch0);
    for (int64_t ch = ch0; ch < ch1; ++ch) {
      if (ahead)
        for (int64_t b = 0; b < 32 * R; b += 64) prefetch(sc + ahead + b);
      const uint8_t* xc = xb + ch * kChunkBytesX;
      if (first && ch == ch0)
        chunk<true>(wc, sc, vs, ahead, xc, x_stride, sums);
      else
        chunk<false>(wc, sc, vs, ahead, xc, x_stride, sums);
      wc += chunk_step;
      sc += chunk_step;
    }
  }

  // The tile's dot products from its sums into y (y[t * y_stride + row + r], added when accumulate).
  static void store(const float* sums, int64_t row, float* y, int64_t y_stride, bool accumulate) {
    float totals[R * T + 3];
    reduce_sums<R * T>(sums, totals);
    for (int t = 0; t < T; ++t) {
      float* out = y + t * y_stride + row;
      for (int r = 0; r < R; ++r) out[r] = accumulate ? out[r] + totals[r * T + t] : totals[r * T + t];
    }
  }

  // One token (decode, through tiled_matmul); batches go through batched_matmul below.
  static void run(const WeightMatrix& w, int64_t row, const uint8_t* xb, int64_t x_stride, int64_t k0, int64_t k1,
                  float* y, int64_t y_stride, bool accumulate, bool prefetch_next) {
    static_assert(T == 1, "one token");
    if constexpr (R > 1) {
      if (row % kInterleaveRows + R > interleaved_group_rows(w, row)) {  // across two row groups: unaligned ranges only
        for (int r = 0; r < R; ++r)
          InterleavedTile<F, 1, T, Hint>::run(w, row + r, xb, x_stride, k0, k1, y, y_stride, accumulate,
                                              prefetch_next);
        return;
      }
    }
    // The float sums stay in registers across the chunks: a row group's 4 int32 and 4 float
    // accumulators fit beside the weights, and the sums' load and store per chunk, 8 more memory
    // operations beside 16 weight loads, cost E4B decode 3-5% (q4 segments alternated A-B-B-A in
    // one process: 1.04 median against 0.99 for the harness against itself; q8 1.04-1.07 against
    // 1.01-1.03; kernels_bench Matvec/q4i on the LM head, two threads: 173-197 -> 212-238 GOP/s).
    // Each block's sum is scaled and added exactly as add_block_sums does, and store() reduces the
    // sums, so a row's result is the one a batch gives it.
    const int64_t ahead = prefetch_tuning().decode_ahead;
    const int64_t group_rows = interleaved_group_rows(w, row);
    const int64_t vs = 64 * group_rows, chunk_step = group_rows * interleaved_chunk_row_bytes(F);
    const int64_t ch0 = k0 / kInterleaveChunk, ch1 = k1 / kInterleaveChunk;
    const uint8_t* wc = interleaved_vector(w, row, ch0, 0);
    const uint8_t* sc = interleaved_scales(w, row, ch0);
    __m512 sums[R];
    for (int64_t ch = ch0; ch < ch1; ++ch, wc += chunk_step, sc += chunk_step)
      one_token_chunk(wc, sc, vs, ahead, xb + ch * kChunkBytesX, ch == ch0, sums);
    store_registers(sums, row, y, y_stride, accumulate);
  }

  // One token's chunk of the tile's rows (vectors from wc, scales from sc, the chunk's activations
  // at xc), each block's sum scaled and added to the row's float sums (set on the first chunk).
  static void one_token_chunk(const uint8_t* wc, const uint8_t* sc, int64_t vs, int64_t ahead, const uint8_t* xc,
                              bool first, __m512 (&sums)[R]) {
    if (ahead)
      for (int64_t b = 0; b < 32 * R; b += 64) prefetch(sc + ahead + b);
    __m512i acc[R][1];
    const __m512i corrections = _mm512_load_si512(xc + kCorrectionsAt);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[r][0] = corrections;
    one_token_products(wc, vs, ahead, xc, acc);
    const __m512 dx = _mm512_load_ps(reinterpret_cast<const float*>(xc + kScalesAt));
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) add_scaled_block_sums(acc[r][0], sc + 32 * r, dx, first, sums[r]);
  }

  // One row's 16 block sums of a chunk, scaled by its weight scales (f16 at sc) and the token's
  // (dx), into its float sums (set when first). Every one-token path adds its chunks through this,
  // so a row's result does not depend on which one read it.
  static void add_scaled_block_sums(__m512i block_sums, const uint8_t* sc, __m512 dx, bool first, __m512& sum) {
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sc)));
    const __m512 v = _mm512_cvtepi32_ps(block_sums), scale = _mm512_mul_ps(dw, dx);
    sum = first ? _mm512_mul_ps(v, scale) : _mm512_fmadd_ps(v, scale, sum);
  }

  // The dot products of float sums held in registers into y, as store() does from memory.
  static void store_registers(const __m512 (&sums)[R], int64_t row, float* y, int64_t y_stride, bool accumulate) {
    alignas(64) float lanes[R * 16];
    for (int r = 0; r < R; ++r) _mm512_store_ps(lanes + 16 * r, sums[r]);
    store(lanes, row, y, y_stride, accumulate);
  }
};

// Most tokens the streams below take (1 or 2; more go to the batch tiles).
constexpr int kMaxStreamTokens = 2;

// One token over a thread's rows [r0, r1) as S parts read side by side: the i-th row group of
// every part in turn, and within it one weight vector of each part in turn, with every part's
// float sums in registers (what spills stays in L1). A single sequential stream per core reads
// less of the bandwidth than several: on Zen 5, plain reads of E4B q4 matrices in the decode's
// order, each thread's half as one stream, read 0.73-0.83 of the probe, as 2 or 4 streams 1 KB at
// a time 0.87-0.90 (bench/read_patterns, stream1 and streams2x1K); 2 streams a chunk at a time,
// against rows in order, took E4B decode 1.03x (q4, median of 8 A-B-B-A runs) and 1.05-1.08x (q8)
// there (docs/kernels.md, "Session 37"; it then measured 4 streams slower). On an Intel Xeon 4
// streams a vector at a time read most (prefetch_tuning.h); Zen 5 keeps 2, now also taken a vector
// at a time, which was not measured there. Each row's sum is the one Tile::run gives it (the same
// chunks in the same order), and the rows the parts leave (a last uneven group, a range that does
// not start at a group, groups that do not split evenly) go through tiled_matmul.
//
// T tokens (at most kMaxStreamTokens) take the same walk, each weight vector meeting every token's
// activation vector where it is loaded, and each (row, token) adds its products and chunks as one
// token alone does, so every token gets its one-token result. Zen 5, two tokens against the batch
// tiles (which read a row group's tile once for up to 4 tokens, but one stream per core): E4B q8
// batches of 2 19.6-19.8 -> 25.3-26.4 tok/s, q4 40.7-41.5 -> 41.9-42.5 (host-state noise in q4's
// other runs was larger than that); 3 and 4 tokens ran slower than the tiles end to end (q4 batches
// of 4 60 -> 41, q8 35 -> 30; the accumulators then outgrow the registers twice over, also with
// a row's vectors walked in turn instead of a vector of each row), so larger batches keep the
// tiles (docs/kernels.md, "Session 54").
template <WeightFormat F, int S, int T>
void tokens_in_streams(const TileSet& tiles, const WeightMatrix& w, int64_t r0, int64_t r1, const uint8_t* xb,
                       int64_t x_stride, float* y, int64_t y_stride) {
  static_assert(T >= 1 && T <= kMaxStreamTokens);
  constexpr int R = kInterleaveRows;
  using Tile = InterleavedTile<F, R, 1>;
  constexpr int kVectors = Tile::kVectors;
  const int64_t ahead = prefetch_tuning().decode_ahead / S;
  const int64_t groups_per_stream = r0 % R ? 0 : (std::min(r1, w.rows / R * R) - r0) / R / S;
  const int64_t chunk_step = R * interleaved_chunk_row_bytes(F), chunks = w.cols / kInterleaveChunk;
  const auto prefetch = [&](const uint8_t* p) { _mm_prefetch(reinterpret_cast<const char*>(p + ahead), _MM_HINT_T0); };
  const __m512i nibble = _mm512_set1_epi8(0x0f);
  // Each part's results wait in L1 and go to y kStagedGroups groups at a time. Written a row group at
  // a time (four floats, a new line of y every fourth group), they cost E4B decode 3-4% of the time
  // of its 2048-2560-column matrices and 0-2% of the 10240-column one (q4, one process, the two
  // ways alternated call by call and timed inside this function: 0.965-0.972 of the cycles per
  // weight, 0.978-0.998; the same way against itself 0.999-1.001). 16 or 256 groups gained less,
  // non-temporal stores the same; prefetching y's lines for writing, 1-16 groups ahead, nothing.
  // kernels_bench Matvec/q4i, two threads: 10240 x 2560 0.91 -> 0.97-0.99 of the probe.
  constexpr int64_t kStagedGroups = 32;
  alignas(64) float staged[S][T][kStagedGroups * R];
  for (int64_t i = 0; i < groups_per_stream; ++i) {
    int64_t first_row[S];
    const uint8_t* wc[S];
    const uint8_t* sc[S];
    for (int s = 0; s < S; ++s) {
      first_row[s] = r0 + R * (i + s * groups_per_stream);
      wc[s] = interleaved_vector(w, first_row[s], 0, 0);
      sc[s] = interleaved_scales(w, first_row[s], 0);
    }
    __m512 sums[S][R][T];
    for (int64_t ch = 0; ch < chunks; ++ch) {
      const uint8_t* xc = xb + ch * kChunkBytesX;
      __m512i acc[S][R][T];
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) {
        const __m512i corrections = _mm512_load_si512(xc + t * x_stride + kCorrectionsAt);
#pragma GCC unroll 4
        for (int s = 0; s < S; ++s)
#pragma GCC unroll 4
          for (int r = 0; r < R; ++r) acc[s][r][t] = corrections;
      }
      // The scales' 128 bytes: beside the vectors' prefetches, which step over them, every line
      // of the stream ahead is prefetched once.
#pragma GCC unroll 4
      for (int s = 0; s < S; ++s)
        for (int64_t b = 0; b < 32 * R; b += 64) prefetch(sc[s] + b);
#pragma GCC unroll 1
      for (int k = 0; k < kVectors; ++k) {
        // Q4: the low nibbles meet activation vector k, the high ones vector k + 4.
        __m512i xlo[T], xhi[T];
#pragma GCC unroll 4
        for (int t = 0; t < T; ++t) {
          xlo[t] = _mm512_load_si512(xc + t * x_stride + 64 * k);
          xhi[t] = F == WeightFormat::Q4 ? _mm512_load_si512(xc + t * x_stride + 64 * (k + 4)) : xlo[t];
        }
        // One loop over the S x R vectors, unrolled 4 times rather than fully: GCC then keeps the
        // accumulators in memory (a load and a store beside each vpdpbusd, all in L1), and on the
        // Xeon that walk read 4-6% more of the bandwidth than the fully unrolled one with the
        // accumulators in registers (docs/kernels.md, "Session 43": E4B decode at a short
        // context, q4 0.85-0.86 -> 0.89-0.90 of the probe, q8 0.85 -> 0.89). Same vectors, same
        // order.
#pragma GCC unroll 4
        for (int i = 0; i < S * R; ++i) {
          const int s = i / R, r = i % R;
          const uint8_t* p = wc[s] + 64 * (k * R + r);
          prefetch(p);
          if constexpr (F == WeightFormat::Q8 && T == 1) {
            acc[s][r][0] = _mm512_dpbusd_epi32(acc[s][r][0], _mm512_loadu_si512(p), xlo[0]);
          } else if constexpr (F == WeightFormat::Q8) {
            const __m512i v = load_once(p);
#pragma GCC unroll 4
            for (int t = 0; t < T; ++t) acc[s][r][t] = _mm512_dpbusd_epi32(acc[s][r][t], v, xlo[t]);
          } else {
            const __m512i v = load_once(p);
            const __m512i lo = _mm512_and_si512(v, nibble), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
#pragma GCC unroll 4
            for (int t = 0; t < T; ++t) {
              acc[s][r][t] = _mm512_dpbusd_epi32(acc[s][r][t], lo, xlo[t]);
              acc[s][r][t] = _mm512_dpbusd_epi32(acc[s][r][t], hi, xhi[t]);
            }
          }
        }
      }
      __m512 dx[T];
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) dx[t] = _mm512_load_ps(reinterpret_cast<const float*>(xc + t * x_stride + kScalesAt));
#pragma GCC unroll 4
      for (int s = 0; s < S; ++s) {
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
          for (int t = 0; t < T; ++t)
            Tile::add_scaled_block_sums(acc[s][r][t], sc[s] + 32 * r, dx[t], ch == 0, sums[s][r][t]);
        wc[s] += chunk_step;
        sc[s] += chunk_step;
      }
    }
    const int64_t slot = i % kStagedGroups;
    for (int s = 0; s < S; ++s)
      for (int t = 0; t < T; ++t) {
        __m512 token_sums[R];
        for (int r = 0; r < R; ++r) token_sums[r] = sums[s][r][t];
        Tile::store_registers(token_sums, R * slot, staged[s][t], 0, false);
      }
    if (slot == kStagedGroups - 1 || i == groups_per_stream - 1)
      for (int s = 0; s < S; ++s)
        for (int t = 0; t < T; ++t)
          std::memcpy(y + t * y_stride + first_row[s] - R * slot, staged[s][t], sizeof(float) * size_t(R * (slot + 1)));
  }
  tiled_matmul(tiles, w, r0 + R * S * groups_per_stream, r1, xb, x_stride, T, y, y_stride);
}

// One or two tokens over a thread's rows [r0, r1) in S streams (see tokens_in_streams).
template <WeightFormat F, int S>
void in_streams(const TileSet& tiles, const WeightMatrix& w, int64_t r0, int64_t r1, const uint8_t* xb,
                int64_t x_stride, int64_t n, float* y, int64_t y_stride) {
  static_assert(kMaxStreamTokens == 2, "one instance per token count");
  if (n == 1) return tokens_in_streams<F, S, 1>(tiles, w, r0, r1, xb, x_stride, y, y_stride);
  tokens_in_streams<F, S, 2>(tiles, w, r0, r1, xb, x_stride, y, y_stride);
}

template <WeightFormat F>
void in_streams(const TileSet& tiles, const WeightMatrix& w, int64_t r0, int64_t r1, const uint8_t* xb,
                int64_t x_stride, int64_t n, float* y, int64_t y_stride) {
  if (prefetch_tuning().decode_streams >= 4) return in_streams<F, 4>(tiles, w, r0, r1, xb, x_stride, n, y, y_stride);
  in_streams<F, 2>(tiles, w, r0, r1, xb, x_stride, n, y, y_stride);
}

template <WeightFormat F>
struct ForFormat {
  template <int R, int T>
  struct Tile : InterleavedTile<F, R, T, _MM_HINT_T0> {};  // decode: prefetch_tuning().decode_ahead is into L1
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

// Batched decode (2-48 tokens, from 3 where two take the streams above; prefetch_tuning() says up
// to how many) walks a row group's columns in blocks, and within a block runs every tile over it:
// the group's rows in parts (the whole group of 4, or two halves of 2), each part with every token
// tile, so the block's weights come from DRAM for the first token tile and from cache for the
// others (a pass of several groups: below).
// The float sums of all tiles (1 KB each) wait across the blocks and are reduced once per group.
// Each dot product still adds its chunks in column order, so the result does not depend on the
// block size, the tile shape or the order of the tiles.
//
// Tiles are 4 rows x 4 tokens, or (prefetch_tuning().wide_batch_tiles, for 5 tokens or more) 2 rows
// x up to 8 tokens. On an Intel Xeon with AMX (session 44) a batch of 8 in 2 x 8 tiles reads each
// weight line once, where 4 x 4 tiles take it from DRAM and then again from L1: kernels_bench
// Batch8 from DRAM, 2 threads, q4 495-505 -> 535-565 GOP/s, q8 306-332 -> 353-369 (one core from
// cache the same: q4 ~355 either way), and E4B q4 batches of 8 50.6-50.8 -> 53.4-54.8 tok/s. 2 x 8
// holds its 16 accumulators beside 2 weight lines and one activation vector, and loads an
// activation vector for every 2 vpdpbusd (4 x 4: every 4), each once into a register: folded into
// both vpdpbusd as memory operands, as GCC had done, it ran ~8% slower from cache (docs/kernels.md,
// "Session 44"). Zen 4 had measured 2 x 8 far slower (see the dispatcher below); Zen 5 was not
// measured, so it keeps 4 x 4.
using ChunksFn = void (*)(const WeightMatrix& w, int64_t row, const uint8_t* xb, int64_t x_stride, int64_t ch0,
                         int64_t ch1, bool first, int64_t ahead, float* sums);
using StoreFn = void (*)(const float* sums, int64_t row, float* y, int64_t y_stride, bool accumulate);
constexpr int kMaxBatchTokens = 48, kMaxBatchTiles = 12, kMaxPassGroups = 8;  // 96 KB of sums
constexpr int64_t kTileSums = 16 * 16;  // floats per tile: R x T <= 16 accumulators of 16 lanes
constexpr int64_t kL1ActivationBytes = 32 << 10;
constexpr int64_t kL1TokenTilesBytes = 40 << 10;  // what a block's activations may take of L1 (48 KB on the Xeon)

// Every tile of at most Rows rows and Tokens tokens: chunks[r - 1][t - 1] for r rows and t tokens.
template <int Rows, int Tokens>
struct BatchTiles {
  static_assert(Rows * Tokens * 16 <= kTileSums);
  ChunksFn chunks[Rows][Tokens];
  StoreFn store[Rows][Tokens];
};

template <WeightFormat F, int Hint, int Rows, int Tokens, int R, int... Ts>
void fill_batch_row(BatchTiles<Rows, Tokens>& b, std::integer_sequence<int, Ts...>) {
  ((b.chunks[R - 1][Ts] = &InterleavedTile<F, R, Ts + 1, Hint>::chunks,
    b.store[R - 1][Ts] = &InterleavedTile<F, R, Ts + 1, Hint>::store),
   ...);
}

template <WeightFormat F, int Hint, int Rows, int Tokens, int... Rs>
BatchTiles<Rows, Tokens> make_batch_tiles(std::integer_sequence<int, Rs...>) {
  BatchTiles<Rows, Tokens> b{};
  (fill_batch_row<F, Hint, Rows, Tokens, Rs + 1>(b, std::make_integer_sequence<int, Tokens>{}), ...);
  return b;
}

// One shape's tiles, with their prefetches into L1 or L2 (prefetch_tuning().batch_into_l1).
template <WeightFormat F, int Rows, int Tokens>
const BatchTiles<Rows, Tokens>& batch_tiles() {
  static const auto into_l2 =
      make_batch_tiles<F, _MM_HINT_T1, Rows, Tokens>(std::make_integer_sequence<int, Rows>{});
  static const auto into_l1 =
      make_batch_tiles<F, _MM_HINT_T0, Rows, Tokens>(std::make_integer_sequence<int, Rows>{});
  return prefetch_tuning().batch_into_l1 ? into_l1 : into_l2;
}

// Columns go in blocks of at most 4 Q8 chunks (2048 columns: a 4-row tile's 8.5 KB of weights and
// a token tile's 10 KB of activations) or 5 Q4 chunks (5.6 KB and 12.8 KB), split evenly.
// - Whole rows of 10240 columns keep 51 KB of activations per token tile, more than L1. Zen 5, 8
//   tokens, 2 threads from DRAM (kernels_bench Batch8, GFLOP/s, runs alternated): Q4 2560 x 10240
//   585 with whole rows against 795 in blocks of 4; 10240 x 2560 the same; Q8 the same either way
//   (it waits on memory). Zen 4 had measured Q8 blocks of 4 at 0.72-0.93 of the time of whole rows
//   and Q4 0.99-1.05. E4B q4 batches of 8 (bench, steps alternated A-B-B-A in one process, against
//   the same harness with both sides alike): 3-8% more tokens/s.
// - 2560 columns (most of E4B's matrices) make Q8 blocks of 3 and 2 chunks, rather than 4 and 1,
//   and one Q4 block: Q4 in blocks of 3 and 2 made twice the tile calls and first-chunk stores
//   (Zen 5, one core, 8 tokens, both alternated A-B-B-A in one process: 10240 x 2560 1.05x from L2
//   and from DRAM with one block, 2560 x 10240 unchanged (0.99); E4B q4 batches of 8, steps alternated
//   likewise: 1.00-1.05x, median 1.036, against ~1.01 for the harness against itself). Q8 in
//   blocks of 5 read 0.94x from DRAM: 10 KB of weights beside 26 KB of activations crowd L1.
template <WeightFormat F, int Rows, int Tokens>
void batched_matmul(const WeightMatrix& w, int64_t r0, int64_t r1, const uint8_t* xq, int64_t xq_stride, int64_t n,
                    float* y, int64_t y_stride) {
  static_assert((kMaxBatchTokens + Tokens - 1) / Tokens * (kInterleaveRows / Rows) <= kMaxBatchTiles,
                "a group's tiles fit sums");
  const BatchTiles<Rows, Tokens>& tiles = batch_tiles<F, Rows, Tokens>();
  const int64_t chunks = w.cols / kInterleaveChunk;
  constexpr int64_t kMaxBlockChunks = F == WeightFormat::Q4 ? 5 : 4;
  const int64_t blocks = (chunks + kMaxBlockChunks - 1) / kMaxBlockChunks, block = (chunks + blocks - 1) / blocks;
  // The same rows of the next group at the same columns are prefetched beside each load.
  const int64_t next_group = kInterleaveRows * (w.row_stride + w.scale_stride);
  // Where the tokens' activations outgrow L1 (E4B's down projection: 8 x 12.8 KB), each column
  // block runs over a pass of several row groups, so that its activations are read from L2 once
  // per pass rather than once per group (Zen 5, Batch8 2560 x 10240, 2 threads from DRAM, GOP/s,
  // runs alternated: Q4 631-774 -> 736-907 with 8 groups, 743-877 with 4; Q8 479-548 -> 585-706;
  // E4B batches of 8, steps alternated A-B-B-A in one process: Q4 1.06-1.11x, Q8 1.07-1.24x).
  // Rows whose activations fit stay one group at a time: passes made 10240 x 2560 slower (Q4
  // 772-887 -> 710-804, Q8 649-703 -> 434-587). In a pass the next group's lines, prefetched
  // beside each load, are the next ones it reads (one tile's work ahead; those of a pass's last
  // group wait a whole block of the pass); the distance was not tuned again.
  const int pass_groups = n * xq_stride > kL1ActivationBytes ? kMaxPassGroups : 1;
  // Token tiles of at most Tokens, as even as they come (9 tokens in tiles of 8: 5 and 4).
  const int token_tiles = int((n + Tokens - 1) / Tokens), tile_tokens = int((n + token_tiles - 1) / token_tiles);
  // Where all the tokens' activations of a block outgrow L1, each token tile runs over all the
  // pass's groups before the next one starts (a round per token tile): its activations stay in L1
  // and the pass's weights (up to 8 x 8.7 KB) come back from L2, where the tiles of a group in turn
  // took every token tile's activations from L2. Intel Xeon, kernels_bench Batch16-40 (10240 x 2560
  // and 2560 x 10240, two threads from DRAM, alternated, us): q4 16 tokens 1637-1801 -> 1354-1499,
  // 32 tokens 2999-3287 -> 2546-2791, q8 32 tokens 3452-3535 -> 2787-3403. Below that the group's
  // tiles in turn stay: E4B batches of 12 ran 2-4% slower in rounds (q8 41.2-42.5 -> 38.6-40.6 tok/s).
  // Batches of up to 15, which every CPU takes here, keep that order too: rounds were not measured
  // for them.
  const bool rounds = n > 15 && n * block * kChunkBytesX > kL1TokenTilesBytes;
  const int token_rounds = rounds ? token_tiles : 1, round_tiles = rounds ? 1 : token_tiles;
  const int tiles_per_group = token_tiles * (kInterleaveRows / Rows);
  alignas(64) float sums[kMaxPassGroups * kMaxBatchTiles * kTileSums];
  // Calls fn(tile, first row, rows, first token, tokens) for each tile of a group's rows and token
  // tiles [tt0, tt1).
  const auto for_each_tile = [&](int64_t group_row, int group_rows, int tt0, int tt1, auto&& fn) {
    for (int part = 0; part < group_rows; part += Rows)
      for (int tt = tt0; tt < tt1 && tt * int64_t(tile_tokens) < n; ++tt) {
        const int64_t t = tt * int64_t(tile_tokens);
        fn(part / Rows * token_tiles + tt, group_row + part, std::min(Rows, group_rows - part), t,
           int(std::min<int64_t>(tile_tokens, n - t)));
      }
  };
  for (int64_t r = r0; r < r1;) {
    int64_t first_row[kMaxPassGroups];
    int rows[kMaxPassGroups];
    int groups = 0;
    for (int64_t g = r; g < r1 && groups < pass_groups; g += rows[groups++]) {
      first_row[groups] = g;
      rows[groups] = int(std::min<int64_t>(interleaved_group_rows(w, g) - g % kInterleaveRows, r1 - g));
    }
    const auto tile_sums = [&](int g, int tile) { return sums + kTileSums * (g * tiles_per_group + tile); };
    for (int64_t c0 = 0; c0 < chunks; c0 += block) {
      const int64_t c1 = std::min(chunks, c0 + block);
      for (int round = 0; round < token_rounds; ++round)
        for (int g = 0; g < groups; ++g)
          for_each_tile(first_row[g], rows[g], round * round_tiles, (round + 1) * round_tiles,
                        [&](int tile, int64_t row, int tr, int64_t t, int tt) {
                          tiles.chunks[tr - 1][tt - 1](w, row, xq + t * xq_stride, xq_stride, c0, c1, c0 == 0,
                                                       next_group, tile_sums(g, tile));
                        });
    }
    for (int g = 0; g < groups; ++g) {
      for_each_tile(first_row[g], rows[g], 0, token_tiles, [&](int tile, int64_t row, int tr, int64_t t, int tt) {
        tiles.store[tr - 1][tt - 1](tile_sums(g, tile), row, y + t * y_stride, y_stride, false);
      });
      r += rows[g];
    }
  }
}

template <WeightFormat F>
void batched_matmul(const WeightMatrix& w, int64_t r0, int64_t r1, const uint8_t* xq, int64_t xq_stride, int64_t n,
                    float* y, int64_t y_stride) {
  for (int64_t t0 = kMaxBatchTokens; t0 < n; t0 += kMaxBatchTokens)  // only reached if the panels' threshold moves
    batched_matmul<F>(w, r0, r1, xq + t0 * xq_stride, xq_stride, std::min<int64_t>(kMaxBatchTokens, n - t0),
                      y + t0 * y_stride, y_stride);
  n = std::min<int64_t>(n, kMaxBatchTokens);
  if (n > 4 && prefetch_tuning().wide_batch_tiles) return batched_matmul<F, 2, 8>(w, r0, r1, xq, xq_stride, n, y, y_stride);
  batched_matmul<F, kInterleaveRows, 4>(w, r0, r1, xq, xq_stride, n, y, y_stride);
}

}  // namespace

void avx512vnni_interleaved_matmul(const WeightMatrix& w, int64_t r0, int64_t r1, const uint8_t* xq,
                                   int64_t xq_stride, int64_t n, float* y, int64_t y_stride) {
  // One token: a tile is a whole row group, so it reads one sequential stream (see WeightLayout).
  static const TileSet q8_decode = make_tiles<WeightFormat::Q8, kInterleaveRows, 1>();
  static const TileSet q4_decode = make_tiles<WeightFormat::Q4, kInterleaveRows, 1>();
  // 2-15 tokens (batched decode; on Intel up to 48; on Zen 5 from 3): 4 rows (a row group) x 4
  // tokens, or 2 x 8 below. On Zen 4 (Batch8, 2 threads from DRAM, GOP/s) 4 x 4 beat 2 x 8, the
  // best on Zen 5 before the sums were reduced four at a time (Zen 5 measured 2 x 8 slower again in
  // session 54): q4 490-530 against 290-345, q8 380-390 against 300-345; 4 x 2, 5 x 4, 3 x 8 and
  // 1 x 8 were slower on one core. With groups of 16 rows, 4-row tiles (each reading a quarter of
  // every 1 KB) and 16-row tiles in 4-row sub-tiles were 7-30% slower in E4B batches of 8.
  const bool q4_format = w.format == WeightFormat::Q4;
  const int64_t stream_tokens = std::min<int64_t>(kMaxStreamTokens, prefetch_tuning().quant_stream_tokens);
  if (prefetch_tuning().decode_streams > 0 && n <= stream_tokens)
    return q4_format ? in_streams<WeightFormat::Q4>(q4_decode, w, r0, r1, xq, xq_stride, n, y, y_stride)
                     : in_streams<WeightFormat::Q8>(q8_decode, w, r0, r1, xq, xq_stride, n, y, y_stride);
  if (n == 1) return tiled_matmul(q4_format ? q4_decode : q8_decode, w, r0, r1, xq, xq_stride, n, y, y_stride);
  if (q4_format) return batched_matmul<WeightFormat::Q4>(w, r0, r1, xq, xq_stride, n, y, y_stride);
  batched_matmul<WeightFormat::Q8>(w, r0, r1, xq, xq_stride, n, y, y_stride);
}

}  // namespace tandem::cpu::detail

#pragma GCC diagnostic pop
#pragma GCC pop_options
