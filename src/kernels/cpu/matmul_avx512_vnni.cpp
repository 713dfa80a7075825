// AVX-512 VNNI matmul for quantized weights (Q8, Q4). The activations are quantized once per call
// to int8 per block of 32 (scale max|x|/127); each 64-byte weight vector then meets 4 tokens
// through vpdpbusd (u8 x s8 -> 4-way sums in int32 lanes). vpdpbusd wants one unsigned operand,
// so the weights become unsigned: Q8 as w + 128 (a sign-bit flip), Q4 as stored (q + 8). The offset
// times the block's sum of activation codes is subtracted exactly, through the accumulator the
// dot product starts from. Per lane the int32 sum belongs to one block, so it is scaled by
// weight scale x activation scale and summed in float32.
//
// Activation layout (per token, groups of G values, zero-padded past cols):
//   Q8, G = 64,  192 bytes: 64 codes | 16 float scales (lane l: block l/8) | 16 int32 corrections
//                                                                       (lanes 0, 8: -128 * sum)
//   Q4, G = 128, 256 bytes: 64 codes of the even columns of blocks 0-3 (16 each) | 64 of the odd ones
//                           | 16 float scales (lane l: block l/4) | 16 int32 corrections (lane 4b)
// Q4's low nibbles hold the even columns of a block and the high nibbles the odd ones, so the
// weights need only a mask and a shift to line up with this layout.
#include <immintrin.h>

#include <cstdint>
#include <algorithm>
#include <cstring>

#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/prefetch_tuning.h"
#include "kernels/cpu/tiled_matmul.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
// GCC 12 flags the intrinsic headers' own _mm512_undefined_*() placeholders as uninitialized.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace tandem::cpu::detail {

namespace {

constexpr int64_t kQ8Group = 64, kQ8GroupBytes = 192;
constexpr int64_t kQ4Group = 128, kQ4GroupBytes = 256;

// From this many tokens on, packing weight panels (matmul_avx512_vnni_panel.cpp) pays for itself.
// Interleaved weights read activations in the panel layout at every n.
constexpr int64_t kPanelMinTokens = 16;
bool use_panel(const WeightMatrix& w, int64_t n) { return n >= kPanelMinTokens || w.layout == WeightLayout::Interleaved; }

int64_t group_count(int64_t cols, int64_t group) { return (cols + group - 1) / group; }

// One block of 32 activations quantized: codes as int32 lanes (a: columns 0-15, b: 16-31).
struct QuantizedBlock {
  __m512i a, b;
  float scale;
  int32_t sum;
};

QuantizedBlock quantize_block(__m512 a, __m512 b) {
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
  const __m512 inv = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
  QuantizedBlock q;
  q.a = _mm512_cvtps_epi32(_mm512_mul_ps(a, inv));  // round to nearest (even)
  q.b = _mm512_cvtps_epi32(_mm512_mul_ps(b, inv));
  q.scale = amax / 127.0f;
  q.sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q.a, q.b));
  return q;
}

// A group that the columns fill only partly is zeroed first: the kernels read it whole.
void clear_partial_group(int64_t cols, int64_t group, int64_t group_bytes, uint8_t* out) {
  if (cols % group != 0) std::memset(out + cols / group * group_bytes, 0, size_t(group_bytes));
}

void quantize_token_q8(int64_t cols, const float* x, uint8_t* out) {
  clear_partial_group(cols, kQ8Group, kQ8GroupBytes, out);
  for (int64_t blk = 0; blk < cols / kQuantBlock; ++blk) {
    const QuantizedBlock q = quantize_block(_mm512_loadu_ps(x + blk * 32), _mm512_loadu_ps(x + blk * 32 + 16));
    uint8_t* g = out + (blk / 2) * kQ8GroupBytes;
    const int half = int(blk % 2);
    _mm_storeu_si128((__m128i*)(g + 32 * half), _mm512_cvtepi32_epi8(q.a));
    _mm_storeu_si128((__m128i*)(g + 32 * half + 16), _mm512_cvtepi32_epi8(q.b));
    _mm256_storeu_ps((float*)(g + 64) + 8 * half, _mm256_set1_ps(q.scale));
    _mm256_storeu_si256((__m256i*)(g + 128 + 32 * half), _mm256_setr_epi32(-128 * q.sum, 0, 0, 0, 0, 0, 0, 0));
  }
}

