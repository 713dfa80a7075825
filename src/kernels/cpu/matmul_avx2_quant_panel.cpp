// AVX2 prefill matmul for quantized weights (Q8, Q4), many tokens at once: the AVX2 counterpart
// of matmul_avx512_vnni_panel.cpp (read that first), for CPUs without AVX512-VNNI.
//
// The register tiles of matmul_avx2_quant.cpp convert, scale and add every block's 8 int32 lanes
// one block at a time, with a scalar product of the two scales per block, row and token: more
// instructions than the multiplies themselves. Here both operands are rearranged so that lane j of
// every vector belongs to block j of an 8-block chunk (256 columns): vector k holds bytes
// [4k, 4k + 4) of each block. The int32 sums of a chunk's 8 blocks then build up in one
// accumulator, and one convert + scale + add follows per chunk, row and token.
//   Q8: vpmaddubsw(|w|, sign(x, w)) (|w| <= 128 as unsigned, and |x| <= 127 never overflows when
//       negated; pairs stay below 2^15), vpmaddwd with ones, add: four instructions per 32
//       multiply-adds (|x| with w's sign would fail on w = -128);
//   Q4: the unpacked nibble (q + 8, 0..15) times x, vpmaddubsw results added as int16 over the
//       whole chunk, starting from the activations' word corrections (-8 x the sum of the codes
//       each word accumulates, q4_word_corrections), one vpmaddwd per chunk: two instructions per
//       32 multiply-adds.
// The weights are rearranged ("packed") a block of rows at a time into a thread-local panel that
// stays in L2 while every token tile passes over it. Weights in WeightLayout::Interleaved already
// have this order (a 64-byte vector there is two of ours), so their panels are copies; fewer than
// 16 tokens read them in place (matmul_avx2_interleaved.cpp). The loop over panels and tiles is
// avx2_quant_panel_tiles.h, which the AVX-VNNI tiles (matmul_avxvnni_panel.cpp) share.
//
// Activation layout (per token): the VNNI panels' (640 bytes per 512 columns, zero past cols),
//   so that one layout serves these panels and the tiles of interleaved weights:
//   8 x 64 codes (vector k, lane j: codes [4k, 4k + 4) of block j of 16) | 16 float scales |
//   16 corrections (Q4: two int16 words per block, q4_word_corrections; 0 for Q8; for the AVX-VNNI
//   kernels instead -8 x each block's code sum as an int32, PanelCorrections). A 256-column
//   chunk of the panels is one 32-byte half of it: chunk c starts at 640 (c / 2) + 32 (c % 2), its
//   vector k 64 k further on, its scales at + 512 and its corrections at + 576.
// Weight panel (per row, 288 bytes per 256-column chunk): 8 x 32 codes in the same order (Q8
//   signed, or q + 128 for the AVX-VNNI tiles; Q4 unsigned 0..15) | 8 float scales.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "kernels/cpu/isa_kernels.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

#include "kernels/cpu/avx2_quant_helpers.h"
#include "kernels/cpu/avx2_quant_panel_tiles.h"

