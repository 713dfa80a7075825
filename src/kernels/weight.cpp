#include "kernels/weight.h"

#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace tandem {

namespace {

// Where column c's code sits in a row's Interleaved chunk: byte offset from the chunk's start, and
// for Q4 whether it is the high nibble (see WeightLayout).
struct CodePlace {
  int64_t byte;
  bool high;
};

CodePlace place_in_chunk(WeightFormat format, int64_t in_chunk) {
  const int64_t block = in_chunk / kQuantBlock, in_block = in_chunk % kQuantBlock;
  const int64_t vector = in_block / 4, lane_byte = 4 * block + in_block % 4;
  if (format == WeightFormat::Q8) return {64 * vector + lane_byte, false};
  return {64 * (vector % 4) + lane_byte, vector >= 4};
}

int interleaved_code(WeightFormat format, const uint8_t* chunk, int64_t in_chunk) {
  const CodePlace p = place_in_chunk(format, in_chunk);
  if (format == WeightFormat::Q8) return int(chunk[p.byte]) - 128;
  return int(p.high ? chunk[p.byte] >> 4 : chunk[p.byte] & 0xf) - 8;
}

}  // namespace

bool can_interleave(const WeightMatrix& w) {
  return (w.format == WeightFormat::Q8 || w.format == WeightFormat::Q4) && w.layout == WeightLayout::Plain &&
         w.cols > 0 && w.cols % kInterleaveChunk == 0;
}

int64_t interleaved_bytes(WeightFormat format, int64_t rows, int64_t cols) {
  return rows * (row_bytes(format, cols) + scale_row_bytes(format, cols));
}

WeightMatrix interleaved_matrix(WeightFormat format, int64_t rows, int64_t cols, const uint8_t* data) {
  WeightMatrix m;
  m.format = format;
  m.rows = rows;
  m.cols = cols;
  m.data = data;
  m.row_stride = row_bytes(format, cols) + scale_row_bytes(format, cols);
  m.layout = WeightLayout::Interleaved;
  return m;
}

void write_interleaved(const WeightMatrix& w, uint8_t* dest) {
  if (!can_interleave(w)) fail("write_interleaved: needs a plain Q8/Q4 matrix with columns a multiple of {}", kInterleaveChunk);
  const WeightMatrix out = interleaved_matrix(w.format, w.rows, w.cols, dest);
  const int64_t chunk_scale_bytes = kInterleaveChunk / kQuantBlock * 2;
  for (int64_t r = 0; r < w.rows; ++r) {
    const uint8_t* plain = w.data + r * w.row_stride;
    const uint8_t* plain_scales = w.scales + r * w.scale_stride;
    const InterleavedRow place = interleaved_row(out, r);
    for (int64_t chunk = 0; chunk < w.cols / kInterleaveChunk; ++chunk) {
      uint8_t* codes = const_cast<uint8_t*>(place.codes) + chunk * place.chunk_step;
      std::memcpy(const_cast<uint8_t*>(place.scales) + chunk * place.chunk_step, plain_scales + chunk * chunk_scale_bytes,
                  size_t(chunk_scale_bytes));
      if (w.format == WeightFormat::Q4) std::memset(codes, 0, size_t(kInterleaveChunk / 2));
      // The loops walk place_in_chunk() in order, without its divisions (this runs over every weight at load).
      for (int64_t j = 0; j < 16; ++j)
        for (int64_t k = 0; k < 8; ++k)
          for (int64_t b = 0; b < 4; ++b) {
            const int64_t c = chunk * kInterleaveChunk + 32 * j + 4 * k + b;
            if (w.format == WeightFormat::Q8) {
              codes[64 * k + 4 * j + b] = uint8_t(plain[c] ^ 0x80);  // q + 128
            } else {
              const uint8_t packed = plain[c / 2];
              const uint8_t code = c % 2 ? packed >> 4 : packed & 0xf;  // stored as q + 8 already
              codes[64 * (k % 4) + 4 * j + b] |= k >= 4 ? uint8_t(code << 4) : code;
            }
          }
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
      (first % kInterleaveGroupRows || (count % kInterleaveGroupRows && first + count != rows)))
    fail("row slice [{}, +{}) of an interleaved matrix does not fall on groups of {} rows", first, count,
         kInterleaveGroupRows);
  WeightMatrix s = *this;
  s.rows = count;
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
      if (layout == WeightLayout::Interleaved) {
        const InterleavedRow place = interleaved_row(*this, r);
        for (int64_t c = 0; c < cols; ++c) {
          const int64_t chunk = c / kInterleaveChunk, in_chunk = c % kInterleaveChunk;
          uint16_t sbits;
          std::memcpy(&sbits, place.scales + chunk * place.chunk_step + 2 * (in_chunk / kQuantBlock), 2);
          out[c] = f16_to_f32(sbits) * float(interleaved_code(format, place.codes + chunk * place.chunk_step, in_chunk));
        }
        return;
      }
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