void quantize_token_q4(int64_t cols, const float* x, uint8_t* out) {
  clear_partial_group(cols, kQ4Group, kQ4GroupBytes, out);
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  for (int64_t blk = 0; blk < cols / kQuantBlock; ++blk) {
    const __m512 a = _mm512_loadu_ps(x + blk * 32), b = _mm512_loadu_ps(x + blk * 32 + 16);
    const QuantizedBlock q = quantize_block(_mm512_permutex2var_ps(a, even, b), _mm512_permutex2var_ps(a, odd, b));
    uint8_t* g = out + (blk / 4) * kQ4GroupBytes;
    const int quarter = int(blk % 4);
    _mm_storeu_si128((__m128i*)(g + 16 * quarter), _mm512_cvtepi32_epi8(q.a));
    _mm_storeu_si128((__m128i*)(g + 64 + 16 * quarter), _mm512_cvtepi32_epi8(q.b));
    _mm_storeu_ps((float*)(g + 128) + 4 * quarter, _mm_set1_ps(q.scale));
    _mm_storeu_si128((__m128i*)(g + 192 + 16 * quarter), _mm_setr_epi32(-8 * q.sum, 0, 0, 0));
  }
}

// f16 scales of `count` consecutive blocks (1..4) as floats, each repeated over `lanes` lanes.
__m512 expand_scales(const uint8_t* scales, int count, __m512i lane_to_block) {
  const __m128i h = _mm_maskz_loadu_epi16(__mmask8((1u << count) - 1), scales);
  return _mm512_permutexvar_ps(lane_to_block, _mm512_castps128_ps512(_mm_cvtph_ps(h)));
}

// Decode streams every row once, R rows at a time. The hardware prefetcher loses track at each
// switch to the next R rows (and never sees the small scale rows coming), so each tile prefetches
// the next tile's bytes at the columns it is reading itself, and the next tile's scales up front:
// measured 8 -> 18 GB/s on one Zen 5 core for Q8. In prefill these lines are already in L2.
// Into L2 (T1), not L1: on one Zen 4 core that read Q8 matvecs from DRAM at 23-26 GB/s instead of
// 13-18 and Q4 at 20-28 instead of 9-15 (bf16, AVX2: the same; docs/kernels.md). L1 prefetches a
// tile ahead compete with the tile's own loads for L1 and its miss buffers.
void prefetch(const uint8_t* p) { _mm_prefetch((const char*)p, _MM_HINT_T1); }

template <int R>
void prefetch_next_scales(const WeightMatrix& w, const uint8_t* const (&sp)[R]) {
  for (int r = 0; r < R; ++r)
    for (int64_t b = 0; b < w.scale_stride; b += 64) prefetch(sp[r] + R * w.scale_stride + b);
}

template <int R, int T>
void store_tile(__m512 (&acc)[R][T], int64_t row, float* y, int64_t y_stride, bool accumulate) {
  for (int t = 0; t < T; ++t) {
    float* out = y + t * y_stride + row;
    for (int r = 0; r < R; ++r) {
      const float s = _mm512_reduce_add_ps(acc[r][t]);
      out[r] = accumulate ? out[r] + s : s;
    }
  }
}

