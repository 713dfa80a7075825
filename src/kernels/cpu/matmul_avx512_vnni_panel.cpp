// AVX-512 VNNI prefill matmul for quantized weights (Q8, Q4), many tokens at once.
//
// The decode kernels (matmul_avx512_vnni.cpp) must convert and scale every vpdpbusd result,
// because the 16 int32 lanes of one product belong to 2-4 different blocks. Here both operands are
// rearranged so that lane j of every vector belongs to block j of a 16-block chunk (512 columns):
// vector k holds bytes [4k, 4k + 4) of each block. Eight vpdpbusd then finish the 16 block sums of
// a chunk in one int32 accumulator, and one convert + scale + add follows per chunk and tile pair.
// The weights are rearranged ("packed") a block of rows at a time into a thread-local panel that
// stays in L2 while every token tile passes over it, so packing costs little per token; the
// activations are rearranged once, when they are quantized.
//
// Activation layout (per token, 640 bytes per 512-column chunk, zero past cols):
//   8 x 64 codes (vector k, lane j: codes [4k, 4k + 4) of block j) | 16 float scales | 16 int32
//   corrections (-offset * sum of codes of block j; offset 128 for Q8, whose weights are stored
//   as w + 128, and 8 for Q4, stored as q + 8).
// Weight panel (per row, 576 bytes per chunk): 8 x 64 unsigned codes, same order | 16 float scales.
// Weights already in WeightLayout::Interleaved are in this order and only need unpacking (Q4).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

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

constexpr int64_t kChunk = 512, kChunkBlocks = 16;
constexpr int64_t kActivationChunkBytes = 640, kWeightChunkBytes = 576;
// 16 int32 accumulators + 4 weights + 1 activation, leaving registers for the chunk's scaling.
// Measured on Zen 4 (prefill, two cores): 4 x 4 ~600 GOP/s, 4 x 5 ~570, 5 x 4 ~530, 4 x 6 ~470,
// 3 x 4 ~460.
constexpr int kTileRows = 4, kTileTokens = 4;
constexpr int64_t kTokenTileBytes = 24 << 10;  // a token tile's activations over a column chunk: L1
constexpr int64_t kPanelBytes = 256 << 10;     // the packed weights of a block of rows: L2

int64_t chunk_count(int64_t cols) { return (cols + kChunk - 1) / kChunk; }

