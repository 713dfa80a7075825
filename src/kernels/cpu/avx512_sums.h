#pragma once
// Helpers shared by the AVX-512 kernels whose tiles keep 16-lane float sums per dot product in L1
// (the VNNI panels and interleaved tiles). Include inside the including file's AVX-512 target
// pragma; the functions are inline and compiled for that target.
#include <immintrin.h>


namespace tandem::cpu::detail {
namespace {  // each including file its own copy, compiled for its target

// The sums of four 16-lane vectors, in that order: 9 shuffles/permutes and 5 adds for four
// totals, against 4 x (4 shuffles + 4 adds) for four _mm512_reduce_add_ps.
inline __m128 reduce4_ps(__m512 a, __m512 b, __m512 c, __m512 d) {
  // 128-bit quarters [a0 + a2, a1 + a3, b0 + b2, b1 + b3], and the same for c, d
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xee));
  const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xee));
  // quarter i: four partial sums of vector i
  const __m512 q = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xdd));
  const __m512 pairs = _mm512_add_ps(q, _mm512_permute_ps(q, 0xb1));  // lanes (0+1, 0+1, 2+3, 2+3)
  const __m512 total = _mm512_add_ps(pairs, _mm512_permute_ps(pairs, 0x4e));
  const __m512i firsts = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_castps512_ps128(_mm512_permutexvar_ps(firsts, total));
}

// totals[i] = the sum of the 16 floats at sums + 16 i, for i < N (totals holds N rounded up to 4).
template <int N>
inline void reduce_sums(const float* sums, float* totals) {
  const auto at = [&](int i) { return i < N ? _mm512_load_ps(sums + 16 * i) : _mm512_setzero_ps(); };
#pragma GCC unroll 16
  for (int i = 0; i < N; i += 4) _mm_storeu_ps(totals + i, reduce4_ps(at(i), at(i + 1), at(i + 2), at(i + 3)));
}

// One chunk's 16 block sums of one dot product, scaled and added to its float sums. The first chunk
// of a tile call stores instead of adding, so the sums need no zeroing.
template <bool First>
inline void add_block_sums(float* sums, __m512i block_sums, __m512 scales) {
  const __m512 v = _mm512_cvtepi32_ps(block_sums);
  _mm512_store_ps(sums, First ? _mm512_mul_ps(v, scales) : _mm512_fmadd_ps(v, scales, _mm512_load_ps(sums)));
}

}  // namespace
}  // namespace tandem::cpu::detail