namespace tandem::cpu::detail {

namespace {

// Measured on Zen 3 (prefill of 512 tokens, one core, GOP/s): Q4 3 x 3 103-131, 2 x 4 87, 4 x 2
// 98-105, 3 x 4 101, 2 x 6 94, 4 x 3 78; Q8 3 x 3 76-108 (it spills a register), 2 x 4 65-104,
// 2 x 3 98, 3 x 2 79, 2 x 5 65.
constexpr int kTileRows = 3, kTileTokens = 3;

// v[j] = the 8 dwords of block j; afterwards v[k] = dword k of every block (lane j: block j).
void transpose8x8(__m256i (&v)[8]) {
  __m256i t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_epi32(v[i], v[i + 1]);
    t[i + 1] = _mm256_unpackhi_epi32(v[i], v[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
    u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
    u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
    u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int k = 0; k < 4; ++k) {
    v[k] = _mm256_permute2x128_si256(u[k], u[k + 4], 0x20);
    v[k + 4] = _mm256_permute2x128_si256(u[k], u[k + 4], 0x31);
  }
}

// Q4's correction of one block as the initial value of its two int16 accumulator words: a block's
// lane of vector k holds its columns 4k..4k+3, and vpmaddubsw adds columns 4k, 4k + 1 into the low
// word and 4k + 2, 4k + 3 into the high one, so over the 8 vectors each word sums 16 columns. Each
// word starts at -8 x the sum of its 16 codes, and so ends at the sum of (q + 8 - 8) x over them,
// within +-16 x 8 x 127 = 16256 (vpaddw wraps, so partial sums may leave int16 on the way): the
// block's int32 sum is then one vpmaddwd with ones, with no correction left to add.
int32_t q4_word_corrections(__m256i codes) {
  const __m256i pairs = _mm256_maddubs_epi16(_mm256_set1_epi8(1), codes);  // word i: codes 2i + 2i+1
  __m128i s = _mm_add_epi16(_mm256_castsi256_si128(pairs), _mm256_extracti128_si256(pairs, 1));
  s = _mm_add_epi16(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi16(s, _mm_shuffle_epi32(s, 0xb1));  // low word: columns 4k, 4k+1; high: 4k+2, 4k+3
  s = _mm_mullo_epi16(s, _mm_set1_epi16(-8));
  return _mm_cvtsi128_si32(s);
}

void quantize_token(WeightFormat format, int64_t cols, const float* x, uint8_t* out, PanelCorrections kind) {
  const int64_t blocks = cols / kQuantBlock;
  for (int64_t ch = 0; ch < chunk_count(cols); ++ch) {  // one half of a 512-column chunk
    uint8_t* o = out + ch / 2 * kActivationChunkBytes + ch % 2 * 32;
    float* scales = reinterpret_cast<float*>(o + kActivationScales);
    int32_t* corrections = reinterpret_cast<int32_t*>(o + kActivationCorrections);
    __m256i codes[8];
    for (int64_t j = 0; j < kChunkBlocks; ++j) {
      const int64_t b = ch * kChunkBlocks + j;
      if (b >= blocks) {  // a last, partial chunk: zero codes, scales and corrections
        codes[j] = _mm256_setzero_si256();
        scales[j] = 0.0f;
        corrections[j] = 0;
        continue;
      }
      const QuantizedBlock q = quantize_block(x + b * kQuantBlock);
      codes[j] = q.codes;
      scales[j] = q.scale;
      if (kind == PanelCorrections::DpbusdBlockSums) corrections[j] = -8 * q.sum;
      else corrections[j] = format == WeightFormat::Q4 ? q4_word_corrections(q.codes) : 0;
    }
    transpose8x8(codes);
    for (int k = 0; k < 8; ++k) _mm256_store_si256((__m256i*)(o + kActivationVectorBytes * k), codes[k]);
  }
  if (chunk_count(cols) % 2) {  // the unused half of the last 512-column chunk
    uint8_t* o = out + chunk_count(cols) / 2 * kActivationChunkBytes + 32;
    for (int k = 0; k < 8; ++k) _mm256_store_si256((__m256i*)(o + kActivationVectorBytes * k), _mm256_setzero_si256());
    _mm256_store_si256((__m256i*)(o + kActivationScales), _mm256_setzero_si256());
    _mm256_store_si256((__m256i*)(o + kActivationCorrections), _mm256_setzero_si256());
  }
}

// Packs rows [r0, r1), chunks [ch0, ch0 + nc) of w (Interleaved) into the panel: a panel chunk
// is one 32-byte half of each 64-byte vector of an interleaved chunk (blocks 0-7 or 8-15), so this
// is a copy; Q8 codes go back to signed, and Q4's vectors k and k + 4 are one vector's low and
// high nibbles. A row group at a time, its vectors in address order: row by row, the reads jumped
// through each group and packing took a third of a 16-token Q8 matmul (`kernels_bench
// Prefill/q8i`, TANDEM_BENCH_TOKENS=16, two Zen 3 cores: 80-111 against 116-133 GOP/s from plain
// weights; now 131-140 against 121-152).
void pack_interleaved_panel(const WeightMatrix& w, int64_t r0, int64_t r1, int64_t ch0, int64_t nc, uint8_t* panel,
                            bool q8_offset) {
  const __m256i nibble = _mm256_set1_epi8(0x0f), flip = _mm256_set1_epi8(char(0x80));
  const bool q8 = w.format == WeightFormat::Q8;
  const int64_t vectors = q8 ? 8 : 4, row_chunk_bytes = interleaved_chunk_row_bytes(w.format);
  for (int64_t g0 = r0 / kInterleaveRows * kInterleaveRows; g0 < r1; g0 += kInterleaveRows) {
    const int64_t rows = interleaved_group_rows(w, g0);
    const int64_t i0 = std::max<int64_t>(r0 - g0, 0), i1 = std::min(rows, r1 - g0);
    const uint8_t* group = interleaved_group_chunk(w, g0, 0);
    for (int64_t c = 0; c < nc; ++c) {
      const int64_t ch = ch0 + c;
      const uint8_t* codes = group + ch / 2 * rows * row_chunk_bytes + 32 * (ch % 2);
      uint8_t* out = panel + (g0 - r0) * nc * kWeightChunkBytes + c * kWeightChunkBytes;
      for (int64_t k = 0; k < vectors; ++k)
        for (int64_t i = i0; i < i1; ++i) {
          const __m256i v = _mm256_loadu_si256((const __m256i*)(codes + 64 * (k * rows + i)));
          uint8_t* o = out + i * nc * kWeightChunkBytes;
          if (q8) {
            _mm256_store_si256((__m256i*)(o + 32 * k), q8_offset ? v : _mm256_xor_si256(v, flip));
          } else {
            _mm256_store_si256((__m256i*)(o + 32 * k), _mm256_and_si256(v, nibble));
            _mm256_store_si256((__m256i*)(o + 32 * (k + 4)), _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble));
          }
        }
      const uint8_t* scales = codes - 32 * (ch % 2) + 64 * vectors * rows + 16 * (ch % 2);
      for (int64_t i = i0; i < i1; ++i)
        _mm256_store_ps(reinterpret_cast<float*>(out + i * nc * kWeightChunkBytes + 256),
                        _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(scales + 32 * i))));
    }
  }
}

}  // namespace

