#include "kernels/weight.h"

#include <cstring>

#include "core/dtype.h"
#include "core/error.h"

namespace tandem {

std::string_view weight_format_name(WeightFormat format) {
  switch (format) {
    case WeightFormat::F32: return "f32";
    case WeightFormat::F16: return "f16";
    case WeightFormat::BF16: return "bf16";
    case WeightFormat::Q8: return "q8";
    case WeightFormat::Q4: return "q4";
  }
  return "?";
}

double weight_format_bits(WeightFormat format) {
  switch (format) {
    case WeightFormat::F32: return 32;
    case WeightFormat::F16:
    case WeightFormat::BF16: return 16;
    case WeightFormat::Q8: return 8 + 16.0 / kQuantBlock;
    case WeightFormat::Q4: return 4 + 16.0 / kQuantBlock;
  }
  return 0;
}

int64_t row_bytes(WeightFormat format, int64_t cols) {
  switch (format) {
    case WeightFormat::F32: return cols * 4;
    case WeightFormat::F16:
    case WeightFormat::BF16: return cols * 2;
    case WeightFormat::Q8: return cols;
    case WeightFormat::Q4: return (cols + 1) / 2;
  }
  return 0;
}

WeightMatrix WeightMatrix::slice_rows(int64_t first, int64_t count) const {
  if (first < 0 || count < 0 || first + count > rows) fail("row slice [{}, +{}) out of {} rows", first, count, rows);
  WeightMatrix s = *this;
  s.rows = count;
  s.data = data + first * row_stride;
  if (scales) s.scales = scales + first * scale_stride;
  return s;
}

WeightMatrix WeightMatrix::slice_cols(int64_t first, int64_t count) const {
  if (first < 0 || count < 0 || first + count > cols) fail("column slice [{}, +{}) out of {} columns", first, count, cols);
  const bool quantized = format == WeightFormat::Q8 || format == WeightFormat::Q4;
  if (quantized && (first % kQuantBlock || (count % kQuantBlock && first + count != cols)))
    fail("column slice [{}, +{}) does not fall on {}-value quantization blocks", first, count, kQuantBlock);
  WeightMatrix s = *this;
  s.cols = count;
  s.data = data + row_bytes(format, first);
  if (quantized) s.scales = scales + (first / kQuantBlock) * 2;
  return s;
}

void WeightMatrix::row_to_float(int64_t r, float* out) const {
  const uint8_t* row = data + r * row_stride;
  switch (format) {
    case WeightFormat::F32:
      std::memcpy(out, row, size_t(cols) * 4);
      return;
    case WeightFormat::BF16:
      for (int64_t c = 0; c < cols; ++c) {
        uint16_t bits;
        std::memcpy(&bits, row + 2 * c, 2);
        out[c] = bf16_to_f32(bits);
      }
      return;
    case WeightFormat::F16:
      for (int64_t c = 0; c < cols; ++c) {
        uint16_t bits;
        std::memcpy(&bits, row + 2 * c, 2);
        out[c] = f16_to_f32(bits);
      }
      return;
    case WeightFormat::Q8:
    case WeightFormat::Q4: {
      const uint8_t* srow = scales + r * scale_stride;
      for (int64_t c = 0; c < cols; ++c) {
        uint16_t sbits;
        std::memcpy(&sbits, srow + 2 * (c / kQuantBlock), 2);
        const float scale = f16_to_f32(sbits);
        int q;
        if (format == WeightFormat::Q8) {
          q = int(int8_t(row[c]));
        } else {
          const uint8_t byte = row[c / 2];
          q = int(c % 2 ? byte >> 4 : byte & 0xf) - 8;
        }
        out[c] = scale * float(q);
      }
      return;
    }
  }
}

size_t WeightMatrix::streamed_bytes() const {
  size_t n = size_t(rows) * size_t(row_bytes(format, cols));
  if (format == WeightFormat::Q8 || format == WeightFormat::Q4)
    n += size_t(rows) * size_t((cols + kQuantBlock - 1) / kQuantBlock) * 2;
  return n;
}

}  // namespace tandem
