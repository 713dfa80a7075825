// AVX2 + FMA + F16C matmul for float weights (F32, F16, BF16): register tiles up to 47 tokens, 4
// rows for one token (four weight streams) and 3 rows x 4 tokens for more (16 ymm registers: 12
// accumulators, 3 widened weight vectors, one activation), packed outer-product panels from 48 on.
// Weights are widened exactly; column tails (< 8) are summed in scalar code. Every tile adds a dot
// product's products in the same order, so a token's result does not depend on its tile.
// 3 x 4 against the 4 x 2 tiles before (session 24, Zen 3): a register-only loop of the BF16 step
// from L1 ran 12.5 against 9.5 multiply-adds per cycle (8 accumulators, one FMA each per step,
// left the FMA pipes idle about a third of the time; widening even and odd columns by a shift and
// an AND instead of vpmovzxwd did not change that), `kernels_bench Batch8` two cores from DRAM
// bf16 82-106 -> 109-131 GFLOP/s, f16 88-107 -> 110-126, f32 55-69 -> 79-92; E4B bf16 batch of
// 8 (four alternated pairs) 9.1-10.3 -> 8.8-13.1 tok/s, mean 9.8 -> 11.4.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/prefetch_tuning.h"
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
    // One-token tiles (decode, and the odd token a batch of 5, 9 or 13 leaves after its 4-token
    // tiles, whose rows are then in cache) where prefetch_tuning() asks: each row's line `ahead`
    // bytes on into L1, or past the row's end the line as far into the same row of the next tile,
    // the order the tiles read. Else every tile warms the next row tile in L2 at the same columns.
    const int64_t ahead = T == 1 && prefetch_next ? prefetch_tuning().avx2_float_decode_ahead : 0;
    int64_t c = 0;
    for (; c + 8 <= len; c += 8) {
      __m256 wv[R];
      if (prefetch_next && (c * L::kBytes) % 64 == 0) {
        if (ahead) {
          const int64_t at = c * L::kBytes + ahead, span = len * L::kBytes;
          const int64_t offset = at < span ? at : R * w.row_stride + at - span;
          for (int r = 0; r < R; ++r) _mm_prefetch((const char*)wp[r] + offset, _MM_HINT_T0);
        } else {
          for (int r = 0; r < R; ++r) _mm_prefetch((const char*)wp[r] + R * w.row_stride + c * L::kBytes, _MM_HINT_T1);
        }
      }
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

template <WeightFormat F, int R, int T>
TileSet make_tiles() {
  TileSet set;
  fill_tiles<ForFormat<F>::template Tile, R, T>(set);
  set.k_align = 8;
  set.x_bytes_per_col = 4;
  return set;
}

// ---- Prefill (48+ tokens): outer products over packed panels (see matmul_avx512.cpp) --------
// Groups of 16 rows widened once per column block into a k-major panel, 6-token tiles of the
// activations laid out k-major too; the microkernel does 2 loads and 6 broadcasts per column for
// 12 FMAs into 12 accumulators (15 of the 16 ymm registers), without widening or horizontal sums.
constexpr int kPanelVecs = 2, kPanelTokens = 6;
constexpr int kPanelRows = 8 * kPanelVecs;
constexpr int64_t kPanelBytes = 256 << 10;  // a group's panel over a column block: L2 on AVX2 CPUs too
constexpr int64_t kPanelMinTokens = 48;  // as on AVX-512: 48 tokens measured even (80-86 against 78-80 GFLOP/s)

// r[i][j] -> r[j][i] for 8 vectors of 8 floats.
inline void transpose8(__m256 r[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {  // u[i + j], per 128-bit lane L: column 4L + j of rows i..i+3
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int j = 0; j < 4; ++j) {
    r[j] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x20);
    r[4 + j] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x31);
  }
}

// 8 weights of row p from column c on, widened; columns past `count` are zero.
template <WeightFormat F>
__m256 widen_part(const uint8_t* p, int count) {
  using L = Widen<F>;
  if (count >= 8) return L::full(p);
  alignas(32) float v[8] = {};
  for (int i = 0; i < count; ++i) v[i] = L::one(p + i * L::kBytes);
  return _mm256_load_ps(v);
}

// Rows [row, row + nr) (the rest of the group zero) over columns [k0, k0 + kk) into
// panel[c * kPanelRows + r], widened to float32.
template <WeightFormat F>
void pack_weight_panel(const WeightMatrix& w, int64_t row, int nr, int64_t k0, int64_t kk, float* panel) {
  using L = Widen<F>;
  for (int v = 0; v < kPanelVecs; ++v)
    for (int64_t c = 0; c < kk; c += 8) {
      const int cols_here = int(std::min<int64_t>(8, kk - c));
      __m256 r[8];
      for (int i = 0; i < 8; ++i) {
        const int rr = 8 * v + i;
        r[i] = rr >= nr ? _mm256_setzero_ps()
                        : widen_part<F>(w.data + (row + rr) * w.row_stride + (k0 + c) * L::kBytes, cols_here);
      }
      transpose8(r);
      for (int i = 0; i < cols_here; ++i) _mm256_store_ps(panel + (c + i) * kPanelRows + 8 * v, r[i]);
    }
}

