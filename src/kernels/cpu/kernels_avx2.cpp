// AVX2 + FMA + F16C kernels: the elementwise ones here, matmul in matmul_avx2.cpp (float weights)
// and matmul_avx2_quant.cpp (quantized weights).
#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/kernels.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace tandem::cpu {

namespace {

__m256 set1(float v) { return _mm256_set1_ps(v); }

float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// exp(x) for x in [-87, 88] (clamped): Cephes' expf polynomial, relative error ~1e-7. The lower
// clamp keeps results normal, as the AVX-512 table's (kernels_avx512.cpp).
__m256 exp_ps(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, set1(-87.0f)), set1(88.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, set1(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, set1(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, set1(-2.12194440e-4f), r);
  __m256 p = set1(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, set1(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, set1(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, set1(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, set1(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, set1(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, set1(1.0f)));
  // 2^n in two factors so that n = +-127 stays finite and normal: p * 2^(n/2) * 2^(n - n/2)
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i half = _mm256_srai_epi32(ni, 1);
  const __m256 f1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, _mm256_set1_epi32(127)), 23));
  const __m256 f2 = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, half), _mm256_set1_epi32(127)), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, f1), f2);
}

// tanh: Cephes' odd polynomial below |x| = 0.625, 1 - 2 / (exp(2|x|) + 1) above; rel. error ~2e-7.
__m256 tanh_ps(__m256 x) {
  const __m256 sign = _mm256_and_ps(x, set1(-0.0f));
  const __m256 a = _mm256_andnot_ps(set1(-0.0f), x);
  const __m256 z = _mm256_mul_ps(x, x);
  __m256 p = set1(-5.70498872745e-3f);
  p = _mm256_fmadd_ps(p, z, set1(2.06390887954e-2f));
  p = _mm256_fmadd_ps(p, z, set1(-5.37397155531e-2f));
  p = _mm256_fmadd_ps(p, z, set1(1.33314422036e-1f));
  p = _mm256_fmadd_ps(p, z, set1(-3.33332819422e-1f));
  const __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(p, z), x, x);
  const __m256 e = exp_ps(_mm256_add_ps(a, a));
  const __m256 large = _mm256_or_ps(_mm256_sub_ps(set1(1.0f), _mm256_div_ps(set1(2.0f), _mm256_add_ps(e, set1(1.0f)))), sign);
  return _mm256_blendv_ps(large, small, _mm256_cmp_ps(a, set1(0.625f), _CMP_LT_OQ));
}

// As the vectors below: 0 where tanh(u) is -1 in float (kernels.h).
float gelu_one(float g, float up) {
  const float two_u = 2.0f * 0.7978845608028654f * (g + 0.044715f * g * g * g);
  return two_u < kGeluZeroBelow ? 0.0f : g / (1.0f + std::exp(-two_u)) * up;
}

void matmul_rows(const WeightMatrix& w, int64_t r0, int64_t r1, const float* x, int64_t x_stride, int64_t n,
                 float* y, int64_t y_stride) {
  if (w.format == WeightFormat::Q8 || w.format == WeightFormat::Q4)
    detail::quantize_then_matmul_rows(avx2_kernels(), w, r0, r1, x, x_stride, n, y, y_stride);
  else if (w.layout != WeightLayout::Plain)  // rearranged for the AVX-512 kernels
    scalar_kernels().matmul_rows(w, r0, r1, x, x_stride, n, y, y_stride);
  else
    detail::avx2_matmul_rows_float(w, r0, r1, x, x_stride, n, y, y_stride);
}

void rms_norm(float* out, const float* x, const float* weight, int64_t dim, float eps) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= dim; i += 16) {
    const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
    acc0 = _mm256_fmadd_ps(a, a, acc0);
    acc1 = _mm256_fmadd_ps(b, b, acc1);
  }
  float sum = hsum(_mm256_add_ps(acc0, acc1));
  for (; i < dim; ++i) sum += x[i] * x[i];
  const float s = std::pow(sum / float(dim) + eps, -0.5f);
  const __m256 sv = set1(s);
  for (i = 0; i + 8 <= dim; i += 8) {
    __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), sv);
    if (weight) v = _mm256_mul_ps(v, _mm256_loadu_ps(weight + i));
    _mm256_storeu_ps(out + i, v);
  }
  for (; i < dim; ++i) out[i] = x[i] * s * (weight ? weight[i] : 1.0f);
}

// 0.5 * g * (1 + tanh(u)) == g * sigmoid(2u): keeps its precision where 1 + tanh(u) cancels.
void gelu_gate(float* gate, const float* up, int64_t n) {
  const __m256 k = set1(2.0f * 0.7978845608028654f), c = set1(0.044715f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 inner = _mm256_mul_ps(k, _mm256_fmadd_ps(_mm256_mul_ps(c, g), _mm256_mul_ps(g, g), g));
    const __m256 live = _mm256_cmp_ps(inner, set1(kGeluZeroBelow), _CMP_NLT_UQ);  // NaN stays NaN
    const __m256 e = exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), inner));
    // Zeroed before the multiply: ~1e-37 times a small up would be a subnormal.
    const __m256 gelu = _mm256_and_ps(live, _mm256_div_ps(g, _mm256_add_ps(set1(1.0f), e)));
    _mm256_storeu_ps(gate + i, _mm256_mul_ps(gelu, _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) gate[i] = gelu_one(gate[i], up[i]);
}

void softcap(float* x, int64_t n, float cap) {
  const __m256 c = set1(cap);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(c, tanh_ps(_mm256_div_ps(_mm256_loadu_ps(x + i), c))));
  for (; i < n; ++i) x[i] = cap * std::tanh(x[i] / cap);
}

void add(float* x, const float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_add_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) x[i] += y[i];
}

void scale(float* x, int64_t n, float s) {
  const __m256 sv = set1(s);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), sv));
  for (; i < n; ++i) x[i] *= s;
}

float dot(const float* a, const float* b, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  float sum = hsum(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

void axpy(float* y, float a, const float* x, int64_t n) {
  const __m256 av = set1(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += a * x[i];
}

// vnni: the quantized kernels with AVX-VNNI's vpdpbusd (matmul_avxvnni_*.cpp), the rest the same.
KernelTable make_table(bool vnni) {
  KernelTable t{};
  t.isa = vnni ? Isa::Avx2Vnni : Isa::Avx2;
  t.matmul_rows = matmul_rows;
  t.rms_norm = rms_norm;
  t.gelu_gate = gelu_gate;
  t.softcap = softcap;
  t.add = add;
  t.scale = scale;
  t.dot = dot;
  t.axpy = axpy;
  t.quantized_activation_stride = detail::avx2_activation_stride;
  t.quantize_activations = vnni ? detail::avxvnni_quantize_activations : detail::avx2_quantize_activations;
  t.matmul_rows_quantized = vnni ? detail::avxvnni_matmul_rows_quantized : detail::avx2_matmul_rows_quantized;
  t.interleaved_q8 = t.interleaved_q4 = true;
  return t;
}

}  // namespace

const KernelTable& avx2_kernels() {
  static const KernelTable table = make_table(false);
  return table;
}

const KernelTable& avx2vnni_kernels() {
  static const KernelTable table = make_table(true);
  return table;
}

}  // namespace tandem::cpu

#pragma GCC pop_options
