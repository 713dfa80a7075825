// AVX2 matmul for quantized weights in WeightLayout::Interleaved (kernels/weight.h), any number of
// tokens: the AVX2 counterpart of matmul_avx512_vnni_interleaved.cpp, for CPUs without
// AVX512-VNNI. Activations are in the panel layout of matmul_avx2_quant_panel.cpp, whose vector k
// of a 512-column chunk has the order of the weights' vector k (lane j: block j).
//
// Tiles of up to 8 tokens pass over each row group, and each token's arithmetic is exactly its
// arithmetic alone, so a sequence's logits do not depend on what else is in its batch. From 16
// tokens on the panels packed from the row groups take over, as for plain weights and the VNNI
// kernels (matmul_avx2_quant.cpp).
//   Q4 (stored q + 8): the nibbles times x, vpmaddubsw results added as int16 over a row's half
//       chunk from the activations' word corrections (matmul_avx2_quant_panel.cpp), one vpmaddwd
//       per half chunk.
//   Q8 (stored q + 128): flipped back to signed, then |w| times x with w's sign (as the panels:
//       vpsignb, vpmaddubsw, vpmaddwd, add per 32 multiply-adds; q + 128 itself times x would
//       overflow vpmaddubsw's int16 pairs).
// Either way a half chunk leaves one int32 sum per block and token, converted and scaled once.
// The tiles themselves are avx2_interleaved_tiles.h, shared with matmul_avxvnni_interleaved.cpp.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/prefetch_tuning.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

#include "kernels/cpu/avx2_quant_helpers.h"

namespace tandem::cpu::detail {

namespace {

// One 32-byte half of a row's 64-byte code vector, prepared once for every token of a tile.
template <WeightFormat F>
struct HalfVector;

// Q4: the nibbles of vector k are the codes of vectors k (low) and k + 4 (high) of the activations.
template <>
struct HalfVector<WeightFormat::Q4> {
  static constexpr int kVectors = 4;  // 64-byte code vectors per row and chunk
  __m256i lo, hi;

  explicit HalfVector(const uint8_t* codes) {
    const __m256i nibble = _mm256_set1_epi8(0x0f), v = _mm256_loadu_si256((const __m256i*)codes);
    lo = _mm256_and_si256(v, nibble);
    hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
  }
  // acc + these codes times a token's (x: its activations of the chunk; vector k, half h).
  __m256i add_to(__m256i acc, const uint8_t* x, int k, int h) const {
    acc = add_products(acc, lo, *reinterpret_cast<const __m256i*>(x + 64 * k + 32 * h));
    return add_products(acc, hi, *reinterpret_cast<const __m256i*>(x + 64 * (k + 4) + 32 * h));
  }
  // A half chunk's accumulator before the first vector: the token's word corrections
  // (matmul_avx2_quant_panel.cpp, q4_word_corrections), and after the last: its 8 blocks' sums.
  static __m256i initial(const uint8_t* x, int h) {
    return _mm256_load_si256((const __m256i*)(x + kActivationCorrections + 32 * h));
  }
  static __m256i block_sums(__m256i acc) { return _mm256_madd_epi16(acc, _mm256_set1_epi16(1)); }
};

// Q8: q + 128 flipped back to q, and |q| for the sign trick.
template <>
struct HalfVector<WeightFormat::Q8> {
  static constexpr int kVectors = 8;
  __m256i q, abs_q;

  explicit HalfVector(const uint8_t* codes) {
    q = _mm256_xor_si256(_mm256_loadu_si256((const __m256i*)codes), _mm256_set1_epi8(char(0x80)));
    abs_q = _mm256_abs_epi8(q);
  }
  __m256i add_to(__m256i acc, const uint8_t* x, int k, int h) const {
    const __m256i xv = _mm256_load_si256((const __m256i*)(x + 64 * k + 32 * h));
    return add_signed_products(acc, abs_q, q, xv, _mm256_set1_epi16(1));
  }
  static __m256i initial(const uint8_t*, int) { return _mm256_setzero_si256(); }
  static __m256i block_sums(__m256i acc) { return acc; }
};

}  // namespace

}  // namespace tandem::cpu::detail

#include "kernels/cpu/avx2_interleaved_tiles.h"

namespace tandem::cpu::detail {

void avx2_interleaved_matmul(const WeightMatrix& w, int64_t r0, int64_t r1, const uint8_t* xq, int64_t xq_stride,
                             int64_t n, float* y, int64_t y_stride) {
  interleaved_matmul_by_format(w, r0, r1, xq, xq_stride, n, y, y_stride);
}

}  // namespace tandem::cpu::detail

#pragma GCC pop_options
