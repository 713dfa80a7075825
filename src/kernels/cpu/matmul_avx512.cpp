// AVX-512 matmul for float weights (F32, F16, BF16): a register tile of 4 rows x 4 tokens keeps 16
// accumulators of 16 lanes; each weight vector is widened once (exactly: F16C / a 16-bit shift)
// and used for 4 tokens, each activation vector for 4 rows (8 rows x 1-2 tokens for decode).
// Column tails use masked loads. BF16/F16 in row groups (WeightLayout::Interleaved) have tiles of
// their own below 48 tokens; the prefill panels pack either layout.
// Results are float32 sums of exact float32 products; only the summation order differs from the
// scalar reference.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/prefetch_tuning.h"
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
// Interleaved decode tiles read one row group (one stream) on rows of up to this many bytes of
// float activations, two groups (two streams, each activation load shared by 8 rows) on longer
// ones. On one Zen 4 core from DRAM: 2560 columns 30-32 GB/s with one group against 20-22 with
// two (plain 8-row tiles: 22-24); 10240 columns 23-24 against 24-27 (plain 25-26).
constexpr int64_t kOneGroupMaxActivationBytes = 16 << 10;

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
        for (int r = 0; r < R; ++r) _mm_prefetch((const char*)wp[r] + R * w.row_stride + c * L::kBytes, _MM_HINT_T1);
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

