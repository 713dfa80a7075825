#pragma once
// Rows of a table that is gathered, not streamed: the PLE table, one ~20 KB row per token out of
// 5.6 GB (E4B). They are copied out of the file with pread instead of being read through the
// mapping: a touched mapping counts whole page-cache folios (hundreds of KB per row on recent
// kernels) as this process's RSS, so peak RSS grew with every distinct token and moved by over a
// GB between identical runs.
#include <cstdint>
#include <vector>

#include "kernels/weight.h"

namespace tandem {

class MappedFile;

class GatheredRows {
 public:
  // `file` is the mapping `table` points into; null reads through the mapping.
  GatheredRows(const WeightMatrix& table, const MappedFile* file);

  struct View {
    const WeightMatrix* matrix;  // row i of the gather is row ids[i] of *matrix
    const int32_t* ids;
  };
  // Rows ids[0..n) of the table. Falls back to the table itself (through the mapping) when there
  // is no file, an id is outside the table, or a read fails. The view lives until the next call.
  View gather(const int32_t* ids, int64_t n);

 private:
  bool read_row(int64_t row, int64_t slot);

  const WeightMatrix& table_;
  const MappedFile* file_;
  WeightMatrix rows_;  // the buffers below, row i = the i-th gathered row
  std::vector<uint8_t> data_, scales_;
  std::vector<int32_t> slots_;  // 0, 1, 2, ...
};

}  // namespace tandem
