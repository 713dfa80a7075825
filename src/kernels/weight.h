#pragma once
// A weight matrix as the kernels see it: a strided view of [rows, cols] in one of the supported
// formats, pointing straight into the memory-mapped checkpoint. Slicing rows or columns (for
// tensor parallelism) only moves pointers.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "core/byte_range.h"

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
// A matrix's scales directly follow its codes (scales == data + rows * row_stride), and the two
// are rearranged together: the rows are stored in groups of kInterleaveRows (the last group takes
// what is left), group by group, each starting at data + first_row * (row_stride + scale_stride).
// A group of g rows holds its chunks in order; chunk ch is the 64-byte vectors of its rows, vector
// k of row i at byte 64 (k g + i), followed by the rows' 16 f16 scales of the chunk, row i's at
// byte 64 V g + 32 i (V = 8 vectors per chunk for Q8, 4 for Q4). A tile of a whole group (decode,
// and 4 x 4 batch tiles) then reads one sequential stream, which the hardware prefetchers follow as
// they do a plain read; 4-8 rows read side by side were as many short streams (and their scales
// more), which needed software prefetch and still fell short of it.
//
// Interleaved BF16/F16 (cols a multiple of 32, packed rows, no scales) is the same row groups
// with one 64-byte vector (32 values in column order) per chunk: vector v of row i of a group at
// byte 64 (v g + i) of the group. Float kernels read a group as one stream too.
enum class WeightLayout : uint8_t { Plain, Interleaved };
constexpr int64_t kInterleaveChunk = 512;
constexpr int64_t kInterleaveRows = 4;

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
  WeightMatrix slice_rows(int64_t first, int64_t count) const;  // Interleaved: whole groups
  WeightMatrix slice_cols(int64_t first, int64_t count) const;  // quantized: first % 32 == 0; Plain only
  void row_to_float(int64_t r, float* out) const;               // widen / dequantize one row
  size_t streamed_bytes() const;                                 // bytes one pass over it reads
  // The memory one pass reads: the codes and the scales, a range each (a column slice: one per
  // row); interleaved, one block holding both.
  void append_ranges(std::vector<ByteRange>& out) const;
};

// Bytes one row of `cols` values takes in `format` (data part only; scales separate), either layout.
int64_t row_bytes(WeightFormat format, int64_t cols);

inline bool is_quantized(WeightFormat format) { return format == WeightFormat::Q8 || format == WeightFormat::Q4; }
// Bytes of one row's f16 scales (Q8/Q4; 0 for float formats): a whole row's scale_stride.
inline int64_t scale_row_bytes(WeightFormat format, int64_t cols) {
  return is_quantized(format) ? cols / kQuantBlock * 2 : 0;
}

// Whether w (Plain, rows packed at row_bytes; Q8/Q4 with their scales right after the codes and
// columns a multiple of 512, or BF16/F16 with columns a multiple of 32) can be rearranged into the
// Interleaved layout.
bool can_interleave(const WeightMatrix& w);
// Writes row groups [g0, g1) of w in the Interleaved layout into `out` (rows * (row_stride +
// scale_stride) bytes, the region w.data starts), reading the plain codes and scales of those rows
// (from row kInterleaveRows * g0 on: a copy, since the groups' new places overlap other rows' old
// ones) from `codes` and `scales` (nullptr for BF16/F16). The caller then points w.data at out (scales at out + rows * row_stride)
// and sets w.layout = Interleaved. Groups are independent, so threads may split them.
void interleave_row_groups(const WeightMatrix& w, const uint8_t* codes, const uint8_t* scales, uint8_t* out,
                           int64_t g0, int64_t g1);
inline int64_t interleaved_group_count(const WeightMatrix& w) {
  return (w.rows + kInterleaveRows - 1) / kInterleaveRows;
}

// Addresses in an Interleaved matrix (see WeightLayout).
inline int64_t interleaved_group_rows(const WeightMatrix& w, int64_t r) {
  const int64_t first = r / kInterleaveRows * kInterleaveRows;
  return w.rows - first < kInterleaveRows ? w.rows - first : kInterleaveRows;
}
// Columns of one chunk: 512 for Q8/Q4, one 64-byte vector (32 values) for BF16/F16.
inline int64_t interleaved_chunk_cols(WeightFormat format) {
  return is_quantized(format) ? kInterleaveChunk : 32;
}
// Bytes of one row's codes and scales over one chunk.
inline int64_t interleaved_chunk_row_bytes(WeightFormat format) {
  return format == WeightFormat::Q8 ? 512 + 32 : format == WeightFormat::Q4 ? 256 + 32 : 64;
}
// Where chunk ch of row r's group starts; the group's next chunk follows at
// + interleaved_group_rows(w, r) * interleaved_chunk_row_bytes(w.format).
inline const uint8_t* interleaved_group_chunk(const WeightMatrix& w, int64_t r, int64_t ch) {
  const int64_t first = r / kInterleaveRows * kInterleaveRows;
  return w.data + first * (w.row_stride + w.scale_stride) +
         ch * interleaved_group_rows(w, r) * interleaved_chunk_row_bytes(w.format);
}
// 64-byte vector k (0..7 for Q8, 0..3 for Q4, 0 for BF16/F16) of row r's chunk ch; vector k + 1
// (or the next chunk's vector, for BF16/F16) follows at + 64 * interleaved_group_rows(w, r).
inline const uint8_t* interleaved_vector(const WeightMatrix& w, int64_t r, int64_t ch, int64_t k) {
  return interleaved_group_chunk(w, r, ch) + 64 * (k * interleaved_group_rows(w, r) + r % kInterleaveRows);
}
// Where the BF16/F16 value at (r, c) sits; the values up to the end of its 32-column vector follow.
inline const uint8_t* interleaved_float_at(const WeightMatrix& w, int64_t r, int64_t c) {
  return interleaved_vector(w, r, c / 32, 0) + 2 * (c % 32);
}
// The 16 f16 scales of row r's chunk ch (Q8/Q4).
inline const uint8_t* interleaved_scales(const WeightMatrix& w, int64_t r, int64_t ch) {
  const int64_t vectors = w.format == WeightFormat::Q8 ? 8 : 4;
  return interleaved_group_chunk(w, r, ch) + interleaved_group_rows(w, r) * 64 * vectors + 32 * (r % kInterleaveRows);
}

}  // namespace tandem
