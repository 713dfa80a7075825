#pragma once
// The tiles of the AVX2 kernels for interleaved Q8/Q4 weights, shared by matmul_avx2_interleaved.cpp
// (vpmaddubsw) and matmul_avxvnni_interleaved.cpp (AVX-VNNI's vpdpbusd). Each file defines, in an
// anonymous namespace of tandem::cpu::detail and before including this inside its target pragma,
// HalfVector<Q8> and HalfVector<Q4>: one 32-byte half of a row's 64-byte code vector, with
//   kVectors                the row's 64-byte code vectors per 512-column chunk;
//   add_to(acc, x, k, h)    acc plus these codes times a token's activations (vector k, half h);
//   initial(x, h)           a half chunk's accumulator before the first vector;
//   block_sums(acc)         and after the last: the token's int32 sums of the 8 blocks (lane j:
//                           block 8h + j).
// The templates below then compile for that file's instruction set; like everything of a SIMD
// file they stay in its anonymous namespace (kernels/cpu/isa_kernels.h). Include it as
// avx2_quant_helpers.h, after every standard header, isa_kernels.h and prefetch_tuning.h.

namespace tandem::cpu::detail {

namespace {
// One half (blocks 8h..8h+7) of row i's chunk, for T >= 3 tokens: each token's int32 sums of the 8
// blocks. p: the group's chunk (G rows); xc: the tokens' activations of the chunk. The vectors in
// order and not unrolled, the products added in asm steps (add_products): with all 2G
// accumulators of a token live, or the vectors unrolled, or plain intrinsics for 8 tokens, GCC
// computed every product first and spilled them.
template <WeightFormat F, int G, int T>
void half_chunk_sums(const uint8_t* p, int i, int h, const uint8_t* xc, int64_t x_stride, __m256i (&sums)[T]) {
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) sums[t] = HalfVector<F>::initial(xc + t * x_stride, h);
#pragma GCC unroll 1
  for (int k = 0; k < HalfVector<F>::kVectors; ++k) {
    const HalfVector<F> codes(p + 64 * (k * G + i) + 32 * h);
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) sums[t] = codes.add_to(sums[t], xc + t * x_stride, k, h);
  }
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) sums[t] = HalfVector<F>::block_sums(sums[t]);
}

// The int32 block sums of rows [i0, i0 + P) of a group's chunk (both halves) for T = 1 or 2
// tokens, read in address order: vector k of each of those rows, then k + 1. For one token P
// covers the whole group and the chunk is read as a plain read. The half-at-a-time order above
// jumps 64 G bytes per step and comes back for the other half, and one or two tokens have too
// little work per byte for the core to hide that (E4B q8 decode on two Zen 3 cores, roofline
// 0.62-0.73 against 0.68-0.78 plain; in address order 0.65-0.72 against 0.63-0.67). The sums are
// the same integers in any order, so a token's result does not depend on which order computed it.
template <WeightFormat F, int G, int T, int P>
void ordered_chunk_sums(const uint8_t* p, int i0, const uint8_t* xc, int64_t x_stride, __m256i (&sums)[P][2][T]) {
#pragma GCC unroll 4
  for (int i = 0; i < P; ++i)
#pragma GCC unroll 2
    for (int t = 0; t < T; ++t) {
      sums[i][0][t] = HalfVector<F>::initial(xc + t * x_stride, 0);
      sums[i][1][t] = HalfVector<F>::initial(xc + t * x_stride, 1);
    }
  const auto step = [&](int k) __attribute__((always_inline)) {
#pragma GCC unroll 4
    for (int i = 0; i < P; ++i)
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        if (i0 + i >= G) continue;
        const HalfVector<F> codes(p + 64 * (k * G + i0 + i) + 32 * h);
#pragma GCC unroll 2
        for (int t = 0; t < T; ++t) sums[i][h][t] = codes.add_to(sums[i][h][t], xc + t * x_stride, k, h);
      }
  };
  if constexpr (F == WeightFormat::Q4) {  // all four vectors unrolled; Q8's eight not
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) step(k);
  } else {
#pragma GCC unroll 1
    for (int k = 0; k < 8; ++k) step(k);
  }
#pragma GCC unroll 4
  for (int i = 0; i < P; ++i)
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h)
#pragma GCC unroll 2
      for (int t = 0; t < T; ++t) sums[i][h][t] = HalfVector<F>::block_sums(sums[i][h][t]);
}