void avx2_pack_quant_panel(const WeightMatrix& w, int64_t r0, int64_t r1, int64_t ch0, int64_t nc, uint8_t* panel,
                           bool q8_offset) {
  if (w.layout == WeightLayout::Interleaved) return pack_interleaved_panel(w, r0, r1, ch0, nc, panel, q8_offset);
  const __m256i nibble = _mm256_set1_epi8(0x0f), flip = _mm256_set1_epi8(char(0x80));
  const int64_t block_bytes = w.format == WeightFormat::Q4 ? 16 : 32;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w.data + r * w.row_stride;
    const uint8_t* row_scales = w.scales + r * w.scale_stride;
    uint8_t* prow = panel + (r - r0) * nc * kWeightChunkBytes;
    for (int64_t c = 0; c < nc; ++c) {
      const int64_t ch = ch0 + c;
      const int64_t blocks = std::min<int64_t>(kChunkBlocks, w.cols / kQuantBlock - ch * kChunkBlocks);
      const uint8_t* src = row + ch * kChunkBlocks * block_bytes;
      const uint8_t* src_scales = row_scales + ch * kChunkBlocks * 2;
      alignas(32) uint8_t tail[256];
      alignas(16) uint8_t tail_scales[16];
      if (blocks < kChunkBlocks) {  // never read past the row
        std::memset(tail, 0, sizeof tail);
        std::memset(tail_scales, 0, sizeof tail_scales);
        std::memcpy(tail, src, size_t(blocks * block_bytes));
        std::memcpy(tail_scales, src_scales, size_t(blocks * 2));
        src = tail;
        src_scales = tail_scales;
      }
      uint8_t* o = prow + c * kWeightChunkBytes;
      __m256i v[8];
      if (w.format == WeightFormat::Q8) {
        for (int j = 0; j < 8; ++j) {
          v[j] = _mm256_loadu_si256((const __m256i*)(src + 32 * j));
          if (q8_offset) v[j] = _mm256_xor_si256(v[j], flip);
        }
      } else {
        // Byte i of a block holds column 2i (low nibble) and 2i + 1 (high): unpacked in column
        // order, then transposed as Q8.
        for (int j = 0; j < 8; ++j) {
          const __m128i b = _mm_loadu_si128((const __m128i*)(src + 16 * j));
          const __m128i lo = _mm_and_si128(b, _mm256_castsi256_si128(nibble));
          const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm256_castsi256_si128(nibble));
          v[j] = _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
        }
      }
      transpose8x8(v);
      for (int k = 0; k < 8; ++k) _mm256_store_si256((__m256i*)(o + 32 * k), v[k]);
      _mm256_store_ps(reinterpret_cast<float*>(o + 256), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)src_scales)));
    }
  }
}