template <int R, int T>
struct Q8Tile {
  static void run(const WeightMatrix& w, int64_t row, const uint8_t* xb, int64_t x_stride, int64_t k0, int64_t k1,
                  float* y, int64_t y_stride, bool accumulate, bool prefetch_next) {
    const uint8_t* wp[R];
    const uint8_t* sp[R];
    for (int r = 0; r < R; ++r) {
      wp[r] = w.data + (row + r) * w.row_stride;
      sp[r] = w.scales + (row + r) * w.scale_stride;
    }
    __m512 acc[R][T];
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
    if (prefetch_next) prefetch_next_scales<R>(w, sp);
    const __m512i flip = _mm512_set1_epi8(char(0x80));
    const __m512i lane_to_block = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    for (int64_t c = k0; c < k1; c += kQ8Group) {
      const int blocks = c + kQ8Group <= k1 ? 2 : 1;
      const __mmask64 bytes = blocks == 2 ? ~__mmask64(0) : __mmask64(0xffffffffu);
      __m512i wv[R];
      __m512 dw[R];
      for (int r = 0; r < R; ++r) {
        if (prefetch_next) prefetch(wp[r] + R * w.row_stride + c);
        wv[r] = _mm512_xor_si512(_mm512_maskz_loadu_epi8(bytes, wp[r] + c), flip);
        dw[r] = expand_scales(sp[r] + c / kQuantBlock * 2, blocks, lane_to_block);
      }
      const uint8_t* xg = xb + (c / kQ8Group) * kQ8GroupBytes;
      for (int t = 0; t < T; ++t) {
        const uint8_t* g = xg + t * x_stride;
        const __m512i xv = _mm512_load_si512(g);
        const __m512 dx = _mm512_load_ps((const float*)(g + 64));
        const __m512i corr = _mm512_load_si512(g + 128);
        for (int r = 0; r < R; ++r) {
          const __m512i dotv = _mm512_dpbusd_epi32(corr, wv[r], xv);
          acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dotv), _mm512_mul_ps(dw[r], dx), acc[r][t]);
        }
      }
    }
    store_tile<R, T>(acc, row, y, y_stride, accumulate);
  }
};

template <int R, int T>
struct Q4Tile {
  static void run(const WeightMatrix& w, int64_t row, const uint8_t* xb, int64_t x_stride, int64_t k0, int64_t k1,
                  float* y, int64_t y_stride, bool accumulate, bool prefetch_next) {
    const uint8_t* wp[R];
    const uint8_t* sp[R];
    for (int r = 0; r < R; ++r) {
      wp[r] = w.data + (row + r) * w.row_stride;
      sp[r] = w.scales + (row + r) * w.scale_stride;
    }
    __m512 acc[R][T];
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
    if (prefetch_next) prefetch_next_scales<R>(w, sp);
    const __m512i nibble = _mm512_set1_epi8(0x0f);
    const __m512i lane_to_block = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    for (int64_t c = k0; c < k1; c += kQ4Group) {
      const int blocks = int(std::min<int64_t>(4, (k1 - c) / kQuantBlock));
      const __mmask64 bytes = blocks == 4 ? ~__mmask64(0) : (__mmask64(1) << (16 * blocks)) - 1;
      __m512i lo[R], hi[R];
      __m512 dw[R];
      for (int r = 0; r < R; ++r) {
        if (prefetch_next) prefetch(wp[r] + 2 * R * w.row_stride + c / 2);  // rows half as long as Q8: 2 tiles
        const __m512i v = _mm512_maskz_loadu_epi8(bytes, wp[r] + c / 2);
        lo[r] = _mm512_and_si512(v, nibble);
        hi[r] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
        dw[r] = expand_scales(sp[r] + c / kQuantBlock * 2, blocks, lane_to_block);
      }
      const uint8_t* xg = xb + (c / kQ4Group) * kQ4GroupBytes;
      for (int t = 0; t < T; ++t) {
        const uint8_t* g = xg + t * x_stride;
        const __m512i xe = _mm512_load_si512(g), xo = _mm512_load_si512(g + 64);
        const __m512 dx = _mm512_load_ps((const float*)(g + 128));
        const __m512i corr = _mm512_load_si512(g + 192);
        for (int r = 0; r < R; ++r) {
          const __m512i dotv = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(corr, lo[r], xe), hi[r], xo);
          acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dotv), _mm512_mul_ps(dw[r], dx), acc[r][t]);
        }
      }
    }
    store_tile<R, T>(acc, row, y, y_stride, accumulate);
  }
};