// T tokens times a group of G interleaved rows, whose chunks are one sequential stream; the float
// sums of a row's 16 blocks wait in L1 until the end.
template <WeightFormat F, int G, int T>
void interleaved_group(const WeightMatrix& w, int64_t first_row, const uint8_t* x, int64_t x_stride,
                       float (&out)[T][kInterleaveRows]) {
  constexpr int64_t kVectors = HalfVector<F>::kVectors;
  constexpr int64_t kRowChunkBytes = 64 * kVectors + 32;  // and 16 f16 scales
  const int64_t chunks = w.cols / kActivationChunkCols;
  const uint8_t* p = interleaved_group_chunk(w, first_row, 0);
  // Float sums of each token's rows, blocks 0-7 and 8-15: in registers for one token, on the
  // stack for more.
  __m256 sums[T][G][2];
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < G; ++i) sums[t][i][0] = sums[t][i][1] = _mm256_setzero_ps();
  for (int64_t ch = 0; ch < chunks; ++ch, p += G * kRowChunkBytes) {
    const uint8_t* xc = x + ch * kActivationChunkBytes;
    // The chunk after next, a line at a time: in the half-at-a-time order (row by row, jumping
    // between vectors) the hardware prefetchers fell behind (one Zen 3 core, E4B shapes, Q4: 12
    // GB/s without, 15-17 with); in address order (one or two tokens) it made no measurable
    // difference, nor did prefetching 4 or 8 chunks ahead, or into L2.
    for (int64_t l = 0; l < (G * kRowChunkBytes + 63) / 64; ++l)
      _mm_prefetch((const char*)(p + 2 * G * kRowChunkBytes + 64 * l), _MM_HINT_T0);
    const auto add_scaled = [&](int i, int h, const __m256i (&block_sums)[T]) __attribute__((always_inline)) {
      const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p + 64 * kVectors * G + 32 * i + 16 * h)));
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        const float* scales = reinterpret_cast<const float*>(xc + t * x_stride + kActivationScales);
        const __m256 dx = _mm256_load_ps(scales + 8 * h);
        sums[t][i][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(block_sums[t]), _mm256_mul_ps(dw, dx), sums[t][i][h]);
      }
    };
    if constexpr (T <= 2) {
      constexpr int P = 4 / T;  // rows per pass: 8 accumulators
#pragma GCC unroll 2
      for (int i0 = 0; i0 < G; i0 += P) {
        __m256i block_sums[P][2][T];
        ordered_chunk_sums<F, G, T, P>(p, i0, xc, x_stride, block_sums);
#pragma GCC unroll 4
        for (int i = 0; i < P; ++i)
#pragma GCC unroll 2
          for (int h = 0; h < 2; ++h)
            if (i0 + i < G) add_scaled(i0 + i, h, block_sums[i][h]);
      }
    } else {
#pragma GCC unroll 4
      for (int i = 0; i < G; ++i)
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {
          __m256i block_sums[T];
          half_chunk_sums<F, G, T>(p, i, h, xc, x_stride, block_sums);
          add_scaled(i, h, block_sums);
        }
    }
  }
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < G; ++i)
      out[t][i] = hsum(_mm256_add_ps(sums[t][i][0], sums[t][i][1]));
}

// One token's float sums over S whole row groups at rows g[0..S) (S streams), blocks 0-7 and 8-15
// of each row, shared by the two walks below, which differ only in the order they read the codes:
// each adds a chunk's int32 block sums exactly as interleaved_group does for one token.
template <WeightFormat F, int S>
struct StreamSums {
  static constexpr int G = kInterleaveRows;
  static constexpr int64_t kVectors = HalfVector<F>::kVectors;
  static constexpr int64_t kRowChunkBytes = 64 * kVectors + 32;  // and 16 f16 scales
  const uint8_t* groups[S];
  __m256 sums[S][G][2];

