// AVX2 + FMA + F16C matmul for float weights (F32, F16, BF16): register tiles of 4 rows x 2 tokens
// (16 ymm registers: 8 accumulators, 4 widened weight vectors, one activation). Weights are widened
// exactly; column tails (< 8) are summed in scalar code.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/tiled_matmul.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace tandem::cpu::detail {

namespace {

float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <WeightFormat F>
struct Widen;

template <>
struct Widen<WeightFormat::F32> {
  static constexpr int kBytes = 4;
  static __m256 full(const uint8_t* p) { return _mm256_loadu_ps((const float*)p); }
  static float one(const uint8_t* p) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
};

template <>
struct Widen<WeightFormat::F16> {
  static constexpr int kBytes = 2;
  static __m256 full(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
  static float one(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);
  }
};

template <>
struct Widen<WeightFormat::BF16> {
  static constexpr int kBytes = 2;
  static __m256 full(const uint8_t* p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
  }
  static float one(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    const uint32_t u = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

template <WeightFormat F, int R, int T>
struct FloatTile {
  static void run(const WeightMatrix& w, int64_t row, const uint8_t* xb, int64_t x_stride, int64_t k0, int64_t k1,
                  float* y, int64_t y_stride, bool accumulate, bool prefetch_next) {
    using L = Widen<F>;
    const uint8_t* wp[R];
    for (int r = 0; r < R; ++r) wp[r] = w.data + (row + r) * w.row_stride + k0 * L::kBytes;
    const float* xp[T];
    for (int t = 0; t < T; ++t) xp[t] = reinterpret_cast<const float*>(xb + t * x_stride) + k0;
    __m256 acc[R][T];
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
    const int64_t len = k1 - k0;
    int64_t c = 0;
    for (; c + 8 <= len; c += 8) {
      __m256 wv[R];
      if (prefetch_next && (c * L::kBytes) % 64 == 0)  // warm the next row tile (see matmul_avx512_vnni.cpp)
        for (int r = 0; r < R; ++r) _mm_prefetch((const char*)wp[r] + R * w.row_stride + c * L::kBytes, _MM_HINT_T0);
      for (int r = 0; r < R; ++r) wv[r] = L::full(wp[r] + c * L::kBytes);
      for (int t = 0; t < T; ++t) {
        const __m256 xv = _mm256_loadu_ps(xp[t] + c);
        for (int r = 0; r < R; ++r) acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
      }
    }
    for (int t = 0; t < T; ++t) {
      float* out = y + t * y_stride + row;
      for (int r = 0; r < R; ++r) {
        float s = hsum(acc[r][t]);
        for (int64_t k = c; k < len; ++k) s += L::one(wp[r] + k * L::kBytes) * xp[t][k];
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

template <WeightFormat F>
TileSet make_tiles() {
  TileSet set;
  fill_tiles<ForFormat<F>::template Tile, 4, 2>(set);
  set.k_align = 8;
  set.x_bytes_per_col = 4;
  return set;
}

}  // namespace

void avx2_matmul_rows_float(const WeightMatrix& w, int64_t r0, int64_t r1, const float* x, int64_t x_stride,
                            int64_t n, float* y, int64_t y_stride) {
  static const TileSet f32 = make_tiles<WeightFormat::F32>();
  static const TileSet f16 = make_tiles<WeightFormat::F16>();
  static const TileSet bf16 = make_tiles<WeightFormat::BF16>();
  const TileSet& tiles = w.format == WeightFormat::F32 ? f32 : w.format == WeightFormat::F16 ? f16 : bf16;
  tiled_matmul(tiles, w, r0, r1, reinterpret_cast<const uint8_t*>(x), x_stride * 4, n, y, y_stride);
}

}  // namespace tandem::cpu::detail

#pragma GCC pop_options