// Plain Q4 rows four at a time, for up to T tokens. Q4Tile above converts and scales every
// vpdpbusd pair (16 lanes, 4 per block) on its own; here the four rows' pairs are first summed
// within each block by a transposing add tree (lane 4b + r: row r, block b), so one convert, one
// scale product and one FMA serve four rows, and the rows' f16 scales are gathered in that lane
// order by one word permute. The rows' unpacked nibbles serve every token. Each token's sums are
// those of the one-token tile (T = 1: the same operations in the same order), so a batch gives
// each token what it gets alone. Rows that do not fill a group of four take Q4Tile, whose sums
// do not depend on the token count either.
template <int R, int T>
struct Q4GroupedTile {
  template <bool Full>
  static void chunk(const uint8_t* wp, const uint8_t* sp, int64_t rs, int64_t ss, const uint8_t* xg, int64_t x_stride,
                    int blocks, bool prefetch_next, __m512 (&acc)[T]) {
    const __m512i nibble = _mm512_set1_epi8(0x0f);
    const __mmask64 bytes = Full ? ~__mmask64(0) : (__mmask64(1) << (16 * blocks)) - 1;
    __m512i lo[4], hi[4];
    for (int r = 0; r < 4; ++r) {
      const uint8_t* p = wp + r * rs;
      if (prefetch_next) prefetch(p + 2 * R * rs);  // rows half as long as Q8: 2 tiles ahead
      const __m512i v = Full ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi8(bytes, p);
      lo[r] = _mm512_and_si512(v, nibble);
      hi[r] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
    }
    // Row r's 4 scales are words 4r..4r+3 of `raw`; lane 4b + r wants word 4r + b.
    const __mmask8 scale_words = Full ? 0xf : __mmask8((1u << blocks) - 1);
    __m128i r01 = _mm_maskz_loadu_epi16(scale_words, sp), r23 = _mm_maskz_loadu_epi16(scale_words, sp + 2 * ss);
    r01 = _mm_unpacklo_epi64(r01, _mm_maskz_loadu_epi16(scale_words, sp + ss));
    r23 = _mm_unpacklo_epi64(r23, _mm_maskz_loadu_epi16(scale_words, sp + 3 * ss));
    const __m256i raw = _mm256_inserti128_si256(_mm256_castsi128_si256(r01), r23, 1);
    const __m256i order = _mm256_setr_epi16(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m512 dw = _mm512_cvtph_ps(_mm256_permutexvar_epi16(order, raw));
    for (int t = 0; t < T; ++t) {
      const uint8_t* g = xg + t * x_stride;
      const __m512i xe = _mm512_load_si512(g), xo = _mm512_load_si512(g + 64);
      // Block b's correction (-8 x its code sum) sits in lane 4b; starting every row from it puts
      // it into each row's block sum below.
      const __m512i corr = _mm512_load_si512(g + 192);
      __m512i d[4];
      for (int r = 0; r < 4; ++r) d[r] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(corr, lo[r], xe), hi[r], xo);
      // Per 128-bit lane (one block): [a0 a1 a2 a3] of rows 0-3 -> [row 0 sum, row 1, row 2, row 3].
      const __m512i t01 = _mm512_add_epi32(_mm512_unpacklo_epi32(d[0], d[1]), _mm512_unpackhi_epi32(d[0], d[1]));
      const __m512i t23 = _mm512_add_epi32(_mm512_unpacklo_epi32(d[2], d[3]), _mm512_unpackhi_epi32(d[2], d[3]));
      const __m512i sums = _mm512_add_epi32(_mm512_unpacklo_epi64(t01, t23), _mm512_unpackhi_epi64(t01, t23));
      const __m512 dx = _mm512_load_ps((const float*)(g + 128));
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), _mm512_mul_ps(dw, dx), acc[t]);
    }
  }

  static void run(const WeightMatrix& w, int64_t row, const uint8_t* xb, int64_t x_stride, int64_t k0, int64_t k1,
                  float* y, int64_t y_stride, bool accumulate, bool prefetch_next) {
    if constexpr (R % 4 != 0) {  // whole groups of four, then the rest
      if constexpr (R > 4)
        Q4GroupedTile<R / 4 * 4, T>::run(w, row, xb, x_stride, k0, k1, y, y_stride, accumulate, prefetch_next);
      Q4Tile<R % 4, T>::run(w, row + R / 4 * 4, xb, x_stride, k0, k1, y, y_stride, accumulate, prefetch_next);
    } else {
      constexpr int G = R / 4;
      const int64_t rs = w.row_stride, ss = w.scale_stride;
      const uint8_t* wp = w.data + row * rs;
      const uint8_t* sp = w.scales + row * ss;
      if (prefetch_next)
        for (int r = 0; r < R; ++r)
          for (int64_t b = 0; b < ss; b += 64) prefetch(sp + (R + r) * ss + b);
      __m512 acc[G][T];
      for (int g = 0; g < G; ++g)
        for (int t = 0; t < T; ++t) acc[g][t] = _mm512_setzero_ps();
      int64_t c = k0;
      for (; c + kQ4Group <= k1; c += kQ4Group) {
        const uint8_t* xg = xb + (c / kQ4Group) * kQ4GroupBytes;
        for (int g = 0; g < G; ++g)
          chunk<true>(wp + 4 * g * rs + c / 2, sp + 4 * g * ss + c / kQuantBlock * 2, rs, ss, xg, x_stride, 4,
                      prefetch_next, acc[g]);
      }
      if (c < k1) {
        const uint8_t* xg = xb + (c / kQ4Group) * kQ4GroupBytes;
        const int blocks = int((k1 - c) / kQuantBlock);
        for (int g = 0; g < G; ++g)
          chunk<false>(wp + 4 * g * rs + c / 2, sp + 4 * g * ss + c / kQuantBlock * 2, rs, ss, xg, x_stride, blocks,
                       prefetch_next, acc[g]);
      }
      for (int g = 0; g < G; ++g)
        for (int t = 0; t < T; ++t) {
          // Lanes 4b + r: add the four blocks of each row.
          const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(acc[g][t]),
                                         _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[g][t]), 1)));
          __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
          float* out = y + t * y_stride + row + 4 * g;
          if (accumulate) q = _mm_add_ps(q, _mm_loadu_ps(out));
          _mm_storeu_ps(out, q);
        }
    }
  }
};