  StreamSums(const WeightMatrix& w, const int64_t (&g)[S]) {
    for (int s = 0; s < S; ++s) {
      groups[s] = interleaved_group_chunk(w, g[s], 0);
      for (int i = 0; i < G; ++i) sums[s][i][0] = sums[s][i][1] = _mm256_setzero_ps();
    }
  }
  // Stream s's chunk ch: the group's code vectors, then its rows' scales.
  const uint8_t* chunk(int s, int64_t ch) const { return groups[s] + ch * G * kRowChunkBytes; }
  static const uint8_t* scales(const uint8_t* chunk) { return chunk + 64 * kVectors * G; }
  // Row i's half h of stream s's chunk p: its 8 blocks' sums scaled by theirs and the token's.
  void add(int s, int i, int h, const uint8_t* p, __m256i block_sums, const float* x_scales) {
    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(scales(p) + 32 * i + 16 * h)));
    sums[s][i][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(block_sums), _mm256_mul_ps(dw, _mm256_load_ps(x_scales + 8 * h)),
                                    sums[s][i][h]);
  }
  void finish(float (&out)[S][G]) const {
    for (int s = 0; s < S; ++s)
      for (int i = 0; i < G; ++i) out[s][i] = hsum(_mm256_add_ps(sums[s][i][0], sums[s][i][1]));
  }
};

// The S streams read a chunk of each in turn and left to the hardware prefetchers (Zen 3). (A
// single function for this and interleaved_group, with S = 1 for the batches, compiled 8-token
// tiles 10-30% slower.)
template <WeightFormat F, int S>
void interleaved_streams(const WeightMatrix& w, const int64_t (&g)[S], const uint8_t* x,
                         float (&out)[S][kInterleaveRows]) {
  constexpr int G = kInterleaveRows;
  StreamSums<F, S> sums(w, g);
  for (int64_t ch = 0; ch < w.cols / kActivationChunkCols; ++ch) {
    const uint8_t* xc = x + ch * kActivationChunkBytes;
    const float* x_scales = reinterpret_cast<const float*>(xc + kActivationScales);
    for (int s = 0; s < S; ++s) {
      const uint8_t* p = sums.chunk(s, ch);
      __m256i block_sums[G][2][1];
      ordered_chunk_sums<F, G, 1, G>(p, 0, xc, 0, block_sums);
#pragma GCC unroll 4
      for (int i = 0; i < G; ++i)
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) sums.add(s, i, h, p, block_sums[i][h][0], x_scales);
    }
  }
  sums.finish(out);
}

// The S streams taken a code vector of each in turn (every row of each group, then the next
// vector), each line prefetched into L1 `ahead` bytes on in its stream as it is loaded (the scales'
// lines as the chunk starts): the walk of the AVX-512 streams (matmul_avx512_vnni_interleaved.cpp).
// The sums are the same integers, added through the same StreamSums, so every row's result is the
// chunk walk's. The S x 4 x 2 accumulators outgrow the 16 registers and wait in L1 between vectors,
// as the AVX-512 walk's do.
// Intel Xeon (AMX, KVM guest), two threads, `kernels_bench Matvec/q[48]i` under TANDEM_ISA=avx2
// (us, two alternated runs): the chunk walk with each chunk's lines prefetched 2 KB ahead as it
// starts, Q8 10240 x 2560 946-947, 2560 x 10240 951-976, Q4 464-470 / 449-461; this walk 2 KB ahead
// 752-768 / 761-771, Q4 412-423 / 404-408 (1 KB ahead 818-843, 4 KB 844-943; 2 or 4 streams about
// the same as 3). E4B decode at 512-576 positions, roofline (runs alternated, twice): AVX2 q8
// 0.748-0.758 -> 0.895-0.91, q4 0.801-0.807 -> 0.891-0.905; AVX-VNNI q8 0.806-0.823 -> 0.905-0.915,
// q4 0.843-0.855 -> 0.91-0.93.
template <WeightFormat F, int S>
void interleaved_streams_by_vector(const WeightMatrix& w, const int64_t (&g)[S], const uint8_t* x, int64_t ahead,
                                   float (&out)[S][kInterleaveRows]) {
  constexpr int G = kInterleaveRows;
  StreamSums<F, S> sums(w, g);
  for (int64_t ch = 0; ch < w.cols / kActivationChunkCols; ++ch) {
    const uint8_t* xc = x + ch * kActivationChunkBytes;
    const float* x_scales = reinterpret_cast<const float*>(xc + kActivationScales);
    const uint8_t* p[S];
    __m256i acc[S][G][2];
    for (int s = 0; s < S; ++s) {
      p[s] = sums.chunk(s, ch);
      for (int i = 0; i < G; ++i) {
        acc[s][i][0] = HalfVector<F>::initial(xc, 0);
        acc[s][i][1] = HalfVector<F>::initial(xc, 1);
      }
      // The scales' lines, which the vectors' prefetches step over.
      for (int64_t b = 0; b < 32 * G; b += 64)
        _mm_prefetch(reinterpret_cast<const char*>(StreamSums<F, S>::scales(p[s]) + b + ahead), _MM_HINT_T0);
    }
#pragma GCC unroll 1
    for (int k = 0; k < HalfVector<F>::kVectors; ++k) {
#pragma GCC unroll 4
      for (int j = 0; j < S * G; ++j) {
        const int s = j / G, i = j % G;
        const uint8_t* v = p[s] + 64 * (k * G + i);
        _mm_prefetch(reinterpret_cast<const char*>(v + ahead), _MM_HINT_T0);
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {
          const HalfVector<F> codes(v + 32 * h);
          acc[s][i][h] = codes.add_to(acc[s][i][h], xc, k, h);
        }
      }
    }
    for (int s = 0; s < S; ++s)
#pragma GCC unroll 4
      for (int i = 0; i < G; ++i)
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) sums.add(s, i, h, p[s], HalfVector<F>::block_sums(acc[s][i][h]), x_scales);
  }
  sums.finish(out);
}

