// AVX2 matmul for quantized weights (Q8, Q4), also used by the AVX-512 table on CPUs without
// AVX512-VNNI, and by the AVX-VNNI table for plain weights and 1-15 tokens. Activations are quantized once per call to int8 per block of 32 (scale max|x|/127).
// vpmaddubsw multiplies unsigned by signed bytes and saturates pairs at int16, so:
//   Q8: |w| times x with w's sign moved onto x (|w| <= 128, |x| <= 127: pairs stay below 2^15),
//   Q4: the stored nibble (q + 8, 0..15) times x, minus 8 * sum(x) per block, added exactly as a
//       precomputed int32 correction vector.
// Each block's int32 sum is scaled by weight scale x activation scale and summed in float32.
//
// Activation layout (per token):
//   Q8: cols codes | cols/32 float scales
//   Q4: per pair of blocks 128 bytes: the 16 even-column codes of each block (32 bytes, matching
//       the low nibbles of the pair's 32 weight bytes), then the odd ones (the high nibbles), then
//       8 int32 corrections (-8 * sum of codes) and 8 float scales, each repeated over the 4 lanes
//       of its block; an odd last block pairs with zeros
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/tiled_matmul.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

#include "kernels/cpu/avx2_quant_helpers.h"

namespace tandem::cpu::detail {

namespace {


int64_t round_up_64(int64_t v) { return (v + 63) / 64 * 64; }
int64_t q8_scales_offset(int64_t cols) { return cols; }

void quantize_token_q8(int64_t cols, const float* x, uint8_t* out) {
  float* scales = reinterpret_cast<float*>(out + q8_scales_offset(cols));
  for (int64_t blk = 0; blk < cols / kQuantBlock; ++blk) {
    const QuantizedBlock b = quantize_block(x + blk * kQuantBlock);
    _mm256_storeu_si256((__m256i*)(out + blk * kQuantBlock), b.codes);
    scales[blk] = b.scale;
  }
}

constexpr int64_t kQ4PairBytes = 128;
int64_t q4_pair_count(int64_t cols) { return (cols / kQuantBlock + 1) / 2; }

void quantize_token_q4(int64_t cols, const float* x, uint8_t* out) {
  if ((cols / kQuantBlock) % 2)  // an odd last block pairs with zeros
    std::memset(out + (q4_pair_count(cols) - 1) * kQ4PairBytes, 0, size_t(kQ4PairBytes));
  const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10,
                                         12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  for (int64_t blk = 0; blk < cols / kQuantBlock; ++blk) {
    const QuantizedBlock b = quantize_block(x + blk * kQuantBlock);
    const __m256i halves = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(b.codes, split), 0xd8);  // even | odd
    uint8_t* pair = out + (blk / 2) * kQ4PairBytes;
    const int64_t half = blk % 2;
    _mm_storeu_si128((__m128i*)(pair + 16 * half), _mm256_castsi256_si128(halves));
    _mm_storeu_si128((__m128i*)(pair + 32 + 16 * half), _mm256_extracti128_si256(halves, 1));
    _mm_storeu_si128((__m128i*)(pair + 64 + 16 * half), _mm_set1_epi32(-8 * b.sum));
    _mm_storeu_ps((float*)(pair + 96) + 4 * half, _mm_set1_ps(b.scale));
  }
}

float weight_scale(const uint8_t* scales, int64_t block) {
  uint16_t h;
  std::memcpy(&h, scales + 2 * block, 2);
  return _cvtsh_ss(h);
}

// Decode: warm the next row tile's bytes and scales (see matmul_avx512_vnni.cpp).
void prefetch(const uint8_t* p) { _mm_prefetch((const char*)p, _MM_HINT_T1); }

template <int R>
void prefetch_next_scales(const WeightMatrix& w, const uint8_t* const (&sp)[R]) {
  for (int r = 0; r < R; ++r)
    for (int64_t b = 0; b < w.scale_stride; b += 64) prefetch(sp[r] + R * w.scale_stride + b);
}

template <int R, int T>
void store_tile(__m256 (&acc)[R][T], int64_t row, float* y, int64_t y_stride, bool accumulate) {
  for (int t = 0; t < T; ++t) {
    float* out = y + t * y_stride + row;
    for (int r = 0; r < R; ++r) {
      const float s = hsum(acc[r][t]);
      out[r] = accumulate ? out[r] + s : s;
    }
  }
}

// Q8 rows x tokens over segments of up to 64 blocks: the products of the weight and token scales
// of a segment's blocks are computed 8 at a time into a table first, so that a block's loop is
// the integer dot product, a convert and an FMA with its scale broadcast from the table. These are
// the same float products as a scalar multiply per block, which with its scalar f16 convert and
// broadcast took more instructions than the dot product itself. The accumulators live in
// registers within a segment only: with them live across the table's loop, GCC stored every one of
// them to the stack on every block.
template <int R, int T>
struct Q8Tile {
  static constexpr int64_t kSegmentBlocks = 64;