template <int R, int T>
TileSet make_q4_grouped_tiles() {
  TileSet set;
  fill_tiles<Q4GroupedTile, R, T>(set);
  set.k_align = kQ4Group;
  set.x_bytes_per_col = kQ4GroupBytes / kQ4Group;
  return set;
}

template <int R, int T>
TileSet make_q8_tiles() {
  TileSet set;
  fill_tiles<Q8Tile, R, T>(set);
  set.k_align = kQ8Group;
  set.x_bytes_per_col = kQ8GroupBytes / kQ8Group;
  return set;
}

}  // namespace

int64_t avx512vnni_activation_stride(const WeightMatrix& w, int64_t n) {
  const WeightFormat format = w.format;
  const int64_t cols = w.cols;
  if (use_panel(w, n)) return avx512vnni_panel_stride(cols);
  return format == WeightFormat::Q4 ? group_count(cols, kQ4Group) * kQ4GroupBytes
                                    : group_count(cols, kQ8Group) * kQ8GroupBytes;
}

void avx512vnni_quantize_activations(const WeightMatrix& w, int64_t n, const float* x, int64_t x_stride, int64_t first,
                                     int64_t count, uint8_t* out, int64_t out_stride) {
  const WeightFormat format = w.format;
  const int64_t cols = w.cols;
  for (int64_t i = first; i < first + count; ++i) {
    if (use_panel(w, n))
      avx512vnni_panel_quantize(format, cols, x + i * x_stride, out + i * out_stride);
    else if (format == WeightFormat::Q4)
      quantize_token_q4(cols, x + i * x_stride, out + i * out_stride);
    else
      quantize_token_q8(cols, x + i * x_stride, out + i * out_stride);
  }
}

