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
// Interleaved (Q8/Q4, cols a multiple of 512): each chunk of 512 columns (16 blocks) of a row is
// stored so that an integer dot-product instruction that sums 4 bytes per 32-bit lane (vpdpbusd)
// sees block j in lane j: "vector" k (k = 0..7) holds, for j = 0..15, the 4 codes of columns
// 32 j + 4 k .. 32 j + 4 k + 3 at bytes 4 j .. 4 j + 3. Codes are unsigned: Q8 stores q + 128
// (512 bytes per chunk, vector k at byte 64 k); Q4 stores q + 8 with vectors k and k + 4 sharing
// 64 bytes at byte 64 k (low nibble: vector k, high nibble: vector k + 4; 256 bytes per chunk).
// Rows come in groups of 8 (the last group may be shorter), and a group is one sequential range:
// for each chunk, its rows' codes back to back, then their 16 f16 scales (32 bytes) each. A
// one-token matmul then reads a single stream instead of 16 (8 rows of codes, 8 of scales): on
// Zen 4 that doubled what one core read from DRAM (docs/kernels.md). `data` points at group 0,
// `row_stride` is a row's share (codes + scales; group g at data + 8 g row_stride), `scales` is null.
enum class WeightLayout : uint8_t { Plain, Interleaved };
constexpr int64_t kInterleaveChunk = 512;
constexpr int64_t kInterleaveGroupRows = 8;

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
  WeightMatrix slice_rows(int64_t first, int64_t count) const;  // Interleaved: on whole groups
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
// Bytes of a rows x cols Interleaved matrix (codes and scales).
int64_t interleaved_bytes(WeightFormat format, int64_t rows, int64_t cols);
// Writes the Plain Q8/Q4 matrix w into dest (interleaved_bytes long) in the Interleaved layout. A
// block of w's rows that starts at a multiple of kInterleaveGroupRows, and ends at one or at the
// last row, written to dest + interleaved_bytes(format, first, cols), gives the same bytes as the
// whole matrix: threads (and loaders reading a block at a time) may split the work that way.
void write_interleaved(const WeightMatrix& w, uint8_t* dest);
// The Interleaved matrix held in `data` (as write_interleaved wrote it).
WeightMatrix interleaved_matrix(WeightFormat format, int64_t rows, int64_t cols, const uint8_t* data);

// Where row r's codes and scales of one 512-column chunk sit in an Interleaved matrix: the row's
// chunk ch starts at codes + ch * chunk_step, its 16 scales at scales + ch * chunk_step. Rows of
// one group share chunk_step and lie chunk_code_bytes apart (scales: 32 bytes).
struct InterleavedRow {
  const uint8_t* codes;
  const uint8_t* scales;
  int64_t chunk_step;
};
inline int64_t interleaved_chunk_code_bytes(WeightFormat format) {
  return format == WeightFormat::Q8 ? kInterleaveChunk : kInterleaveChunk / 2;
}
inline int64_t interleaved_group_rows(const WeightMatrix& w, int64_t r) {
  const int64_t first = r / kInterleaveGroupRows * kInterleaveGroupRows;
  return w.rows - first < kInterleaveGroupRows ? w.rows - first : kInterleaveGroupRows;
}
inline InterleavedRow interleaved_row(const WeightMatrix& w, int64_t r) {
  const int64_t in_group = r % kInterleaveGroupRows, n = interleaved_group_rows(w, r);
  const int64_t code_bytes = interleaved_chunk_code_bytes(w.format);
  const uint8_t* group = w.data + (r - in_group) * w.row_stride;
  return {group + in_group * code_bytes, group + n * code_bytes + in_group * kInterleaveChunk / kQuantBlock * 2,
          n * (code_bytes + kInterleaveChunk / kQuantBlock * 2)};
}

}  // namespace tandem
