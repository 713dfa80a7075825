#include "model/gathered_rows.h"

#include <numeric>

#include "core/mapped_file.h"

namespace tandem {

GatheredRows::GatheredRows(const WeightMatrix& table, const MappedFile* file) : table_(table), file_(file) {
  rows_ = table;
  rows_.rows = 0;
  rows_.row_stride = row_bytes(table.format, table.cols);
  rows_.scale_stride = scale_row_bytes(table.format, table.cols);
  // A view that is not a plain run of whole rows (or a layout read differently) keeps the mapping.
  if (table.layout != WeightLayout::Plain || (is_quantized(table.format) && file_ && !file_->contains(table.scales)))
    file_ = nullptr;
}

bool GatheredRows::read_row(int64_t row, int64_t slot) {
  const uint8_t* src = table_.data + row * table_.row_stride;
  if (!file_->read(size_t(src - file_->data()), size_t(rows_.row_stride), data_.data() + slot * rows_.row_stride))
    return false;
  if (!is_quantized(table_.format)) return true;
  const uint8_t* scales = table_.scales + row * table_.scale_stride;
  return file_->read(size_t(scales - file_->data()), size_t(rows_.scale_stride),
                     scales_.data() + slot * rows_.scale_stride);
}

GatheredRows::View GatheredRows::gather(const int32_t* ids, int64_t n) {
  if (file_ == nullptr || n == 0) return {&table_, ids};
  data_.resize(size_t(n * rows_.row_stride));
  scales_.resize(size_t(n * rows_.scale_stride));
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= table_.rows || !read_row(ids[i], i)) return {&table_, ids};
  if (int64_t(slots_.size()) < n) {
    slots_.resize(size_t(n));
    std::iota(slots_.begin(), slots_.end(), 0);
  }
  rows_.data = data_.data();
  rows_.scales = is_quantized(table_.format) ? scales_.data() : nullptr;
  rows_.rows = n;
  return {&rows_, slots_.data()};
}

}  // namespace tandem
