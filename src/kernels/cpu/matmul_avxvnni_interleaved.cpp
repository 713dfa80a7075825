// matmul_avx2_interleaved.cpp (read that first) with AVX-VNNI, the VEX-encoded vpdpbusd of CPUs
// that have it without AVX512-VNNI (Intel's client cores since Alder Lake and its E-core Xeons):
// four byte products of a lane summed into its int32 in one instruction, where vpmaddubsw needs
// a vpmaddwd and an add after it, and Q8 its sign trick besides. The weights multiply as stored
// (unsigned: Q8 q + 128, Q4 q + 8) and each half chunk starts from the activations' corrections,
// -8 x the sum of each block's codes (avx2_panel_quantize, PanelCorrections::DpbusdBlockSums;
// times 16 for Q8). The int32 block sums are those of the vpmaddubsw kernel, so the results are
// the same to the bit.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/prefetch_tuning.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avxvnni")

#include "kernels/cpu/avx2_quant_helpers.h"

namespace tandem::cpu::detail {

namespace {

template <WeightFormat F>
struct HalfVector;

inline __m256i half_corrections(const uint8_t* x, int h) {
  return _mm256_load_si256((const __m256i*)(x + kActivationCorrections + 32 * h));
}

// Q4: the nibbles of vector k are the codes of vectors k (low) and k + 4 (high) of the activations.
template <>
struct HalfVector<WeightFormat::Q4> {
  static constexpr int kVectors = 4;
  __m256i lo, hi;

  explicit HalfVector(const uint8_t* codes) {
    const __m256i nibble = _mm256_set1_epi8(0x0f), v = _mm256_loadu_si256((const __m256i*)codes);
    lo = _mm256_and_si256(v, nibble);
    hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
  }
  __m256i add_to(__m256i acc, const uint8_t* x, int k, int h) const {
    acc = add_dpbusd(acc, lo, *reinterpret_cast<const __m256i*>(x + 64 * k + 32 * h));
    return add_dpbusd(acc, hi, *reinterpret_cast<const __m256i*>(x + 64 * (k + 4) + 32 * h));
  }
  static __m256i initial(const uint8_t* x, int h) { return half_corrections(x, h); }
  static __m256i block_sums(__m256i acc) { return acc; }
};

// Q8: q + 128 as stored.
template <>
struct HalfVector<WeightFormat::Q8> {
  static constexpr int kVectors = 8;
  __m256i q;

  explicit HalfVector(const uint8_t* codes) : q(_mm256_loadu_si256((const __m256i*)codes)) {}
  __m256i add_to(__m256i acc, const uint8_t* x, int k, int h) const {
    return add_dpbusd(acc, q, *reinterpret_cast<const __m256i*>(x + 64 * k + 32 * h));
  }
  static __m256i initial(const uint8_t* x, int h) { return _mm256_slli_epi32(half_corrections(x, h), 4); }
  static __m256i block_sums(__m256i acc) { return acc; }
};

}  // namespace

}  // namespace tandem::cpu::detail

#include "kernels/cpu/avx2_interleaved_tiles.h"

namespace tandem::cpu::detail {

void avxvnni_interleaved_matmul(const WeightMatrix& w, int64_t r0, int64_t r1, const uint8_t* xq, int64_t xq_stride,
                                int64_t n, float* y, int64_t y_stride) {
  interleaved_matmul_by_format(w, r0, r1, xq, xq_stride, n, y, y_stride);
}

}  // namespace tandem::cpu::detail

#pragma GCC pop_options
