// AVX-512 matmul for float weights (F32, F16, BF16): a register tile of 4 rows x 4 tokens keeps 16
// accumulators of 16 lanes; each weight vector is widened once (exactly: F16C / a 16-bit shift)
// and used for 4 tokens, each activation vector for 4 rows (8 rows x 1-2 tokens for decode).
// Column tails use masked loads.
// Results are float32 sums of exact float32 products; only the summation order differs from the
// scalar reference.
#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/tiled_matmul.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
// GCC 12 flags the intrinsic headers' own _mm512_undefined_*() placeholders as uninitialized.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace tandem::cpu::detail {

namespace {

// 16 accumulators, 4 widened weight vectors and one activation vector of the 32 zmm registers
// (4 x 6 and 6 x 4 measured no faster; tiles with fewer loads per FMA are what count here).
constexpr int kTileRows = 4, kTileTokens = 4;
// Decode (1-2 tokens) streams 8 rows at once: twice the cache lines in flight of 4 rows, which
// measured 22 -> 26 GB/s for bf16 on one core (the whole read bandwidth).
constexpr int kDecodeRows = 8;

template <WeightFormat F>
struct Widen;

template <>
struct Widen<WeightFormat::F32> {
  static constexpr int kBytes = 4;
  static __m512 full(const uint8_t* p) { return _mm512_loadu_ps(p); }
  static __m512 part(const uint8_t* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
};

template <>
struct Widen<WeightFormat::F16> {
  static constexpr int kBytes = 2;
  static __m512 full(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }
  static __m512 part(const uint8_t* p, __mmask16 m) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }
};

template <>
struct Widen<WeightFormat::BF16> {
  static constexpr int kBytes = 2;
  static __m512 widen(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }
  static __m512 full(const uint8_t* p) { return widen(_mm256_loadu_si256((const __m256i*)p)); }
  static __m512 part(const uint8_t* p, __mmask16 m) { return widen(_mm256_maskz_loadu_epi16(m, p)); }
};

template <WeightFormat F, int R, int T>
struct FloatTile {
  static void run(const WeightMatrix& w, int64_t row, const uint8_t* xb, int64_t x_stride, int64_t k0, int64_t k1,
                  float* y, int64_t y_stride, bool accumulate, bool prefetch_next) {
    using L = Widen<F>;
    const uint8_t* wp[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) wp[r] = w.data + (row + r) * w.row_stride + k0 * L::kBytes;
    const float* xp[T];
    for (int t = 0; t < T; ++t) xp[t] = reinterpret_cast<const float*>(xb + t * x_stride) + k0;
    __m512 acc[R][T];
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
    const int64_t len = k1 - k0;
    int64_t c = 0;
    for (; c + 16 <= len; c += 16) {
      __m512 wv[R];
      if (prefetch_next && (c * L::kBytes) % 64 == 0)  // the next row tile, see matmul_avx512_vnni.cpp
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) _mm_prefetch((const char*)wp[r] + R * w.row_stride + c * L::kBytes, _MM_HINT_T0);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) wv[r] = L::full(wp[r] + c * L::kBytes);
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t) {
        const __m512 xv = _mm512_loadu_ps(xp[t] + c);
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
      }
    }
    if (c < len) {
      const __mmask16 m = __mmask16((1u << (len - c)) - 1);
      __m512 wv[R];
      for (int r = 0; r < R; ++r) wv[r] = L::part(wp[r] + c * L::kBytes, m);
      for (int t = 0; t < T; ++t) {
        const __m512 xv = _mm512_maskz_loadu_ps(m, xp[t] + c);
        for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
      }
    }
    for (int t = 0; t < T; ++t) {
      float* out = y + t * y_stride + row;
      for (int r = 0; r < R; ++r) {
        const float s = _mm512_reduce_add_ps(acc[r][t]);
        out[r] = accumulate ? out[r] + s : s;
      }
    }
  }
};

template <WeightFormat F>
struct ForFormat {
  template <int R, int T>
  struct Tile : FloatTile<F, R, T> {};
};

template <WeightFormat F, int R = kTileRows, int T = kTileTokens>
TileSet make_tiles() {
  TileSet set;
  fill_tiles<ForFormat<F>::template Tile, R, T>(set);
  set.k_align = 16;
  set.x_bytes_per_col = 4;
  return set;
}

}  // namespace

void avx512_matmul_rows_float(const WeightMatrix& w, int64_t r0, int64_t r1, const float* x, int64_t x_stride,
                              int64_t n, float* y, int64_t y_stride) {
  static const TileSet f32 = make_tiles<WeightFormat::F32>();
  static const TileSet f16 = make_tiles<WeightFormat::F16>();
  static const TileSet bf16 = make_tiles<WeightFormat::BF16>();
  static const TileSet f32_decode = make_tiles<WeightFormat::F32, kDecodeRows, 2>();
  static const TileSet f16_decode = make_tiles<WeightFormat::F16, kDecodeRows, 2>();
  static const TileSet bf16_decode = make_tiles<WeightFormat::BF16, kDecodeRows, 2>();
  if (n <= 2) {
    const TileSet& tiles =
        w.format == WeightFormat::F32 ? f32_decode : w.format == WeightFormat::F16 ? f16_decode : bf16_decode;
    return tiled_matmul(tiles, w, r0, r1, reinterpret_cast<const uint8_t*>(x), x_stride * 4, n, y, y_stride);
  }
  const TileSet& tiles = w.format == WeightFormat::F32 ? f32 : w.format == WeightFormat::F16 ? f16 : bf16;
  tiled_matmul(tiles, w, r0, r1, reinterpret_cast<const uint8_t*>(x), x_stride * 4, n, y, y_stride);
}

}  // namespace tandem::cpu::detail

#pragma GCC diagnostic pop
#pragma GCC pop_options