// Tokens [t0, t0 + nt) (the rest zero) over columns [k0, k0 + kk) into out[c * kPanelTokens + t].
void pack_token_tile(const float* x, int64_t x_stride, int64_t t0, int nt, int64_t k0, int64_t kk, float* out) {
  const __m256i tile_lanes = _mm256_setr_epi32(-1, -1, -1, -1, -1, -1, 0, 0);
  for (int64_t c = 0; c < kk; c += 8) {
    const int cols_here = int(std::min<int64_t>(8, kk - c));
    __m256 r[8];
    for (int t = 0; t < 8; ++t)
      r[t] = t < nt ? widen_part<WeightFormat::F32>(reinterpret_cast<const uint8_t*>(x + (t0 + t) * x_stride + k0 + c),
                                                    cols_here)
                    : _mm256_setzero_ps();
    transpose8(r);
    for (int i = 0; i < cols_here; ++i) _mm256_maskstore_ps(out + (c + i) * kPanelTokens, tile_lanes, r[i]);
  }
}

// y[t * y_stride + r] (+)= sum_c panel[c][r] * tile[c][t] for r < nr, t < nt.
void panel_tile(const float* panel, const float* tile, int64_t kk, float* y, int64_t y_stride, int nr, int nt,
                bool accumulate) {
  constexpr int V = kPanelVecs, T = kPanelTokens;
  for (int t = 0; t < nt; ++t)
    for (int v = 0; v < V && 8 * v < nr; ++v) _mm_prefetch((const char*)(y + t * y_stride + 8 * v), _MM_HINT_T0);
  __m256 acc[T][V];
  for (int t = 0; t < T; ++t)
    for (int v = 0; v < V; ++v) acc[t][v] = _mm256_setzero_ps();
  for (int64_t c = 0; c < kk; ++c) {
    __m256 wv[V];
    for (int v = 0; v < V; ++v) wv[v] = _mm256_load_ps(panel + c * kPanelRows + 8 * v);
    for (int t = 0; t < T; ++t) {
      const __m256 xb = _mm256_broadcast_ss(tile + c * T + t);
      for (int v = 0; v < V; ++v) acc[t][v] = _mm256_fmadd_ps(wv[v], xb, acc[t][v]);
    }
  }
  // Through memory with constant indices: indexing acc by the run-time nt below made GCC keep
  // every accumulator on the stack inside the loop.
  alignas(32) float sums[T][V][8];
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) _mm256_store_ps(sums[t][v], acc[t][v]);
  for (int v = 0; v < V; ++v) {
    const int rows_here = std::clamp(nr - 8 * v, 0, 8);
    if (rows_here == 0) break;
    alignas(32) int32_t lanes[8];
    for (int i = 0; i < 8; ++i) lanes[i] = i < rows_here ? -1 : 0;
    const __m256i m = _mm256_load_si256(reinterpret_cast<const __m256i*>(lanes));
    for (int t = 0; t < nt; ++t) {
      float* out = y + t * y_stride + 8 * v;
      const __m256 a = _mm256_load_ps(sums[t][v]);
      const __m256 sum = accumulate ? _mm256_add_ps(_mm256_maskload_ps(out, m), a) : a;
      _mm256_maskstore_ps(out, m, sum);
    }
  }
}

template <WeightFormat F>
PanelKernels panel_kernels() {
  PanelKernels k;
  k.group_rows = kPanelRows;
  k.tile_tokens = kPanelTokens;
  k.max_cols = kPanelBytes / (kPanelRows * int64_t(sizeof(float)));
  k.col_align = 8;
  k.pack_tokens = pack_token_tile;
  k.pack_weights = pack_weight_panel<F>;
  k.multiply = panel_tile;
  return k;
}

}  // namespace

void avx2_matmul_rows_float(const WeightMatrix& w, int64_t r0, int64_t r1, const float* x, int64_t x_stride,
                            int64_t n, float* y, int64_t y_stride) {
  static const TileSet decode[3] = {make_tiles<WeightFormat::F32, 4, 1>(), make_tiles<WeightFormat::F16, 4, 1>(),
                                    make_tiles<WeightFormat::BF16, 4, 1>()};
  static const TileSet batch[3] = {make_tiles<WeightFormat::F32, 3, 4>(), make_tiles<WeightFormat::F16, 3, 4>(),
                                   make_tiles<WeightFormat::BF16, 3, 4>()};
  if (n >= kPanelMinTokens && w.cols > 0) {  // no columns: tiled_matmul writes the zeros
    static const PanelKernels f32p = panel_kernels<WeightFormat::F32>();
    static const PanelKernels f16p = panel_kernels<WeightFormat::F16>();
    static const PanelKernels bf16p = panel_kernels<WeightFormat::BF16>();
    const PanelKernels& k = w.format == WeightFormat::F32 ? f32p : w.format == WeightFormat::F16 ? f16p : bf16p;
    return panel_matmul(k, w, r0, r1, x, x_stride, n, y, y_stride);
  }
  const int f = w.format == WeightFormat::F32 ? 0 : w.format == WeightFormat::F16 ? 1 : 2;
  const TileSet& tiles = n == 1 ? decode[f] : batch[f];
  tiled_matmul(tiles, w, r0, r1, reinterpret_cast<const uint8_t*>(x), x_stride * 4, n, y, y_stride);
}

}  // namespace tandem::cpu::detail

#pragma GCC pop_options
