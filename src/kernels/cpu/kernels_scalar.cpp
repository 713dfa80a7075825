// Portable reference implementations of the CPU kernels: every SIMD path is tested against these,
// and they are the production path on CPUs without AVX2. Long sums accumulate in double: one float
// accumulator over thousands of terms drifts much further from the float32 reference forward than
// the SIMD paths' many partial sums do, enough to flip a near-tie in greedy decoding.
#include <cmath>
#include <vector>

#include "kernels/cpu/kernels.h"

namespace tandem::cpu {

namespace {

void matmul_rows(const WeightMatrix& w, int64_t r0, int64_t r1, const float* x, int64_t x_stride, int64_t n,
                 float* y, int64_t y_stride) {
  thread_local std::vector<float> row;
  if (row.size() < size_t(w.cols)) row.resize(size_t(w.cols));
  for (int64_t r = r0; r < r1; ++r) {
    w.row_to_float(r, row.data());
    for (int64_t i = 0; i < n; ++i) {
      const float* xi = x + i * x_stride;
      double sum = 0.0;
      for (int64_t c = 0; c < w.cols; ++c) sum += double(row[size_t(c)]) * double(xi[c]);
      y[i * y_stride + r] = float(sum);
    }
  }
}

void rms_norm(float* out, const float* x, const float* weight, int64_t dim, float eps) {
  double sum = 0.0;
  for (int64_t i = 0; i < dim; ++i) sum += double(x[i]) * double(x[i]);
  const float s = std::pow(float(sum / double(dim)) + eps, -0.5f);
  for (int64_t i = 0; i < dim; ++i) out[i] = x[i] * s * (weight ? weight[i] : 1.0f);
}

void gelu_gate(float* gate, const float* up, int64_t n) {
  const float k = 0.7978845608028654f;
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    gate[i] = 0.5f * g * (1.0f + std::tanh(k * (g + 0.044715f * g * g * g))) * up[i];
  }
}

void softcap(float* x, int64_t n, float cap) {
  for (int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] / cap);
}

void add(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void scale(float* x, int64_t n, float s) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

float dot(const float* a, const float* b, int64_t n) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += double(a[i]) * double(b[i]);
  return float(sum);
}

void axpy(float* y, float a, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

}  // namespace

const KernelTable& scalar_kernels() {
  static const KernelTable table{Isa::Scalar, matmul_rows, rms_norm, gelu_gate, softcap, add, scale, dot, axpy,
                                 nullptr, nullptr, nullptr, false};
  return table;
}

}  // namespace tandem::cpu