// T tokens times the row group starting at g0; stores the rows in [r0, r1).
template <WeightFormat F, int T>
void interleaved_tokens(const WeightMatrix& w, int64_t g0, int64_t r0, int64_t r1, const uint8_t* x, int64_t x_stride,
                        float* y, int64_t y_stride) {
  const int64_t rows = interleaved_group_rows(w, g0);
  float out[T][kInterleaveRows];
  switch (rows) {
    case 4: interleaved_group<F, 4, T>(w, g0, x, x_stride, out); break;
    case 3: interleaved_group<F, 3, T>(w, g0, x, x_stride, out); break;
    case 2: interleaved_group<F, 2, T>(w, g0, x, x_stride, out); break;
    default: interleaved_group<F, 1, T>(w, g0, x, x_stride, out); break;
  }
  for (int t = 0; t < T; ++t)
    for (int64_t i = std::max<int64_t>(r0 - g0, 0); i < std::min<int64_t>(rows, r1 - g0); ++i)
      y[t * y_stride + g0 + i] = out[t][i];
}

constexpr int64_t kTileTokens = 8;

// One token reads a range's groups as this many streams: the range in kStreams parts, group i of
// each part in turn, a chunk of each (1152 bytes for Q4, 2176 for Q8) at a time. A Zen 3 core
// reads two or more streams faster than one (plain reads alternating between two streams in runs
// of 18 lines: one core 20.0 -> 22.7 GB/s, two 26.7 -> 28.5), and this kernel more so (`kernels_bench
// Matvec/q[48]i`, one core, GB/s: Q4 19 -> 22 / 24 / 23 with 2 / 3 / 4 streams, Q8 17 -> 22 / 23 / 22;
// E4B decode in docs/kernels.md (14)). Two tokens read slower this way (`Prefill/q4i` at 2 tokens,
// two cores: 195-204 -> 148-150 GFLOP/s), so they keep one stream. Where prefetch_tuning() asks
// for software prefetches (Intel) the streams go a vector of each at a time instead
// (interleaved_streams_by_vector).
constexpr int kStreams = 3;
// Each stream's results wait in L1 and go to y kStagedSteps groups at a time, as in the AVX-512
// streams (matmul_avx512_vnni_interleaved.cpp): E4B q4 decode on the AVX-VNNI table of an Intel
// Xeon (`TANDEM_ISA=avx2vnni tandem bench`, 64-112 positions, runs alternated) read 0.831-0.832 of
// the probe with each group's rows stored straight into y and 0.854-0.855 staged.
constexpr int64_t kStagedSteps = 32;