namespace {

template <int R, int T>
struct Q8PanelTile {
  template <bool First>
  static void chunk(const uint8_t* wc, int64_t prb, const uint8_t* xc, int64_t x_stride, float* sums) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc[R][T];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_si256();
#pragma GCC unroll 1  // unrolled, GCC computes the products first and spills them
    for (int k = 0; k < 8; ++k) {
      __m256i wv[R], aw[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        wv[r] = _mm256_load_si256((const __m256i*)(wc + r * prb + 32 * k));
        aw[r] = _mm256_abs_epi8(wv[r]);
      }
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        const __m256i xv = _mm256_load_si256((const __m256i*)(xc + t * x_stride + kActivationVectorBytes * k));
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          acc[r][t] = add_signed_products(acc[r][t], aw[r], wv[r], xv, ones);
        }
      }
    }
    scale_chunk<First>(wc, prb, xc, x_stride, acc, sums);
  }
};

template <int R, int T>
struct Q4PanelTile {
  template <bool First>
  static void chunk(const uint8_t* wc, int64_t prb, const uint8_t* xc, int64_t x_stride, float* sums) {
    __m256i acc[R][T];  // int16 pairs of each block over the chunk, from the word corrections
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const __m256i corr = _mm256_load_si256((const __m256i*)(xc + t * x_stride + kActivationCorrections));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r][t] = corr;
    }
#pragma GCC unroll 1  // as above
    for (int k = 0; k < 8; ++k) {
      __m256i wv[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) wv[r] = _mm256_load_si256((const __m256i*)(wc + r * prb + 32 * k));
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        const __m256i xv = _mm256_load_si256((const __m256i*)(xc + t * x_stride + kActivationVectorBytes * k));
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) acc[r][t] = add_products(acc[r][t], wv[r], xv);
      }
    }
    const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) acc[r][t] = _mm256_madd_epi16(acc[r][t], ones);
    scale_chunk<First>(wc, prb, xc, x_stride, acc, sums);
  }
};

}  // namespace

int64_t avx2_panel_stride(int64_t cols) {
  return (cols + kActivationChunkCols - 1) / kActivationChunkCols * kActivationChunkBytes;
}

void avx2_panel_quantize(WeightFormat format, int64_t cols, const float* x, uint8_t* out, PanelCorrections kind) {
  quantize_token(format, cols, x, out, kind);
}

void avx2_panel_matmul(const WeightMatrix& w, int64_t r0, int64_t r1, const uint8_t* xq, int64_t xq_stride, int64_t n,
                       float* y, int64_t y_stride) {
  static const auto q8 = make_panel_tiles<Q8PanelTile, kTileRows, kTileTokens>();
  static const auto q4 = make_panel_tiles<Q4PanelTile, kTileRows, kTileTokens>();
  panel_matmul(w.format == WeightFormat::Q4 ? q4 : q8, false, w, r0, r1, xq, xq_stride, n, y, y_stride);
}

}  // namespace tandem::cpu::detail

#pragma GCC pop_options
