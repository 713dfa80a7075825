#pragma once
// Helpers shared by the AVX2 quantized kernels (matmul_avx2_quant.cpp, matmul_avx2_quant_panel.cpp,
// matmul_avx2_interleaved.cpp) and their AVX-VNNI forms (matmul_avxvnni_*.cpp).
// Include inside the including file's AVX2 target pragma, after every standard header: the
// functions are compiled for that target, and the anonymous namespace gives each file its own copy,
// so the linker never mixes them with another ISA's.
#include <immintrin.h>

#include <cstdint>

namespace tandem::cpu::detail {
namespace {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline int32_t hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

// One block of 32 activations as int8 codes in column order, with its scale and code sum.
struct QuantizedBlock {
  __m256i codes;
  float scale;
  int32_t sum;
};

// Scale max|x| / 127, codes rounded to nearest even, as every other quantized path.
inline QuantizedBlock quantize_block(const float* x) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 v[4];
  __m256 m = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_loadu_ps(x + 8 * i);
    m = _mm256_max_ps(m, _mm256_and_ps(v[i], abs_mask));
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  const float amax = _mm_cvtss_f32(m4);
  const __m256 inv = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
  __m256i q[4];
  for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));  // nearest even
  const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
  QuantizedBlock b;
  b.codes = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  b.scale = amax / 127.0f;
  b.sum = hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
  return b;
}

// The panel activation layout (matmul_avx2_quant_panel.cpp), per 512 columns: 8 x 64 codes,
// 16 float scales, 16 corrections (Q4's int16 word pairs, or for vpdpbusd int32 block sums:
// PanelCorrections in isa_kernels.h).
constexpr int64_t kActivationChunkCols = 512, kActivationChunkBytes = 640;  // two panel chunks
constexpr int64_t kActivationVectorBytes = 64, kActivationScales = 512, kActivationCorrections = 576;

// acc + vpmaddubsw(u, s) in int16 lanes (u unsigned bytes, s signed), as one asm step. Written
// with intrinsics, GCC issued all 9 products of a 3 x 3 tile before their adds, ran out of
// registers and kept two accumulators on the stack: every k step then waited on a store and a
// reload of each (perf annotate, Zen 3: 17% of the tile's samples on one vpaddw). Volatile keeps
// the steps in program order, so one temporary serves them all; the core reorders them itself.
// s may stay in memory (the activations, read straight from L1).
inline __m256i add_products(__m256i acc, __m256i u, const __m256i& s) {
  __m256i p;
  asm volatile("vpmaddubsw %[s], %[u], %[p]\n\tvpaddw %[p], %[acc], %[acc]"
               : [acc] "+x"(acc), [p] "=&x"(p)
               : [u] "x"(u), [s] "xm"(s));
  return acc;
}

// acc + the int32 pair sums of |w| times x with w's signs (Q8), as one asm step for the same
// reason; w and the ones may stay in memory (L1), which leaves a 3 x 3 tile's 9 accumulators,
// 3 |w|, x and the temporary in registers.
inline __m256i add_signed_products(__m256i acc, __m256i abs_w, const __m256i& w, __m256i x, const __m256i& ones) {
  __m256i p;
  asm volatile(
      "vpsignb %[w], %[x], %[p]\n\t"
      "vpmaddubsw %[p], %[abs_w], %[p]\n\t"
      "vpmaddwd %[ones], %[p], %[p]\n\t"
      "vpaddd %[p], %[acc], %[acc]"
      : [acc] "+x"(acc), [p] "=&x"(p)
      : [abs_w] "x"(abs_w), [w] "xm"(w), [x] "x"(x), [ones] "xm"(ones));
  return acc;
}

// acc + vpdpbusd(u, s): each int32 lane plus its four products of unsigned bytes u by signed bytes
// s, as one asm step (AVX-VNNI's VEX form; call it only from files compiled for avxvnni). Written
// with the intrinsic, GCC copied the accumulators between registers and spilled two of a 3 x 3
// tile at every step, as with vpmaddubsw above.
inline __m256i add_dpbusd(__m256i acc, __m256i u, const __m256i& s) {
  asm volatile("%{vex%} vpdpbusd %[s], %[u], %[acc]" : [acc] "+x"(acc) : [u] "x"(u), [s] "xm"(s));
  return acc;
}

}  // namespace
}  // namespace tandem::cpu::detail