  static void run(const WeightMatrix& w, int64_t row, const uint8_t* xb, int64_t x_stride, int64_t k0, int64_t k1,
                  float* y, int64_t y_stride, bool accumulate, bool prefetch_next) {
    const uint8_t* wp[R];
    const uint8_t* sp[R];
    for (int r = 0; r < R; ++r) {
      wp[r] = w.data + (row + r) * w.row_stride + k0;
      sp[r] = w.scales + (row + r) * w.scale_stride + k0 / kQuantBlock * 2;
    }
    const uint8_t* xp[T];
    const float* xs[T];
    for (int t = 0; t < T; ++t) {
      xp[t] = xb + t * x_stride + k0;
      xs[t] = reinterpret_cast<const float*>(xb + t * x_stride + q8_scales_offset(w.cols)) + k0 / kQuantBlock;
    }
    if (prefetch_next) {
      const uint8_t* row_scales[R];
      for (int r = 0; r < R; ++r) row_scales[r] = w.scales + (row + r) * w.scale_stride;
      prefetch_next_scales<R>(w, row_scales);
    }
    alignas(32) float scale[R][T][kSegmentBlocks];
    __m256 sums[R][T];
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) sums[r][t] = _mm256_setzero_ps();
    const int64_t blocks = (k1 - k0) / kQuantBlock;
    for (int64_t s0 = 0; s0 < blocks; s0 += kSegmentBlocks) {
      const int64_t nb = std::min(kSegmentBlocks, blocks - s0);
      fill_scales(sp, xs, s0, nb, scale);
      if (prefetch_next)
        segment<true>(wp, xp, s0, nb, scale, R * w.row_stride, sums);
      else
        segment<false>(wp, xp, s0, nb, scale, 0, sums);
    }
    store_tile<R, T>(sums, row, y, y_stride, accumulate);
  }

  static void fill_scales(const uint8_t* const (&sp)[R], const float* const (&xs)[T], int64_t s0, int64_t nb,
                          float (&scale)[R][T][kSegmentBlocks]) {
    int64_t b = 0;
    for (; b + 8 <= nb; b += 8)
      for (int r = 0; r < R; ++r) {
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(sp[r] + 2 * (s0 + b))));
        for (int t = 0; t < T; ++t) _mm256_store_ps(scale[r][t] + b, _mm256_mul_ps(dw, _mm256_loadu_ps(xs[t] + s0 + b)));
      }
    for (; b < nb; ++b)  // never read past the row's scales
      for (int r = 0; r < R; ++r)
        for (int t = 0; t < T; ++t) scale[r][t][b] = weight_scale(sp[r], s0 + b) * xs[t][s0 + b];
  }

  // Prefetch: warm the next row tile (next_tile bytes further on) a line per row every two blocks,
  // spread over the loop (all of a segment's lines at once measured slower from DRAM).
  template <bool Prefetch>
  static void segment(const uint8_t* const (&wp)[R], const uint8_t* const (&xp)[T], int64_t s0, int64_t nb,
                      const float (&scale)[R][T][kSegmentBlocks], int64_t next_tile, __m256 (&sums)[R][T]) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[R][T];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) acc[r][t] = sums[r][t];
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t c = (s0 + b) * kQuantBlock;
      if constexpr (Prefetch)
        if (c % 64 == 0)
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) prefetch(wp[r] + next_tile + c);
      __m256i wv[R], aw[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        wv[r] = _mm256_loadu_si256((const __m256i*)(wp[r] + c));
        aw[r] = _mm256_abs_epi8(wv[r]);
      }
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        const __m256i xv = _mm256_loadu_si256((const __m256i*)(xp[t] + c));
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw[r], _mm256_sign_epi8(xv, wv[r])), ones);
          acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcast_ss(&scale[r][t][b]), acc[r][t]);
        }
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) sums[r][t] = acc[r][t];
  }
};