// Lane j: the largest of the 16 lanes of m[j]. A tree of shuffles and maxima (46 instructions)
// instead of 16 horizontal reductions; the tree leaves block j in lane 4 (j % 4) + j / 4.
__m512 lane_maxima(const __m512 (&m)[16]) {
  __m512 halves[8], quarters[4], pairs[2];
  for (int i = 0; i < 8; ++i)  // 128-bit quarters [m(2i) 0|2, m(2i) 1|3, m(2i+1) 0|2, m(2i+1) 1|3]
    halves[i] = _mm512_max_ps(_mm512_shuffle_f32x4(m[2 * i], m[2 * i + 1], 0x44),
                              _mm512_shuffle_f32x4(m[2 * i], m[2 * i + 1], 0xee));
  for (int i = 0; i < 4; ++i)  // quarter q: four partial maxima of m(4i + q)
    quarters[i] = _mm512_max_ps(_mm512_shuffle_f32x4(halves[2 * i], halves[2 * i + 1], 0x88),
                                _mm512_shuffle_f32x4(halves[2 * i], halves[2 * i + 1], 0xdd));
  for (int i = 0; i < 2; ++i)  // quarter q: two partial maxima each of m(8i + q) and m(8i + 4 + q)
    pairs[i] = _mm512_max_ps(_mm512_shuffle_ps(quarters[2 * i], quarters[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(quarters[2 * i], quarters[2 * i + 1], 0xee));
  const __m512 tree = _mm512_max_ps(_mm512_shuffle_ps(pairs[0], pairs[1], 0x88),  // lane 4q + i: m(4i + q)
                                    _mm512_shuffle_ps(pairs[0], pairs[1], 0xdd));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(order, tree);
}

// The index for _mm512_permutex2var_epi32 that takes lane l from the first operand's lane
// first(l) when l < half, else from the second's lane first(l - half) (16 lanes each).
template <class Lane>
__m512i two_source_index(int half, Lane first) {
  alignas(64) int32_t idx[16];
  for (int l = 0; l < 16; ++l) idx[l] = l < half ? first(l) : 16 + first(l - half);
  return _mm512_load_si512(idx);
}

// The 16 x 8 dwords of codes (block j's dword k at 32 j + 4 k) as 8 vectors, vector k lane j:
// three rounds of two-source permutes that halve the blocks and double the dwords per vector.
void transpose_codes(const uint8_t* codes, uint8_t* out) {
  static const __m512i round1[2] = {  // 4 blocks x dwords [4h, 4h + 4): lane 4 b + d
      two_source_index(8, [](int l) { return 8 * (l / 4) + l % 4; }),
      two_source_index(8, [](int l) { return 8 * (l / 4) + 4 + l % 4; })};
  static const __m512i round2[2] = {  // 8 blocks x dwords [4h + 2g, 4h + 2g + 2): lane 2 b + d
      two_source_index(8, [](int l) { return 4 * (l / 2) + l % 2; }),
      two_source_index(8, [](int l) { return 4 * (l / 2) + 2 + l % 2; })};
  static const __m512i round3[2] = {  // 16 blocks x dword 4h + 2g + e: lane b
      two_source_index(8, [](int l) { return 2 * l; }), two_source_index(8, [](int l) { return 2 * l + 1; })};
  __m512i z[8], p[8], q[8];
  for (int i = 0; i < 8; ++i) z[i] = _mm512_load_si512(codes + 64 * i);  // blocks 2i, 2i + 1
  for (int i = 0; i < 4; ++i)
    for (int h = 0; h < 2; ++h) p[2 * i + h] = _mm512_permutex2var_epi32(z[2 * i], round1[h], z[2 * i + 1]);
  for (int i = 0; i < 2; ++i)
    for (int h = 0; h < 2; ++h)
      for (int g = 0; g < 2; ++g)
        q[4 * i + 2 * h + g] = _mm512_permutex2var_epi32(p[4 * i + h], round2[g], p[4 * i + 2 + h]);
  for (int h = 0; h < 2; ++h)
    for (int g = 0; g < 2; ++g)
      for (int e = 0; e < 2; ++e)
        _mm512_store_si512(out + 64 * (4 * h + 2 * g + e),
                           _mm512_permutex2var_epi32(q[2 * h + g], round3[e], q[4 + 2 * h + g]));
}

// One 512-column chunk, its 16 blocks side by side (a third of the time of quantizing block by
// block, each with two horizontal reductions, and transposing with gathers).
void quantize_whole_chunk(const float* x, int32_t offset, uint8_t* o) {
  __m512 block_max[16];
  for (int j = 0; j < 16; ++j)
    block_max[j] = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + 32 * j)), _mm512_abs_ps(_mm512_loadu_ps(x + 32 * j + 16)));
  const __m512 amax = lane_maxima(block_max);
  alignas(64) float inv[16];
  _mm512_store_ps(inv, _mm512_maskz_div_ps(_mm512_cmp_ps_mask(amax, _mm512_setzero_ps(), _CMP_GT_OQ),
                                           _mm512_set1_ps(127.0f), amax));
  _mm512_store_ps(reinterpret_cast<float*>(o + 512), _mm512_div_ps(amax, _mm512_set1_ps(127.0f)));
  alignas(64) int8_t codes[kChunk];
  for (int j = 0; j < 16; ++j) {
    const __m512 scale = _mm512_set1_ps(inv[j]);
    const __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 32 * j), scale));
    const __m512i qb = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 32 * j + 16), scale));
    _mm_store_si128((__m128i*)(codes + 32 * j), _mm512_cvtepi32_epi8(qa));
    _mm_store_si128((__m128i*)(codes + 32 * j + 16), _mm512_cvtepi32_epi8(qb));
  }
  transpose_codes(reinterpret_cast<const uint8_t*>(codes), o);
  __m512i sums = _mm512_setzero_si512();  // lane j: the sum of block j's codes
  for (int k = 0; k < 8; ++k) sums = _mm512_dpbusd_epi32(sums, _mm512_set1_epi8(1), _mm512_load_si512(o + 64 * k));
  _mm512_store_si512(o + 576, _mm512_mullo_epi32(sums, _mm512_set1_epi32(-offset)));
}

void quantize_token(WeightFormat format, int64_t cols, const float* x, uint8_t* out) {
  const int32_t offset = format == WeightFormat::Q4 ? 8 : 128;
  // A last, partial chunk is padded with zeros (Q8/Q4 rows are whole blocks): zero blocks quantize
  // to zero codes, scales and sums.
  alignas(64) float padded[kChunk];
  for (int64_t ch = 0; ch < chunk_count(cols); ++ch) {
    const float* xc = x + ch * kChunk;
    if ((ch + 1) * kChunk > cols) {
      std::fill(std::copy(xc, x + cols / kQuantBlock * kQuantBlock, padded), padded + kChunk, 0.0f);
      xc = padded;
    }
    quantize_whole_chunk(xc, offset, out + ch * kActivationChunkBytes);
  }
}