// BF16/F16 in the Interleaved layout (kernels/weight.h): a tile of a whole row group reads one
// sequential stream, vector by vector, instead of R rows side by side (R = 2 groups: two streams).
// One or two tokens leave the streams to the hardware prefetchers (up to 8 tokens mostly go through
// stream_groups(_tokens) below); batches prefetch the next group at the same columns, or on Zen 5 a
// fixed distance ahead (prefetch_tuning.h). Columns [k0, k1) are whole 32-value vectors. Every row adds
// its products vector by vector, each vector's two halves in turn, into one accumulator, for any R
// and T: a row's sum does not depend on the token count.
// Hint: where the batched tiles' prefetches go (_MM_HINT_T1: L2, _MM_HINT_T0: L1; prefetch_tuning.h).
template <WeightFormat F, int R, int T, int Hint = _MM_HINT_T1>
struct InterleavedFloatTile {
  static void run(const WeightMatrix& w, int64_t row, const uint8_t* xb, int64_t x_stride, int64_t k0, int64_t k1,
                  float* y, int64_t y_stride, bool accumulate, bool prefetch_next) {
    using L = Widen<F>;
    constexpr int G = kInterleaveRows;
    const int64_t group_rows = interleaved_group_rows(w, row);
    if constexpr (R > G) {
      if (R % G != 0 || row % G != 0) {  // not whole groups: a group's tile, then the rest
        InterleavedFloatTile<F, G, T, Hint>::run(w, row, xb, x_stride, k0, k1, y, y_stride, accumulate,
                                                 prefetch_next);
        InterleavedFloatTile<F, R - G, T, Hint>::run(w, row + G, xb, x_stride, k0, k1, y, y_stride, accumulate,
                                                     prefetch_next);
        return;
      }
    } else if constexpr (R > 1) {
      if (row % G + R > group_rows) {  // across two row groups: only for unaligned row ranges
        for (int r = 0; r < R; ++r)
          InterleavedFloatTile<F, 1, T, Hint>::run(w, row + r, xb, x_stride, k0, k1, y, y_stride, accumulate,
                                                   prefetch_next);
        return;
      }
    }
    // R > G: whole groups, each full (rows follow in the matrix), read as R / G streams.
    const uint8_t* w0 = interleaved_float_at(w, row, k0);
    const int64_t vs = 64 * (R > G ? G : group_rows);  // from a row's vector to its next
    const int64_t group_bytes = G * w.row_stride;
    auto row_at = [&](const uint8_t* wv, int r) { return wv + (r / G) * group_bytes + 64 * (r % G); };
    const int64_t batch_ahead = prefetch_tuning().float_batch_ahead;
    const int64_t ahead = prefetch_next && T > 2 ? (batch_ahead > 0 ? batch_ahead : R / G * group_bytes) : 0;
    const float* xp[T];
    for (int t = 0; t < T; ++t) xp[t] = reinterpret_cast<const float*>(xb + t * x_stride) + k0;
    __m512 acc[R][T];
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
    const int64_t vectors = (k1 - k0) / 32;
    for (int64_t v = 0; v < vectors; ++v) {
      const uint8_t* wv = w0 + v * vs;
#pragma GCC unroll 2
      for (int half = 0; half < 2; ++half) {
        __m512 wf[R];
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          if (ahead && half == 0) _mm_prefetch((const char*)row_at(wv, r) + ahead, static_cast<_mm_hint>(Hint));
          wf[r] = L::full(row_at(wv, r) + 32 * half);
        }
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) {
          const __m512 xv = _mm512_loadu_ps(xp[t] + 32 * v + 16 * half);
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(wf[r], xv, acc[r][t]);
        }
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

// One token over S full row groups read side by side, one 64-byte vector of each group in turn:
// S streams far apart keep more of DRAM's bandwidth in flight on one core than one stream does
// (E4B bf16 decode on Zen 5: docs/kernels.md, "Streams"), each line prefetched into L1 where
// prefetch_tuning() says so. Each row sums as InterleavedFloatTile does, so its result is the same
// on either path.
template <WeightFormat F, int S>
void stream_groups(const uint8_t* const* groups, float* const* out, int64_t vectors, const float* x) {
  using L = Widen<F>;
  constexpr int G = kInterleaveRows;
  const int64_t ahead = prefetch_tuning().float_decode_ahead;
  __m512 acc[S][G];
  for (int s = 0; s < S; ++s)
    for (int r = 0; r < G; ++r) acc[s][r] = _mm512_setzero_ps();
  for (int64_t v = 0; v < vectors; ++v) {
    const __m512 lo = _mm512_loadu_ps(x + 32 * v), hi = _mm512_loadu_ps(x + 32 * v + 16);
#pragma GCC unroll 4
    for (int s = 0; s < S; ++s)
#pragma GCC unroll 4
      for (int r = 0; r < G; ++r) {
        const uint8_t* p = groups[s] + (v * G + r) * 64;
        if (ahead) _mm_prefetch(reinterpret_cast<const char*>(p + ahead), _MM_HINT_T0);
        acc[s][r] = _mm512_fmadd_ps(L::full(p), lo, acc[s][r]);
        acc[s][r] = _mm512_fmadd_ps(L::full(p + 32), hi, acc[s][r]);
      }
  }
  for (int s = 0; s < S; ++s)
    for (int r = 0; r < G; ++r) out[s][r] = _mm512_reduce_add_ps(acc[s][r]);
}

// 2-8 tokens over S row groups read side by side in the same walk: each weight vector is widened
// once for all the tokens. S x 4 rows x T tokens of sums outgrow the registers, so they live in L1
// (a load and a store per row and token for 4 FMAs' worth of weights); fewer streams with the sums
// in registers read slower from DRAM (docs/kernels.md, "Session 52"). Each line is prefetched into
// L1 where prefetch_tuning() says so. Each (row, token) adds its products in stream_groups' order,
// so every token gets exactly its one-token result.
template <WeightFormat F, int S, int T>
void stream_groups_tokens(const uint8_t* const* groups, float* const* out, const int64_t* y_strides, int64_t vectors,
                          const float* x, int64_t x_stride) {
  using L = Widen<F>;
  constexpr int G = kInterleaveRows;
  const int64_t ahead = prefetch_tuning().float_stream_tokens_ahead;
  alignas(64) float sums[S][G][T][16];
  for (int s = 0; s < S; ++s)
    for (int r = 0; r < G; ++r)
      for (int t = 0; t < T; ++t) _mm512_store_ps(sums[s][r][t], _mm512_setzero_ps());
  for (int64_t v = 0; v < vectors; ++v) {
    __m512 lo_x[T], hi_x[T];
    for (int t = 0; t < T; ++t) {
      lo_x[t] = _mm512_loadu_ps(x + t * x_stride + 32 * v);
      hi_x[t] = _mm512_loadu_ps(x + t * x_stride + 32 * v + 16);
    }
#pragma GCC unroll 4
    for (int s = 0; s < S; ++s)
#pragma GCC unroll 4
      for (int r = 0; r < G; ++r) {
        const uint8_t* p = groups[s] + (v * G + r) * 64;
        if (ahead) _mm_prefetch(reinterpret_cast<const char*>(p + ahead), _MM_HINT_T0);
        const __m512 lo = L::full(p), hi = L::full(p + 32);
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) {
          __m512 acc = _mm512_load_ps(sums[s][r][t]);
          acc = _mm512_fmadd_ps(lo, lo_x[t], acc);
          acc = _mm512_fmadd_ps(hi, hi_x[t], acc);
          _mm512_store_ps(sums[s][r][t], acc);
        }
      }
  }
  for (int s = 0; s < S; ++s)
    for (int t = 0; t < T; ++t)
      for (int r = 0; r < G; ++r) out[s][t * y_strides[s] + r] = _mm512_reduce_add_ps(_mm512_load_ps(sums[s][r][t]));
}

template <WeightFormat F, int S>
void stream_groups_for(const uint8_t* const* groups, float* const* out, const int64_t* y_strides, int64_t vectors,
                       const float* x, int64_t x_stride, int64_t n) {
  switch (n) {
    case 1: return stream_groups<F, S>(groups, out, vectors, x);
    case 2: return stream_groups_tokens<F, S, 2>(groups, out, y_strides, vectors, x, x_stride);
    case 3: return stream_groups_tokens<F, S, 3>(groups, out, y_strides, vectors, x, x_stride);
    case 4: return stream_groups_tokens<F, S, 4>(groups, out, y_strides, vectors, x, x_stride);
    case 5: return stream_groups_tokens<F, S, 5>(groups, out, y_strides, vectors, x, x_stride);
    case 6: return stream_groups_tokens<F, S, 6>(groups, out, y_strides, vectors, x, x_stride);
    case 7: return stream_groups_tokens<F, S, 7>(groups, out, y_strides, vectors, x, x_stride);
    default: return stream_groups_tokens<F, S, 8>(groups, out, y_strides, vectors, x, x_stride);
  }
}
static_assert(kMatvecStreamTokens == 8, "stream_groups_for instantiates 1-8 tokens");

// The runs' whole row groups go through stream_groups(_tokens), one group of each run at a time; a
// run's rows that are not whole groups (a short last group, an unaligned start) through the tiles.
template <WeightFormat F>
void matvec_streams(std::span<const RowRun> runs, const float* x, int64_t x_stride, int64_t n) {
  constexpr int G = kInterleaveRows;
  int64_t next[kMatvecStreams];
  const size_t count = runs.size();  // at most kMatvecStreams (avx512_matvec_streams_float)
  for (size_t i = 0; i < count; ++i) next[i] = runs[i].r0;
  const uint8_t* groups[kMatvecStreams];
  float* out[kMatvecStreams];
  int64_t y_strides[kMatvecStreams];
  for (;;) {
    int s = 0;
    for (size_t i = 0; i < count; ++i) {
      const RowRun& run = runs[i];
      const WeightMatrix& w = *run.w;
      if (next[i] >= run.r1) continue;
      if (next[i] % G == 0 && next[i] + G <= run.r1 && interleaved_group_rows(w, next[i]) == G) {
        groups[s] = interleaved_float_at(w, next[i], 0);
        y_strides[s] = run.y_stride;
        out[s++] = run.y + next[i];
        next[i] += G;
      } else {
        avx512_matmul_rows_float(w, next[i], run.r1, x, x_stride, n, run.y, run.y_stride);
        next[i] = run.r1;
      }
    }
    const int64_t vectors = runs[0].w->cols / 32;
    switch (s) {
      case 0: return;
      case 1: stream_groups_for<F, 1>(groups, out, y_strides, vectors, x, x_stride, n); break;
      case 2: stream_groups_for<F, 2>(groups, out, y_strides, vectors, x, x_stride, n); break;
      case 3: stream_groups_for<F, 3>(groups, out, y_strides, vectors, x, x_stride, n); break;
      default: stream_groups_for<F, 4>(groups, out, y_strides, vectors, x, x_stride, n); break;
    }
  }
}
static_assert(kMatvecStreams == 4, "matvec_streams instantiates stream_groups for 1-4 groups");

template <WeightFormat F>
struct ForFormat {
  template <int R, int T>
  struct Tile : FloatTile<F, R, T> {};
  template <int R, int T>
  struct InterleavedTile : InterleavedFloatTile<F, R, T> {};
  template <int R, int T>
  struct InterleavedTileL1 : InterleavedFloatTile<F, R, T, _MM_HINT_T0> {};
};

// Plain rows are walked 16 columns at a time; row groups a whole 64-byte vector (32 values) at a time.
template <WeightFormat F, int R = kTileRows, int T = kTileTokens, bool RowGroups = false>
TileSet make_tiles() {
  TileSet set;
  if constexpr (RowGroups)
    fill_tiles<ForFormat<F>::template InterleavedTile, R, T>(set);
  else
    fill_tiles<ForFormat<F>::template Tile, R, T>(set);
  set.k_align = RowGroups ? 32 : 16;
  set.x_bytes_per_col = 4;
  return set;
}

// Batches' tiles with their next-group prefetches into L1 instead of L2 (prefetch_tuning.h).
template <WeightFormat F, int R, int T, bool PrefetchIntoL1 = false>
TileSet make_interleaved_tiles() {
  TileSet set = make_tiles<F, R, T, true>();
  if constexpr (PrefetchIntoL1) fill_tiles<ForFormat<F>::template InterleavedTileL1, R, T>(set);
  return set;
}

// ---- Prefill (16+ tokens): outer products over packed panels ----------------------------------
// The register tile above widens every weight vector once per token tile and ends each column
// chunk with horizontal sums; together they held it to ~60-65% of the FMA peak on E4B's layers.
// Here a group of kPanelVecs * 16 rows is widened once per column block into a k-major panel (for
// each column, the group's rows side by side), and a token tile's activations are laid out k-major
// too. The microkernel then needs, per column, kPanelVecs aligned loads and one broadcast per
// token for kPanelVecs x kPanelTokens FMAs: no widening, no shuffles, no horizontal sums. Every
// output is still a float32 sum of exact products, summed in column order within a block.
constexpr int kPanelVecs = 4, kPanelTokens = 6;  // 24 accumulators, 4 weight vectors, 1 broadcast
constexpr int kPanelRows = 16 * kPanelVecs;
// A group's panel over a column block stays in L2 (1 MB or more on AVX-512 CPUs). Bigger blocks
// mean fewer passes over y, which for E4B's 10240-row layers comes from DRAM: on Zen 5, 256, 1024
// and 2560 columns measured 175, 199 and 209 GFLOP/s on one core (FMA peak 225).
constexpr int64_t kPanelBytes = 640 << 10;
// Below this many tokens packing costs more than it saves (the weights then come from DRAM about
// as fast as they are multiplied): 48 tokens measured even with the register tiles.
constexpr int64_t kPanelMinTokens = 48;

// r[i][j] -> r[j][i] for 16 vectors of 16 floats.
inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // r[i + j], per 128-bit lane L: column 4L + j of rows i..i+3
    const __m512d a = _mm512_castps_pd(t[i]), b = _mm512_castps_pd(t[i + 1]);
    const __m512d c = _mm512_castps_pd(t[i + 2]), d = _mm512_castps_pd(t[i + 3]);
    r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  for (int j = 0; j < 4; ++j) {  // a 4 x 4 transpose of 128-bit lanes across r[j], r[4 + j], ...
    const __m512 u0 = _mm512_shuffle_f32x4(r[j], r[4 + j], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 u1 = _mm512_shuffle_f32x4(r[j], r[4 + j], _MM_SHUFFLE(3, 2, 3, 2));
    const __m512 u2 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 u3 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], _MM_SHUFFLE(3, 2, 3, 2));
    t[j] = _mm512_shuffle_f32x4(u0, u2, _MM_SHUFFLE(2, 0, 2, 0));
    t[4 + j] = _mm512_shuffle_f32x4(u0, u2, _MM_SHUFFLE(3, 1, 3, 1));
    t[8 + j] = _mm512_shuffle_f32x4(u1, u3, _MM_SHUFFLE(2, 0, 2, 0));
    t[12 + j] = _mm512_shuffle_f32x4(u1, u3, _MM_SHUFFLE(3, 1, 3, 1));
  }
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}