// Q4 rows in groups of four for one token, on the pair layout: a row's 32 bytes (two blocks) take
// two vpmaddubsw, one add and one vpmaddwd, leaving 4 int32 lanes per block; a transposing add tree
// then leaves lane 4h + r = row r's sum of the pair's block h, so the correction, the convert, the
// scale product and the FMA serve four rows, and the rows' f16 scale pairs come in by one shuffle.
// Tiles of R < 4 (or 5-7) rows compute the missing rows of their last group again on its last row
// and do not store them. Batches and prefill call it once per token as well: a row tile's weights
// then come from L1/L2 after the first token, and that measured faster than 2 x 3 tiles on a
// per-block layout (two Zen 4 cores, 8 tokens from DRAM 102-129 -> 137-161 GOP/s, 512 tokens
// 141-145 -> 186-202).
template <int R, int T>
struct Q4Tile {
  static_assert(T == 1, "one token");
  static constexpr int kGroups = (R + 3) / 4;

  template <bool Full>
  static void pair(const uint8_t* const (&wp)[4], const uint8_t* const (&sp)[4], const uint8_t* xg, __m256& acc) {
    const __m256i nibble = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    const __m256i xe = _mm256_loadu_si256((const __m256i*)xg), xo = _mm256_loadu_si256((const __m256i*)(xg + 32));
    __m256i d[4];
    for (int r = 0; r < 4; ++r) {
      const __m256i v = Full ? _mm256_loadu_si256((const __m256i*)wp[r])
                             : _mm256_castsi128_si256(_mm_loadu_si128((const __m128i*)wp[r]));
      const __m256i lo = _mm256_and_si256(v, nibble), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
      // Pairs of products stay within int16: 2 x 15 x 127 each, 7620 for both.
      d[r] = _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(lo, xe), _mm256_maddubs_epi16(hi, xo)), ones);
    }
    const __m256i t01 = _mm256_add_epi32(_mm256_unpacklo_epi32(d[0], d[1]), _mm256_unpackhi_epi32(d[0], d[1]));
    const __m256i t23 = _mm256_add_epi32(_mm256_unpacklo_epi32(d[2], d[3]), _mm256_unpackhi_epi32(d[2], d[3]));
    __m256i sums = _mm256_add_epi32(_mm256_unpacklo_epi64(t01, t23), _mm256_unpackhi_epi64(t01, t23));
    sums = _mm256_add_epi32(sums, _mm256_loadu_si256((const __m256i*)(xg + 64)));
    // Dword r: row r's two f16 scales (the second is zero past the columns); lane 4h + r wants word 2r + h.
    int32_t raw[4] = {0, 0, 0, 0};
    for (int r = 0; r < 4; ++r) std::memcpy(&raw[r], sp[r], Full ? 4 : 2);
    const __m128i order = _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
    const __m256 dw = _mm256_cvtph_ps(_mm_shuffle_epi8(_mm_loadu_si128((const __m128i*)raw), order));
    const __m256 dx = _mm256_loadu_ps((const float*)(xg + 96));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(dw, dx), acc);
  }

  static void run(const WeightMatrix& w, int64_t row, const uint8_t* xb, int64_t, int64_t k0, int64_t k1, float* y,
                  int64_t, bool accumulate, bool prefetch_next) {
    const uint8_t* wp[kGroups][4];
    const uint8_t* sp[kGroups][4];
    for (int r = 0; r < 4 * kGroups; ++r) {
      const int64_t real = row + (r < R ? r : R - 1);
      wp[r / 4][r % 4] = w.data + real * w.row_stride + k0 / 2;
      sp[r / 4][r % 4] = w.scales + real * w.scale_stride + k0 / kQuantBlock * 2;
    }
    if (prefetch_next)
      for (int r = 0; r < R; ++r)
        for (int64_t b = 0; b < w.scale_stride; b += 64) prefetch(w.scales + (row + R + r) * w.scale_stride + b);
    __m256 acc[kGroups];
    for (auto& a : acc) a = _mm256_setzero_ps();
    const uint8_t* xg = xb + k0 / 64 * kQ4PairBytes;
    int64_t c = k0;
    for (; c + 64 <= k1; c += 64, xg += kQ4PairBytes) {
      for (int g = 0; g < kGroups; ++g) {
        if (prefetch_next && c % 128 == 0)  // a line per row every 128 columns, 2 tiles ahead
          for (int r = 0; r < 4 && 4 * g + r < R; ++r) prefetch(wp[g][r] + 2 * R * w.row_stride);
        pair<true>(wp[g], sp[g], xg, acc[g]);
        for (int r = 0; r < 4; ++r) wp[g][r] += 32, sp[g][r] += 4;
      }
    }
    if (c < k1)
      for (int g = 0; g < kGroups; ++g) pair<false>(wp[g], sp[g], xg, acc[g]);
    for (int g = 0; g < kGroups; ++g) {
      alignas(16) float sums[4];
      _mm_store_ps(sums, _mm_add_ps(_mm256_castps256_ps128(acc[g]), _mm256_extractf128_ps(acc[g], 1)));
      for (int r = 0; r < 4 && 4 * g + r < R; ++r) {
        float* out = y + row + 4 * g + r;
        *out = accumulate ? *out + sums[r] : sums[r];
      }
    }
  }
};

