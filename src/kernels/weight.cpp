#include "kernels/weight.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace tandem {

namespace {

// Where column c's code sits in an Interleaved row: chunk, 64-byte vector of the chunk, byte in
// it, and for Q4 whether it is the high nibble (see WeightLayout).
struct CodePlace {
  int64_t chunk, vector, byte;
  bool high;
};

CodePlace interleaved_place(WeightFormat format, int64_t c) {
  const int64_t chunk = c / kInterleaveChunk, in_chunk = c % kInterleaveChunk;
  const int64_t block = in_chunk / kQuantBlock, in_block = in_chunk % kQuantBlock;
  const int64_t vector = in_block / 4, lane_byte = 4 * block + in_block % 4;
  if (format == WeightFormat::Q8) return {chunk, vector, lane_byte, false};
  return {chunk, vector % 4, lane_byte, vector >= 4};
}

int interleaved_code(const WeightMatrix& w, int64_t r, int64_t c) {
  const CodePlace p = interleaved_place(w.format, c);
  const uint8_t byte = interleaved_vector(w, r, p.chunk, p.vector)[p.byte];
  if (w.format == WeightFormat::Q8) return int(byte) - 128;
  return int(p.high ? byte >> 4 : byte & 0xf) - 8;
}

// The 4 nibbles of v (lowest first) in the low nibbles of 4 bytes (lowest byte first).
uint32_t spread_nibbles(uint16_t v) {
  return uint32_t(v & 0xf) | uint32_t(v >> 4 & 0xf) << 8 | uint32_t(v >> 8 & 0xf) << 16 | uint32_t(v >> 12) << 24;
}

}  // namespace

bool can_interleave(const WeightMatrix& w) {
  if (w.layout != WeightLayout::Plain || w.cols <= 0 || w.row_stride != row_bytes(w.format, w.cols)) return false;
  if (w.format == WeightFormat::BF16 || w.format == WeightFormat::F16)
    return w.cols % interleaved_chunk_cols(w.format) == 0 && w.scales == nullptr;
  return is_quantized(w.format) && w.cols % kInterleaveChunk == 0 &&
         w.scale_stride == scale_row_bytes(w.format, w.cols) && w.scales == w.data + w.rows * w.row_stride;
}

void interleave_row_groups(const WeightMatrix& w, const uint8_t* codes, const uint8_t* scales, uint8_t* out,
                           int64_t g0, int64_t g1) {
  if (!can_interleave(w))
    fail("interleave_row_groups: needs a plain matrix with packed rows: Q8/Q4 with its scales after them and "
         "columns a multiple of {}, or BF16/F16 with columns a multiple of 32", kInterleaveChunk);
  const int64_t bytes = w.row_stride, scale_bytes = w.scale_stride;
  WeightMatrix dst = w;  // addresses of the result
  dst.data = out;
  const int64_t first = g0 * kInterleaveRows;
  if (!is_quantized(w.format)) {  // 64-byte vectors moved as they are
    for (int64_t r = first; r < std::min(w.rows, g1 * kInterleaveRows); ++r)
      for (int64_t v = 0; v < bytes / 64; ++v)
        std::memcpy(const_cast<uint8_t*>(interleaved_vector(dst, r, v, 0)), codes + (r - first) * bytes + 64 * v, 64);
    return;
  }
  // Per chunk this is a transpose of 4-byte units (Q8: block j's 4 codes for vector k move from
  // unit 8 j + k to unit 16 k + j; Q4 the same in nibbles), so the loops move whole units (the
  // order of interleaved_place()): a byte at a time it took ~3 s of CPU for E4B in q4, most of a
  // resident load.
  const int64_t chunks = w.cols / kInterleaveChunk;
  const bool q8 = w.format == WeightFormat::Q8;
  const int64_t chunk_bytes = row_bytes(w.format, kInterleaveChunk);
  dst.scales = out + w.rows * bytes;
  for (int64_t r = first; r < std::min(w.rows, g1 * kInterleaveRows); ++r) {
    const uint8_t* src_row = codes + (r - first) * bytes;
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      const uint8_t* src = src_row + chunk * chunk_bytes;
      for (int64_t k = 0; k < (q8 ? 8 : 4); ++k) {
        uint32_t vector[16];
        for (int64_t j = 0; j < 16; ++j) {
          if (q8) {
            uint32_t unit;  // columns 32 j + 4 k .. + 3
            std::memcpy(&unit, src + 32 * j + 4 * k, 4);
            vector[j] = unit ^ 0x80808080u;  // q + 128
          } else {
            // Two bytes hold columns 32 j + 4 k .. + 3 as nibbles (already q + 8); the high nibbles
            // of the output take the same columns of vector k + 4.
            uint16_t low, high;
            std::memcpy(&low, src + 16 * j + 2 * k, 2);
            std::memcpy(&high, src + 16 * j + 2 * (k + 4), 2);
            vector[j] = spread_nibbles(low) | spread_nibbles(high) << 4;
          }
        }
        std::memcpy(const_cast<uint8_t*>(interleaved_vector(dst, r, chunk, k)), vector, 64);
      }
      std::memcpy(const_cast<uint8_t*>(interleaved_scales(dst, r, chunk)), scales + (r - first) * scale_bytes + 32 * chunk, 32);
    }
  }
}

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
  if (layout == WeightLayout::Interleaved &&
      (first % kInterleaveRows != 0 || (count % kInterleaveRows != 0 && first + count != rows)))
    fail("row slice [{}, +{}) does not fall on {}-row groups of the interleaved layout", first, count, kInterleaveRows);
  WeightMatrix s = *this;
  s.rows = count;
  if (layout == WeightLayout::Interleaved) {  // codes and scales of whole groups, one region
    s.data = data + first * (row_stride + scale_stride);
    if (scales) s.scales = s.data + count * row_stride;
    return s;
  }
  s.data = data + first * row_stride;
  if (scales) s.scales = scales + first * scale_stride;
  return s;
}

