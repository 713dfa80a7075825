#pragma once
// A weight matrix as the kernels see it: a strided view of [rows, cols] in one of the supported
// formats, pointing straight into the memory-mapped checkpoint. Slicing rows or columns (for
// tensor parallelism) only moves pointers.
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tandem {

// Q8: int8 values with one f16 scale per block of 32 consecutive values of a row.
// Q4: 4-bit values (two per byte, low nibble first, stored as v+8 in 0..15) with one f16 scale
//     per block of 32. Both are symmetric: value = scale * q.
enum class WeightFormat : uint8_t { F32, F16, BF16, Q8, Q4 };
constexpr int kQuantBlock = 32;

std::string_view weight_format_name(WeightFormat format);
double weight_format_bits(WeightFormat format);  // bits per weight including scales

struct WeightMatrix {
  WeightFormat format = WeightFormat::F32;
  const uint8_t* data = nullptr;    // row r starts at data + r * row_stride
  const uint8_t* scales = nullptr;  // Q8/Q4: f16 scales, row r at scales + r * scale_stride
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_stride = 0;    // bytes
  int64_t scale_stride = 0;  // bytes

  bool empty() const { return rows == 0; }
  WeightMatrix slice_rows(int64_t first, int64_t count) const;
  WeightMatrix slice_cols(int64_t first, int64_t count) const;  // quantized: first % 32 == 0
  void row_to_float(int64_t r, float* out) const;               // widen / dequantize one row
  size_t streamed_bytes() const;                                 // bytes one pass over it reads
};

// Bytes one row of `cols` values takes in `format` (data part only; scales separate).
int64_t row_bytes(WeightFormat format, int64_t cols);

}  // namespace tandem
