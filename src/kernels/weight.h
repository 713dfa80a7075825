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

// How a quantized row's codes are ordered in memory. Checkpoints are always Plain (the order
// above); a backend may rearrange a resident copy into the order its kernels read fastest.
//
// Interleaved (Q8/Q4, cols a multiple of 512): each chunk of 512 columns (16 blocks) is stored
// so that an integer dot-product instruction that sums 4 bytes per 32-bit lane (vpdpbusd) sees
// block j in lane j: "vector" k (k = 0..7) holds, for j = 0..15, the 4 codes of columns
// 32 j + 4 k .. 32 j + 4 k + 3 at bytes 4 j .. 4 j + 3. Codes are unsigned: Q8 stores q + 128
// (512 bytes per chunk, vector k at byte 64 k); Q4 stores q + 8 with vectors k and k + 4 sharing
// 64 bytes at byte 64 k (low nibble: vector k, high nibble: vector k + 4; 256 bytes per chunk).
// The scales keep their plain order (16 per chunk).
enum class WeightLayout : uint8_t { Plain, Interleaved };
constexpr int64_t kInterleaveChunk = 512;

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
  WeightLayout layout = WeightLayout::Plain;

  bool empty() const { return rows == 0; }
  WeightMatrix slice_rows(int64_t first, int64_t count) const;
  WeightMatrix slice_cols(int64_t first, int64_t count) const;  // quantized: first % 32 == 0; Plain only
  void row_to_float(int64_t r, float* out) const;               // widen / dequantize one row
  size_t streamed_bytes() const;                                 // bytes one pass over it reads
};

// Bytes one row of `cols` values takes in `format` (data part only; scales separate), either layout.
int64_t row_bytes(WeightFormat format, int64_t cols);

inline bool is_quantized(WeightFormat format) { return format == WeightFormat::Q8 || format == WeightFormat::Q4; }
// Bytes of one row's f16 scales (Q8/Q4; 0 for float formats): a whole row's scale_stride.
inline int64_t scale_row_bytes(WeightFormat format, int64_t cols) {
  return is_quantized(format) ? cols / kQuantBlock * 2 : 0;
}

// Whether w (Q8/Q4, Plain) can be rearranged into the Interleaved layout.
bool can_interleave(const WeightMatrix& w);
// Rearranges rows [r0, r1) of a Plain Q8/Q4 matrix in place (w.data must be writable); the caller
// sets w.layout = Interleaved once every row is done. Rows are independent, so threads may split them.
void interleave_rows(const WeightMatrix& w, uint8_t* data, int64_t r0, int64_t r1);

}  // namespace tandem