// Where the value at (r, c) sits, in either layout; the next 15 (c % 16 == 0) follow it.
template <WeightFormat F>
const uint8_t* float_weight_at(const WeightMatrix& w, int64_t r, int64_t c) {
  if (w.layout == WeightLayout::Interleaved) return interleaved_float_at(w, r, c);
  return w.data + r * w.row_stride + c * Widen<F>::kBytes;
}

// Rows [row, row + nr) (nr <= kPanelRows; the rest of the group is zero) over columns [k0, k0 + kk)
// into panel[c * kPanelRows + r], widened to float32.
template <WeightFormat F>
void pack_weight_panel(const WeightMatrix& w, int64_t row, int nr, int64_t k0, int64_t kk, float* panel) {
  using L = Widen<F>;
  for (int v = 0; v < kPanelVecs; ++v) {
    const int rows_here = std::clamp(nr - 16 * v, 0, 16);
    for (int64_t c = 0; c < kk; c += 16) {
      const int cols_here = int(std::min<int64_t>(16, kk - c));
      const __mmask16 m = __mmask16((1u << cols_here) - 1);
      __m512 r[16];
      for (int i = 0; i < 16; ++i) {
        if (i >= rows_here) {
          r[i] = _mm512_setzero_ps();
          continue;
        }
        const uint8_t* p = float_weight_at<F>(w, row + 16 * v + i, k0 + c);
        r[i] = cols_here == 16 ? L::full(p) : L::part(p, m);
      }
      transpose16(r);
      for (int i = 0; i < cols_here; ++i) _mm512_store_ps(panel + (c + i) * kPanelRows + 16 * v, r[i]);
    }
  }
}