void avx512vnni_matmul_rows_quantized(const WeightMatrix& w, int64_t r0, int64_t r1, const uint8_t* xq,
                                      int64_t xq_stride, int64_t n, float* y, int64_t y_stride) {
  // 2-15 tokens of plain Q8: 4 rows x 8 tokens, each weight vector loaded once for a batch of 8
  // (kernels_bench Batch8, two threads, Intel Xeon: 10240 x 2560 1955-2215 -> 1754-1830 us against
  // 4 x 4, 2 x 8 the same as 4 x 4; mapped E4B q8 batches of 8 19.8-19.9 -> 21.6-21.9 tok/s).
  static const TileSet q8 = make_q8_tiles<4, 8>();
  // One token: more rows at once keep more cache lines in flight (measured on one core: Q8
  // 21 -> 36 GB/s with 8 rows, Q4 22 -> 28 GB/s with 6). Q4 in groups of four rows: from L2 on one
  // Zen 4 core 35 -> 37-38 GB/s against 6 rows of Q4Tile; from DRAM the same within the noise.
  static const TileSet q8_decode = make_q8_tiles<8, 1>();
  static const TileSet q4_decode = make_q4_grouped_tiles<8, 1>();
  // 2-15 tokens: groups of four rows x 8 tokens. Against Q4Tile's 4 x 3 (kernels_bench Batch8,
  // plain Q4, two threads, Intel Xeon): 2560 x 256 (E4B's PLE projection) 53-54 -> 32 us,
  // 10240 x 2560 1353-1438 -> 824-859 us.
  static const TileSet q4_batch = make_q4_grouped_tiles<4, 8>();
  // Many tokens take the panels in either layout: for interleaved weights their unpacked copy in L2
  // measured 10-20% faster than unpacking Q4 per token tile or walking Q8 rows in place. Where the
  // interleaved batch tiles were measured faster for more tokens than that (prefetch_tuning.h),
  // they keep those batches.
  if (w.layout == WeightLayout::Interleaved) {
    const int tiles_up_to = w.format == WeightFormat::Q4 ? prefetch_tuning().q4_batch_tile_tokens
                                                         : prefetch_tuning().q8_batch_tile_tokens;
    if (n > tiles_up_to) return avx512vnni_panel_matmul(w, r0, r1, xq, xq_stride, n, y, y_stride);
    return avx512vnni_interleaved_matmul(w, r0, r1, xq, xq_stride, n, y, y_stride);
  }
  if (n >= kPanelMinTokens) return avx512vnni_panel_matmul(w, r0, r1, xq, xq_stride, n, y, y_stride);
  if (n == 1)
    return tiled_matmul(w.format == WeightFormat::Q4 ? q4_decode : q8_decode, w, r0, r1, xq, xq_stride, n, y, y_stride);
  tiled_matmul(w.format == WeightFormat::Q4 ? q4_batch : q8, w, r0, r1, xq, xq_stride, n, y, y_stride);
}

}  // namespace tandem::cpu::detail

#pragma GCC diagnostic pop
#pragma GCC pop_options
