// AVX-512 (F/BW/VL/DQ + FMA + F16C) kernels: the elementwise ones here, matmul in
// matmul_avx512.cpp (float weights) and matmul_avx512_vnni.cpp (quantized weights; CPUs without
// AVX512-VNNI use the AVX2 quantized kernels instead).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/kernels.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
// GCC 12 flags the intrinsic headers' own _mm512_undefined_*() placeholders as uninitialized.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace tandem::cpu {

namespace {

// exp(x) for x in [-87, 88] (clamped): Cephes' expf polynomial, relative error ~1e-7. The lower
// clamp keeps results normal (e^-88 is subnormal as 2^-127 * p): a subnormal result costs its
// vector a microcode assist, and gelu_gate's large gates took each vector ~100x its time.
__m512 exp_ps(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

// tanh: Cephes' odd polynomial below |x| = 0.625, 1 - 2 / (exp(2|x|) + 1) above; rel. error ~2e-7.
__m512 tanh_ps(__m512 x) {
  const __m512 a = _mm512_abs_ps(x);
  const __m512 z = _mm512_mul_ps(x, x);
  __m512 p = _mm512_set1_ps(-5.70498872745e-3f);
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(2.06390887954e-2f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-5.37397155531e-2f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(1.33314422036e-1f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-3.33332819422e-1f));
  const __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(p, z), x, x);
  const __m512 e = exp_ps(_mm512_add_ps(a, a));
  const __m512 large_abs = _mm512_sub_ps(_mm512_set1_ps(1.0f),
                                         _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, _mm512_set1_ps(1.0f))));
  // copy x's sign onto |tanh|
  const __m512 large = _mm512_or_ps(large_abs, _mm512_and_ps(x, _mm512_set1_ps(-0.0f)));
  const __mmask16 is_small = _mm512_cmp_ps_mask(a, _mm512_set1_ps(0.625f), _CMP_LT_OQ);
  return _mm512_mask_blend_ps(is_small, large, small);
}

__mmask16 tail_mask(int64_t count) { return __mmask16((1u << count) - 1); }

void matmul_rows(const WeightMatrix& w, int64_t r0, int64_t r1, const float* x, int64_t x_stride, int64_t n,
                 float* y, int64_t y_stride) {
  if (w.format == WeightFormat::Q8 || w.format == WeightFormat::Q4)
    detail::quantize_then_matmul_rows(avx512_kernels(), w, r0, r1, x, x_stride, n, y, y_stride);
  else
    detail::avx512_matmul_rows_float(w, r0, r1, x, x_stride, n, y, y_stride);
}

void rms_norm(float* out, const float* x, const float* weight, int64_t dim, float eps) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= dim; i += 32) {
    const __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
    acc0 = _mm512_fmadd_ps(a, a, acc0);
    acc1 = _mm512_fmadd_ps(b, b, acc1);
  }
  for (; i < dim; i += 16) {
    const __m512 a = _mm512_maskz_loadu_ps(tail_mask(std::min<int64_t>(16, dim - i)), x + i);
    acc0 = _mm512_fmadd_ps(a, a, acc0);
  }
  const float sum = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
  const __m512 s = _mm512_set1_ps(std::pow(sum / float(dim) + eps, -0.5f));
  for (i = 0; i < dim; i += 16) {
    const __mmask16 m = tail_mask(std::min<int64_t>(16, dim - i));
    __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), s);
    if (weight) v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, weight + i));
    _mm512_mask_storeu_ps(out + i, m, v);
  }
}

// 0.5 * g * (1 + tanh(u)) == g * sigmoid(2u): the second form keeps its precision for very
// negative u, where 1 + tanh(u) cancels. Where tanh(u) is -1 in float (kGeluZeroBelow) the
// result is 0, as the reference's; g * sigmoid(2u) there goes down to ~1e-37 and, times a small
// up, to subnormals, which cost each vector ~100x (gates of N(0, 10): 0.18 against 2.4 Gelem/s).
void gelu_gate(float* gate, const float* up, int64_t n) {
  const __m512 k = _mm512_set1_ps(2.0f * 0.7978845608028654f), c = _mm512_set1_ps(0.044715f);
  const __m512 zero_below = _mm512_set1_ps(kGeluZeroBelow);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(std::min<int64_t>(16, n - i));
    const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
    const __m512 inner = _mm512_mul_ps(k, _mm512_fmadd_ps(_mm512_mul_ps(c, g), _mm512_mul_ps(g, g), g));
    const __mmask16 live = _mm512_cmp_ps_mask(inner, zero_below, _CMP_NLT_UQ);  // NaN stays NaN
    const __m512 e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), inner));
    const __m512 gelu = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
    _mm512_mask_storeu_ps(gate + i, m, _mm512_maskz_mul_ps(live, gelu, _mm512_maskz_loadu_ps(m, up + i)));
  }
}

void softcap(float* x, int64_t n, float cap) {
  const __m512 c = _mm512_set1_ps(cap);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(std::min<int64_t>(16, n - i));
    // x / cap as the reference computes it (a multiply by 1/cap could differ in the last bit)
    const __m512 v = _mm512_div_ps(_mm512_maskz_loadu_ps(m, x + i), c);
    _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(c, tanh_ps(v)));
  }
}

void add(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(std::min<int64_t>(16, n - i));
    _mm512_mask_storeu_ps(x + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
  }
}

void scale(float* x, int64_t n, float s) {
  const __m512 sv = _mm512_set1_ps(s);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(std::min<int64_t>(16, n - i));
    _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), sv));
  }
}

float dot(const float* a, const float* b, int64_t n) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), acc1);
  }
  for (; i < n; i += 16) {
    const __mmask16 m = tail_mask(std::min<int64_t>(16, n - i));
    acc0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

void axpy(float* y, float a, const float* x, int64_t n) {
  const __m512 av = _mm512_set1_ps(a);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(std::min<int64_t>(16, n - i));
    _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
  }
}

KernelTable make_table() {
  KernelTable t{};
  t.isa = Isa::Avx512;
  t.matmul_rows = matmul_rows;
  t.rms_norm = rms_norm;
  t.gelu_gate = gelu_gate;
  t.softcap = softcap;
  t.add = add;
  t.scale = scale;
  t.dot = dot;
  t.axpy = axpy;
  t.interleaved_float = true;
  t.matvec_streams = detail::avx512_matvec_streams_float;
  if (cpu_features().avx512_vnni) {
    t.quantized_activation_stride = detail::avx512vnni_activation_stride;
    t.quantize_activations = detail::avx512vnni_quantize_activations;
    t.matmul_rows_quantized = detail::avx512vnni_matmul_rows_quantized;
    t.interleaved_q8 = t.interleaved_q4 = true;
  } else {
    t.quantized_activation_stride = detail::avx2_activation_stride;
    t.quantize_activations = detail::avx2_quantize_activations;
    t.matmul_rows_quantized = detail::avx2_matmul_rows_quantized;
    t.interleaved_q8 = t.interleaved_q4 = true;
  }
  return t;
}

}  // namespace

const KernelTable& avx512_kernels() {
  static const KernelTable table = make_table();
  return table;
}

}  // namespace tandem::cpu

#pragma GCC diagnostic pop
#pragma GCC pop_options