// Packs rows [r0, r1), chunks [ch0, ch0 + nc) of w into the panel (row i at panel + i * nc * 576).
void pack_panel(const WeightMatrix& w, int64_t r0, int64_t r1, int64_t ch0, int64_t nc, uint8_t* panel) {
  alignas(64) uint8_t codes[kChunk];
  const __m512i flip = _mm512_set1_epi8(char(0x80)), nibble = _mm512_set1_epi8(0x0f);
  const bool interleaved = w.layout == WeightLayout::Interleaved;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w.data + r * w.row_stride;
    const uint8_t* srow = w.scales + r * w.scale_stride;
    uint8_t* prow = panel + (r - r0) * nc * kWeightChunkBytes;
    for (int64_t c = 0; c < nc; ++c) {
      const int64_t ch = ch0 + c;
      const int64_t blocks = std::min<int64_t>(kChunkBlocks, (w.cols - ch * kChunk) / kQuantBlock);
      uint8_t* o = prow + c * kWeightChunkBytes;
      if (interleaved) {
        // Already in panel order (whole chunks only): Q8 is a copy, Q4 a mask and a shift.
        if (w.format == WeightFormat::Q8) {
          for (int k = 0; k < 8; ++k)
            _mm512_store_si512(o + 64 * k, _mm512_loadu_si512(interleaved_vector(w, r, ch, k)));
        } else {
          for (int k = 0; k < 4; ++k) {
            const __m512i v = _mm512_loadu_si512(interleaved_vector(w, r, ch, k));
            _mm512_store_si512(o + 64 * k, _mm512_and_si512(v, nibble));
            _mm512_store_si512(o + 64 * (k + 4), _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble));
          }
        }
      } else if (w.format == WeightFormat::Q8) {
        for (int64_t b = 0; b < kChunkBlocks; b += 2) {  // two blocks per 64-byte vector
          const int64_t valid = std::clamp<int64_t>(blocks - b, 0, 2);
          const __mmask64 m = valid == 2 ? ~__mmask64(0) : (valid == 1 ? __mmask64(0xffffffffu) : 0);
          _mm512_store_si512(codes + 32 * b,
                             _mm512_maskz_mov_epi8(m, _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, row + ch * kChunk + 32 * b), flip)));
        }
      } else {
        for (int64_t b = 0; b < kChunkBlocks; b += 4) {  // four 16-byte blocks per 64-byte load
          const int64_t valid = std::clamp<int64_t>(blocks - b, 0, 4);
          const __m512i v = _mm512_maskz_loadu_epi8(valid == 4 ? ~__mmask64(0) : (__mmask64(1) << (16 * valid)) - 1,
                                                    row + ch * kChunk / 2 + 16 * b);
          const __m512i lo = _mm512_and_si512(v, nibble), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
          // per 128-bit lane (one block): columns 0-15 interleaved from bytes 0-7, 16-31 from 8-15
          const __m512i first = _mm512_unpacklo_epi8(lo, hi), second = _mm512_unpackhi_epi8(lo, hi);
          alignas(64) uint8_t f[64], s[64];
          _mm512_store_si512(f, first);
          _mm512_store_si512(s, second);
          for (int q = 0; q < 4; ++q) {
            const bool live = q < valid;
            std::memcpy(codes + 32 * (b + q), f + 16 * q, 16);
            std::memcpy(codes + 32 * (b + q) + 16, s + 16 * q, 16);
            if (!live) std::memset(codes + 32 * (b + q), 0, 32);
          }
        }
      }
      if (!interleaved) transpose_codes(codes, o);
      const __mmask16 live = __mmask16((1u << blocks) - 1);
      const uint8_t* chunk_scales = interleaved ? interleaved_scales(w, r, ch) : srow + ch * kChunkBlocks * 2;
      _mm512_store_ps(reinterpret_cast<float*>(o + 512), _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(live, chunk_scales)));
    }
  }
}

using PanelTileFn = void (*)(const uint8_t* panel, int64_t panel_row_bytes, const uint8_t* x, int64_t x_stride,
                             int64_t chunks, float* y, int64_t y_stride, bool accumulate);