template <int R, int T>
TileSet make_q8_tiles() {
  TileSet set;
  fill_tiles<Q8Tile, R, T>(set);
  set.x_bytes_per_col = 1;
  set.k_align = kQuantBlock;
  return set;
}

template <int R>
TileSet make_q4_tiles() {
  TileSet set;
  fill_tiles<Q4Tile, R, 1>(set);
  set.x_bytes_per_col = 2;
  set.k_align = 2 * kQuantBlock;
  return set;
}

}  // namespace

// From kQuantPanelMinTokens (16) on, packing weight panels (matmul_avx2_quant_panel.cpp) pays for
// itself. Batches of 8 sequences ran faster through them too (Zen 3, two cores, E4B: q4 12.9-13.9
// -> 14.9-16.5 tok/s, q8 9.9-12.2 -> 11.1-12.8), but the panels add a dot product's blocks in
// another order than the one-token tiles, and a sequence's logits must not depend on what else is
// in its batch (as with the VNNI kernels, which switch at the same count).

int64_t avx2_activation_stride(const WeightMatrix& w, int64_t n) {
  const int64_t cols = w.cols;
  if (n >= kQuantPanelMinTokens || w.layout == WeightLayout::Interleaved) return avx2_panel_stride(cols);
  if (w.format == WeightFormat::Q4) return q4_pair_count(cols) * kQ4PairBytes;
  return round_up_64(q8_scales_offset(cols) + cols / kQuantBlock * 4);
}

void avx2_quantize_activations(const WeightMatrix& w, int64_t n, const float* x, int64_t x_stride, int64_t first,
                               int64_t count, uint8_t* out, int64_t out_stride) {
  for (int64_t i = first; i < first + count; ++i) {
    if (n >= kQuantPanelMinTokens || w.layout == WeightLayout::Interleaved)
      avx2_panel_quantize(w.format, w.cols, x + i * x_stride, out + i * out_stride);
    else if (w.format == WeightFormat::Q4)
      quantize_token_q4(w.cols, x + i * x_stride, out + i * out_stride);
    else
      quantize_token_q8(w.cols, x + i * x_stride, out + i * out_stride);
  }
}

void avx2_matmul_rows_quantized(const WeightMatrix& w, int64_t r0, int64_t r1, const uint8_t* xq, int64_t xq_stride,
                                int64_t n, float* y, int64_t y_stride) {
  // Q8: 2 x 4 tiles (8 accumulators, 2 weight vectors and their absolute values, the token's
  // vector, a product and a scale: 15 of the 16 ymm registers; a batch of 8 takes two token tiles,
  // and measured 5-10% faster than 2 x 3 on one Zen 3 core); one token streams 4 rows at once
  // instead, for more cache lines in flight (see matmul_avx512_vnni.cpp). Q4: 8 rows, one token
  // at a time.
  static const TileSet q8 = make_q8_tiles<2, 4>();
  static const TileSet q8_decode = make_q8_tiles<4, 1>();
  static const TileSet q4 = make_q4_tiles<8>();
  // Interleaved weights: tiles of up to 8 tokens over each row group (matmul_avx2_interleaved.cpp)
  // up to 15 tokens, then the panels packed from the row groups, as plain weights. Q8's tiles ran
  // 20-30% faster than the plain 2 x 4 tiles in batches (one Zen 3 core, `kernels_bench
  // Batch8/q8i` from cache: 67-84 against 57-64 GFLOP/s). Q4 took its tiles at every count until
  // the panels' asm steps made them faster (E4B q4 prefill of 512 tokens on two Zen 3 cores 34.9
  // and 38.3 -> 49.3 and 54.0 tok/s).
  if (w.layout == WeightLayout::Interleaved && n < kQuantPanelMinTokens)
    return avx2_interleaved_matmul(w, r0, r1, xq, xq_stride, n, y, y_stride);
  if (n >= kQuantPanelMinTokens) return avx2_panel_matmul(w, r0, r1, xq, xq_stride, n, y, y_stride);
  if (w.format == WeightFormat::Q4) return tiled_matmul(q4, w, r0, r1, xq, xq_stride, n, y, y_stride);
  tiled_matmul(n == 1 ? q8_decode : q8, w, r0, r1, xq, xq_stride, n, y, y_stride);
}

}  // namespace tandem::cpu::detail

#pragma GCC pop_options