// Tokens [t0, t0 + nt) (nt <= kPanelTokens; the rest zero) over columns [k0, k0 + kk) into
// out[c * kPanelTokens + t].
void pack_token_tile(const float* x, int64_t x_stride, int64_t t0, int nt, int64_t k0, int64_t kk, float* out) {
  constexpr __mmask16 kTileLanes = (1u << kPanelTokens) - 1;
  for (int64_t c = 0; c < kk; c += 16) {
    const int cols_here = int(std::min<int64_t>(16, kk - c));
    const __mmask16 m = __mmask16((1u << cols_here) - 1);
    __m512 r[16];
    for (int t = 0; t < 16; ++t)
      r[t] = t < nt ? _mm512_maskz_loadu_ps(m, x + (t0 + t) * x_stride + k0 + c) : _mm512_setzero_ps();
    transpose16(r);
    for (int i = 0; i < cols_here; ++i) _mm512_mask_storeu_ps(out + (c + i) * kPanelTokens, kTileLanes, r[i]);
  }
}

// y[t * y_stride + r] (+)= sum_c panel[c][r] * tile[c][t] for r < nr, t < nt.
void panel_tile(const float* panel, const float* tile, int64_t kk, float* y, int64_t y_stride, int nr, int nt,
                bool accumulate) {
  constexpr int V = kPanelVecs, T = kPanelTokens;
  // y usually comes from DRAM (one pass per column block): start its reads now, under the FMAs.
  for (int t = 0; t < nt; ++t)
    for (int v = 0; v < V && 16 * v < nr; ++v) _mm_prefetch((const char*)(y + t * y_stride + 16 * v), _MM_HINT_T0);
  __m512 acc[T][V];
  for (int t = 0; t < T; ++t)
    for (int v = 0; v < V; ++v) acc[t][v] = _mm512_setzero_ps();
#pragma GCC unroll 2
  for (int64_t c = 0; c < kk; ++c) {
    __m512 wv[V];
    for (int v = 0; v < V; ++v) wv[v] = _mm512_load_ps(panel + c * kPanelRows + 16 * v);
    for (int t = 0; t < T; ++t) {
      const __m512 xb = _mm512_set1_ps(tile[c * T + t]);
      for (int v = 0; v < V; ++v) acc[t][v] = _mm512_fmadd_ps(wv[v], xb, acc[t][v]);
    }
  }
  // Through memory with constant indices: indexing acc by the run-time nt below can make GCC keep
  // every accumulator on the stack inside the loop (it did in the AVX2 twin of this kernel).
  alignas(64) float sums[T][V][16];
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) _mm512_store_ps(sums[t][v], acc[t][v]);
  for (int v = 0; v < V; ++v) {
    const int rows_here = std::clamp(nr - 16 * v, 0, 16);
    if (rows_here == 0) break;
    const __mmask16 m = __mmask16((1u << rows_here) - 1);
    for (int t = 0; t < nt; ++t) {
      float* out = y + t * y_stride + 16 * v;
      const __m512 a = _mm512_load_ps(sums[t][v]);
      const __m512 sum = accumulate ? _mm512_add_ps(_mm512_maskz_loadu_ps(m, out), a) : a;
      _mm512_mask_storeu_ps(out, m, sum);
    }
  }
}

