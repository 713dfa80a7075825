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
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
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

// Lane j of vector k gathers the dword at byte 32 j + 4 k of 16 consecutive 32-byte blocks.
__m512i gather_index(int k) {
  return _mm512_add_epi32(_mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                             _mm512_set1_epi32(32)),
                          _mm512_set1_epi32(4 * k));
}

void transpose_chunk(const uint8_t* blocks, uint8_t* out) {
  for (int k = 0; k < 8; ++k)
    _mm512_store_si512(out + 64 * k, _mm512_i32gather_epi32(gather_index(k), blocks, 1));
}

void quantize_token(WeightFormat format, int64_t cols, const float* x, uint8_t* out) {
  const int32_t offset = format == WeightFormat::Q4 ? 8 : 128;
  alignas(64) int8_t codes[kChunk];
  for (int64_t ch = 0; ch < chunk_count(cols); ++ch) {
    const int64_t blocks = std::min<int64_t>(kChunkBlocks, (cols - ch * kChunk) / kQuantBlock);
    uint8_t* o = out + ch * kActivationChunkBytes;
    float* scales = reinterpret_cast<float*>(o + 512);
    int32_t* corrections = reinterpret_cast<int32_t*>(o + 576);
    std::memset(codes, 0, sizeof codes);
    std::memset(o + 512, 0, 128);
    for (int64_t j = 0; j < blocks; ++j) {
      const float* xb = x + ch * kChunk + j * kQuantBlock;
      const __m512 a = _mm512_loadu_ps(xb), b = _mm512_loadu_ps(xb + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
      const __m512 inv = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
      const __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, inv)), qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, inv));
      _mm_store_si128((__m128i*)(codes + 32 * j), _mm512_cvtepi32_epi8(qa));
      _mm_store_si128((__m128i*)(codes + 32 * j + 16), _mm512_cvtepi32_epi8(qb));
      scales[j] = amax / 127.0f;
      corrections[j] = -offset * _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
    }
    transpose_chunk(reinterpret_cast<const uint8_t*>(codes), o);
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
      if (!interleaved) transpose_chunk(codes, o);
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
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 dw = _mm512_load_ps(reinterpret_cast<const float*>(wc + r * prb + 512));
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        const __m512 dx = _mm512_load_ps(reinterpret_cast<const float*>(xc + t * x_stride + 512));
        add_block_sums<First>(sums + 16 * (r * T + t), acc[r][t], _mm512_mul_ps(dw, dx));
      }
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

// The panel: 64-byte aligned, grow-only, one per thread.
uint8_t* panel_buffer(size_t bytes) {
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  thread_local std::unique_ptr<uint8_t, Free> buffer;
  thread_local size_t capacity = 0;
  if (bytes > capacity) {
    capacity = (bytes + 63) / 64 * 64;
    buffer.reset(static_cast<uint8_t*>(std::aligned_alloc(64, capacity)));
    if (!buffer) throw std::bad_alloc();
  }
  return buffer.get();
}

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