// One token times the groups of [r0, r1) as kStreams streams. Each row's arithmetic is the
// one-stream kernel's, so the results are the same.
template <WeightFormat F>
void streamed_matmul(const WeightMatrix& w, int64_t r0, int64_t r1, const uint8_t* xq, float* y) {
  const int64_t ahead = prefetch_tuning().avx2_decode_ahead;  // 0: the chunk walk
  const int64_t g_first = r0 / kInterleaveRows * kInterleaveRows;
  const int64_t groups = (r1 - g_first + kInterleaveRows - 1) / kInterleaveRows, part = groups / kStreams;
  // Only the matrix's last group can be short; it then goes alone, with the whole step it is in.
  const bool short_last = interleaved_group_rows(w, g_first + (groups - 1) * kInterleaveRows) < kInterleaveRows;
  const int64_t steps = part - (short_last && groups % kStreams == 0 ? 1 : 0);
  const auto group = [&](int64_t i) { return g_first + i * kInterleaveRows; };
  float staged[kStreams][kStagedSteps * kInterleaveRows];
  for (int64_t i = 0; i < steps; ++i) {
    int64_t g[kStreams];
    for (int s = 0; s < kStreams; ++s) g[s] = group(i + s * part);
    float out[kStreams][kInterleaveRows];
    if (ahead) interleaved_streams_by_vector<F, kStreams>(w, g, xq, ahead, out);
    else interleaved_streams<F, kStreams>(w, g, xq, out);
    const int64_t slot = i % kStagedSteps;
    for (int s = 0; s < kStreams; ++s) std::memcpy(staged[s] + slot * kInterleaveRows, out[s], sizeof out[s]);
    if (slot < kStagedSteps - 1 && i < steps - 1) continue;
    for (int s = 0; s < kStreams; ++s) {
      const int64_t first = g[s] - slot * kInterleaveRows;  // the first row staged for this stream
      const int64_t lo = std::max(first, r0), hi = std::min(g[s] + kInterleaveRows, r1);
      if (hi > lo) std::memcpy(y + lo, staged[s] + (lo - first), sizeof(float) * size_t(hi - lo));
    }
  }
  for (int s = 0; s < kStreams; ++s)
    for (int64_t i = steps; i < part; ++i) interleaved_tokens<F, 1>(w, group(i + s * part), r0, r1, xq, 0, y, 0);
  for (int64_t i = kStreams * part; i < groups; ++i) interleaved_tokens<F, 1>(w, group(i), r0, r1, xq, 0, y, 0);
}

template <WeightFormat F>
void interleaved_matmul(const WeightMatrix& w, int64_t r0, int64_t r1, const uint8_t* xq, int64_t xq_stride, int64_t n,
                        float* y, int64_t y_stride) {
  if (n == 1) return streamed_matmul<F>(w, r0, r1, xq, y);
  // A whole group at a time, the tokens over it in tiles of up to 8 while its rows sit in L1/L2;
  // rows of a group outside [r0, r1) are computed and not stored.
  for (int64_t g0 = r0 / kInterleaveRows * kInterleaveRows; g0 < r1; g0 += kInterleaveRows) {
    for (int64_t t = 0; t < n; t += kTileTokens) {
      const uint8_t* x = xq + t * xq_stride;
      float* yt = y + t * y_stride;
      switch (std::min<int64_t>(kTileTokens, n - t)) {
        case 8: interleaved_tokens<F, 8>(w, g0, r0, r1, x, xq_stride, yt, y_stride); break;
        case 7: interleaved_tokens<F, 7>(w, g0, r0, r1, x, xq_stride, yt, y_stride); break;
        case 6: interleaved_tokens<F, 6>(w, g0, r0, r1, x, xq_stride, yt, y_stride); break;
        case 5: interleaved_tokens<F, 5>(w, g0, r0, r1, x, xq_stride, yt, y_stride); break;
        case 4: interleaved_tokens<F, 4>(w, g0, r0, r1, x, xq_stride, yt, y_stride); break;
        case 3: interleaved_tokens<F, 3>(w, g0, r0, r1, x, xq_stride, yt, y_stride); break;
        case 2: interleaved_tokens<F, 2>(w, g0, r0, r1, x, xq_stride, yt, y_stride); break;
        default: interleaved_tokens<F, 1>(w, g0, r0, r1, x, xq_stride, yt, y_stride); break;
      }
    }
  }
}

// Q8 or Q4, by the weights' format: each file's exported entry point.
void interleaved_matmul_by_format(const WeightMatrix& w, int64_t r0, int64_t r1, const uint8_t* xq,
                                  int64_t xq_stride, int64_t n, float* y, int64_t y_stride) {
  if (w.format == WeightFormat::Q8)
    interleaved_matmul<WeightFormat::Q8>(w, r0, r1, xq, xq_stride, n, y, y_stride);
  else
    interleaved_matmul<WeightFormat::Q4>(w, r0, r1, xq, xq_stride, n, y, y_stride);
}

}  // namespace

}  // namespace tandem::cpu::detail