template <WeightFormat F>
PanelKernels panel_kernels() {
  PanelKernels k;
  k.group_rows = kPanelRows;
  k.tile_tokens = kPanelTokens;
  k.max_cols = kPanelBytes / (kPanelRows * int64_t(sizeof(float)));
  k.col_align = 16;
  k.pack_tokens = pack_token_tile;
  k.pack_weights = pack_weight_panel<F>;
  k.multiply = panel_tile;
  return k;
}

}  // namespace

void avx512_matvec_streams_float(std::span<const RowRun> runs, const float* x, int64_t x_stride, int64_t n) {
  for (size_t first = 0; first < runs.size(); first += kMatvecStreams) {  // more runs: kMatvecStreams at a time
    const auto some = runs.subspan(first, std::min(runs.size() - first, size_t(kMatvecStreams)));
    if (some[0].w->format == WeightFormat::BF16) matvec_streams<WeightFormat::BF16>(some, x, x_stride, n);
    else matvec_streams<WeightFormat::F16>(some, x, x_stride, n);
  }
}

void avx512_matmul_rows_float(const WeightMatrix& w, int64_t r0, int64_t r1, const float* x, int64_t x_stride,
                              int64_t n, float* y, int64_t y_stride) {
  static const TileSet f32 = make_tiles<WeightFormat::F32>();
  static const TileSet f16 = make_tiles<WeightFormat::F16>();
  static const TileSet bf16 = make_tiles<WeightFormat::BF16>();
  static const TileSet f32_decode = make_tiles<WeightFormat::F32, kDecodeRows, 2>();
  static const TileSet f16_decode = make_tiles<WeightFormat::F16, kDecodeRows, 2>();
  static const TileSet bf16_decode = make_tiles<WeightFormat::BF16, kDecodeRows, 2>();
  if (w.layout == WeightLayout::Interleaved && n < kPanelMinTokens) {
    static const TileSet f16i = make_interleaved_tiles<WeightFormat::F16, kInterleaveRows, kTileTokens>();
    static const TileSet bf16i = make_interleaved_tiles<WeightFormat::BF16, kInterleaveRows, kTileTokens>();
    static const TileSet f16i_l1 = make_interleaved_tiles<WeightFormat::F16, kInterleaveRows, kTileTokens, true>();
    static const TileSet bf16i_l1 = make_interleaved_tiles<WeightFormat::BF16, kInterleaveRows, kTileTokens, true>();
    static const TileSet f16i_decode = make_interleaved_tiles<WeightFormat::F16, kInterleaveRows, 2>();
    static const TileSet bf16i_decode = make_interleaved_tiles<WeightFormat::BF16, kInterleaveRows, 2>();
    static const TileSet f16i_decode_long = make_interleaved_tiles<WeightFormat::F16, 2 * kInterleaveRows, 2>();
    static const TileSet bf16i_decode_long = make_interleaved_tiles<WeightFormat::BF16, 2 * kInterleaveRows, 2>();
    const bool bf16_format = w.format == WeightFormat::BF16;
    const bool long_rows = w.cols * int64_t(sizeof(float)) > kOneGroupMaxActivationBytes;
    const bool into_l1 = prefetch_tuning().batch_into_l1;
    const TileSet& tiles = n > 2         ? (bf16_format ? (into_l1 ? bf16i_l1 : bf16i) : (into_l1 ? f16i_l1 : f16i))
                           : long_rows ? (bf16_format ? bf16i_decode_long : f16i_decode_long)
                                       : (bf16_format ? bf16i_decode : f16i_decode);
    return tiled_matmul(tiles, w, r0, r1, reinterpret_cast<const uint8_t*>(x), x_stride * 4, n, y, y_stride);
  }
  if (n <= 2) {
    const TileSet& tiles =
        w.format == WeightFormat::F32 ? f32_decode : w.format == WeightFormat::F16 ? f16_decode : bf16_decode;
    return tiled_matmul(tiles, w, r0, r1, reinterpret_cast<const uint8_t*>(x), x_stride * 4, n, y, y_stride);
  }
  if (n >= kPanelMinTokens && w.cols > 0) {  // no columns: tiled_matmul writes the zeros
    static const PanelKernels f32p = panel_kernels<WeightFormat::F32>();
    static const PanelKernels f16p = panel_kernels<WeightFormat::F16>();
    static const PanelKernels bf16p = panel_kernels<WeightFormat::BF16>();
    const PanelKernels& k = w.format == WeightFormat::F32 ? f32p : w.format == WeightFormat::F16 ? f16p : bf16p;
    return panel_matmul(k, w, r0, r1, x, x_stride, n, y, y_stride);
  }
  const TileSet& tiles = w.format == WeightFormat::F32 ? f32 : w.format == WeightFormat::F16 ? f16 : bf16;
  tiled_matmul(tiles, w, r0, r1, reinterpret_cast<const uint8_t*>(x), x_stride * 4, n, y, y_stride);
}

}  // namespace tandem::cpu::detail

#pragma GCC diagnostic pop
#pragma GCC pop_options