WeightMatrix WeightMatrix::slice_cols(int64_t first, int64_t count) const {
  if (first < 0 || count < 0 || first + count > cols) fail("column slice [{}, +{}) out of {} columns", first, count, cols);
  if (layout != WeightLayout::Plain) fail("column slices need the plain layout");
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
  if (layout == WeightLayout::Interleaved && !is_quantized(format)) {
    for (int64_t c = 0; c < cols; ++c) {
      uint16_t bits;
      std::memcpy(&bits, interleaved_float_at(*this, r, c), 2);
      out[c] = format == WeightFormat::BF16 ? bf16_to_f32(bits) : f16_to_f32(bits);
    }
    return;
  }
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
      const bool interleaved = layout == WeightLayout::Interleaved;
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t block = c / kQuantBlock;
        const uint8_t* scale_bits = interleaved ? interleaved_scales(*this, r, c / kInterleaveChunk) + 2 * (block % 16)
                                                : scales + r * scale_stride + 2 * block;
        uint16_t sbits;
        std::memcpy(&sbits, scale_bits, 2);
        const float scale = f16_to_f32(sbits);
        int q;
        if (interleaved) {
          q = interleaved_code(*this, r, c);
        } else if (format == WeightFormat::Q8) {
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

void WeightMatrix::append_ranges(std::vector<ByteRange>& out) const {
  if (empty()) return;
  if (layout == WeightLayout::Interleaved) {  // each row group's codes and scales together
    out.push_back({data, size_t(rows) * size_t(row_stride + scale_stride)});
    return;
  }
  const size_t codes = size_t(row_bytes(format, cols)), scale_bytes = size_t(scale_row_bytes(format, cols));
  if (size_t(row_stride) == codes) {
    out.push_back({data, size_t(rows) * codes});
  } else {  // a column slice (tensor parallelism): its rows lie apart, among the other ranks' columns
    for (int64_t r = 0; r < rows; ++r) out.push_back({data + r * row_stride, codes});
  }
  if (!scales) return;
  if (size_t(scale_stride) == scale_bytes) {
    out.push_back({scales, size_t(rows) * scale_bytes});
  } else {
    for (int64_t r = 0; r < rows; ++r) out.push_back({scales + r * scale_stride, scale_bytes});
  }
}

size_t WeightMatrix::streamed_bytes() const {
  size_t n = size_t(rows) * size_t(row_bytes(format, cols));
  if (format == WeightFormat::Q8 || format == WeightFormat::Q4)
    n += size_t(rows) * size_t((cols + kQuantBlock - 1) / kQuantBlock) * 2;
  return n;
}

}  // namespace tandem
