#pragma once
// Random weight matrices in every format for the kernel tests, owning their bytes, with optional
// padded rows and column/row slices, plus the references the SIMD kernels are held to.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/cpu_features.h"
#include "core/dtype.h"
#include "kernels/weight.h"

namespace tandem::test {

struct OwnedMatrix {
  std::vector<uint8_t> data, scales;
  WeightMatrix view;
};

// A rows x cols matrix, stored as a slice of a larger one when `sliced` (one extra row above,
// 32 extra columns on each side and row padding), so strides and offsets are not the natural ones.
inline OwnedMatrix random_matrix(WeightFormat format, int64_t rows, int64_t cols, bool sliced, std::mt19937& rng) {
  const int64_t pad_cols = sliced ? 32 : 0, pad_rows = sliced ? 1 : 0;
  const int64_t full_cols = cols + 2 * pad_cols, full_rows = rows + 2 * pad_rows;
  OwnedMatrix m;
  WeightMatrix& w = m.view;
  w.format = format;
  w.rows = full_rows;
  w.cols = full_cols;
  w.row_stride = row_bytes(format, full_cols) + (sliced ? 64 + 6 : 0);
  m.data.assign(size_t(w.row_stride * full_rows + 64), 0);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int64_t r = 0; r < full_rows; ++r) {
    uint8_t* row = m.data.data() + r * w.row_stride;
    for (int64_t c = 0; c < full_cols; ++c) {
      const float v = value(rng);
      switch (format) {
        case WeightFormat::F32: std::memcpy(row + 4 * c, &v, 4); break;
        case WeightFormat::F16: {
          const uint16_t h = f32_to_f16(v);
          std::memcpy(row + 2 * c, &h, 2);
          break;
        }
        case WeightFormat::BF16: {
          const uint16_t h = f32_to_bf16(v);
          std::memcpy(row + 2 * c, &h, 2);
          break;
        }
        case WeightFormat::Q8: row[c] = uint8_t(byte(rng)); break;  // every code, -128 included
        case WeightFormat::Q4: if (c % 2 == 0) row[c / 2] = uint8_t(byte(rng)); break;
      }
    }
  }
  if (is_quantized(format)) {
    w.scale_stride = (full_cols / kQuantBlock) * 2 + (sliced ? 6 : 0);
    m.scales.assign(size_t(w.scale_stride * full_rows + 64), 0);
    std::uniform_real_distribution<float> scale(0.001f, 0.05f);
    for (int64_t r = 0; r < full_rows; ++r)
      for (int64_t b = 0; b < full_cols / kQuantBlock; ++b) {
        const uint16_t h = f32_to_f16(scale(rng));
        std::memcpy(m.scales.data() + r * w.scale_stride + 2 * b, &h, 2);
      }
    w.scales = m.scales.data();
  }
  w.data = m.data.data();
  if (sliced) w = w.slice_rows(pad_rows, rows).slice_cols(pad_cols, cols);
  return m;
}

inline std::vector<float> random_vector(size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Reference y = W x in double from the exactly widened / dequantized weights, and the tolerance a
// kernel result gets: float32 summation error relative to sum |w x|, plus, for quantized weights,
// the int8 quantization of x (per block of 32: |x - scale * code| <= max|x| / 254).
struct Expected {
  double value;
  double tolerance;
};

inline Expected expected_dot(const std::vector<float>& w_row, const float* x, int64_t cols, bool quantized) {
  double sum = 0, magnitude = 0, quant_error = 0;
  for (int64_t b = 0; b < cols; b += kQuantBlock) {
    const int64_t e = std::min(cols, b + kQuantBlock);
    double amax = 0, wabs = 0;
    for (int64_t c = b; c < e; ++c) {
      const double p = double(w_row[size_t(c)]) * double(x[c]);
      sum += p;
      magnitude += std::fabs(p);
      amax = std::max(amax, std::fabs(double(x[c])));
      wabs += std::fabs(double(w_row[size_t(c)]));
    }
    quant_error += amax / 254.0 * wabs;
  }
  return {sum, 1e-5 * magnitude + (quantized ? 1.001 * quant_error + 1e-6 * magnitude : 0.0) + 1e-30};
}

inline std::vector<Isa> all_isas() { return {Isa::Scalar, Isa::Avx2, Isa::Avx2Vnni, Isa::Avx512, Isa::Avx512Amx}; }

}  // namespace tandem::test