template <int R, int T>
struct PanelTile {
  // One column chunk: 8 vpdpbusd per accumulator, then each block's sum scaled into the float sums.
  template <bool First>
  static void chunk(const uint8_t* wc, int64_t prb, const uint8_t* xc, int64_t x_stride, float* sums) {
    __m512i acc[R][T];
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const __m512i corr = _mm512_load_si512(xc + t * x_stride + 576);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r][t] = corr;
    }
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      __m512i wv[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) wv[r] = _mm512_load_si512(wc + r * prb + 64 * k);
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        const __m512i xv = _mm512_load_si512(xc + t * x_stride + 64 * k);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) acc[r][t] = _mm512_dpbusd_epi32(acc[r][t], wv[r], xv);
      }
    }
    // The token scales are loaded once: the stores to sums may alias xc for all GCC knows.
    __m512 dx[T];
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) dx[t] = _mm512_load_ps(reinterpret_cast<const float*>(xc + t * x_stride + 512));
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 dw = _mm512_load_ps(reinterpret_cast<const float*>(wc + r * prb + 512));
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) add_block_sums<First>(sums + 16 * (r * T + t), acc[r][t], _mm512_mul_ps(dw, dx[t]));
    }
  }

  static void run(const uint8_t* panel, int64_t prb, const uint8_t* x, int64_t x_stride, int64_t chunks, float* y,
                  int64_t y_stride, bool accumulate) {
    alignas(64) float sums[R * T * 16];
    chunk<true>(panel, prb, x, x_stride, sums);
    for (int64_t ch = 1; ch < chunks; ++ch)
      chunk<false>(panel + ch * kWeightChunkBytes, prb, x + ch * kActivationChunkBytes, x_stride, sums);
    float totals[R * T + 3];
    reduce_sums<R * T>(sums, totals);
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) {
        float* out = y + t * y_stride + r;
        *out = accumulate ? *out + totals[r * T + t] : totals[r * T + t];
      }
  }
};

struct PanelTiles {
  PanelTileFn fn[kTileRows][kTileTokens];
};

template <int R, int... Ts>
void fill_panel_row(PanelTiles& tiles, std::integer_sequence<int, Ts...>) {
  ((tiles.fn[R - 1][Ts] = &PanelTile<R, Ts + 1>::run), ...);
}

template <int... Rs>
PanelTiles make_panel_tiles(std::integer_sequence<int, Rs...>) {
  PanelTiles tiles{};
  (fill_panel_row<Rs + 1>(tiles, std::make_integer_sequence<int, kTileTokens>{}), ...);
  return tiles;
}

// The panel: 64-byte aligned, grow-only, one per thread (the float panels use slots 0 and 1).
uint8_t* panel_buffer(size_t bytes) { return reinterpret_cast<uint8_t*>(thread_scratch_floats(2, (bytes + 3) / 4)); }

int64_t round_down(int64_t v, int64_t m) { return v / m * m; }

}  // namespace

int64_t avx512vnni_panel_stride(int64_t cols) { return chunk_count(cols) * kActivationChunkBytes; }

void avx512vnni_panel_quantize(WeightFormat format, int64_t cols, const float* x, uint8_t* out) {
  quantize_token(format, cols, x, out);
}

void avx512vnni_panel_matmul(const WeightMatrix& w, int64_t r0, int64_t r1, const uint8_t* xq, int64_t xq_stride,
                             int64_t n, float* y, int64_t y_stride) {
  static const PanelTiles tiles = make_panel_tiles(std::make_integer_sequence<int, kTileRows>{});
  if (r0 >= r1 || n <= 0) return;
  const int64_t chunks = chunk_count(w.cols);
  const int64_t kcc = std::clamp<int64_t>(kTokenTileBytes / (kTileTokens * kActivationChunkBytes), 1, chunks);
  const int64_t mb = std::max<int64_t>(kTileRows, round_down(kPanelBytes / (kcc * kWeightChunkBytes), kTileRows));
  uint8_t* panel = panel_buffer(size_t(std::min(mb, r1 - r0) * kcc * kWeightChunkBytes));
  for (int64_t ch0 = 0; ch0 < chunks; ch0 += kcc) {
    const int64_t nc = std::min(kcc, chunks - ch0);
    const int64_t prb = nc * kWeightChunkBytes;
    for (int64_t b0 = r0; b0 < r1; b0 += mb) {
      const int64_t b1 = std::min(r1, b0 + mb);
      pack_panel(w, b0, b1, ch0, nc, panel);
      for (int64_t t = 0; t < n; t += kTileTokens) {
        const int tt = int(std::min<int64_t>(kTileTokens, n - t));
        const uint8_t* xt = xq + t * xq_stride + ch0 * kActivationChunkBytes;
        for (int64_t r = b0; r < b1; r += kTileRows) {
          const int rr = int(std::min<int64_t>(kTileRows, b1 - r));
          tiles.fn[rr - 1][tt - 1](panel + (r - b0) * prb, prb, xt, xq_stride, nc, y + t * y_stride + r, y_stride,
                                   ch0 > 0);
        }
      }
    }
  }
}

}  // namespace tandem::cpu::detail

#pragma GCC diagnostic pop
#pragma GCC pop_options
