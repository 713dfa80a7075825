#pragma once
// A stretch of memory, as a reader of it sees it (a weight matrix's codes, its scales).
#include <cstddef>
#include <cstdint>

namespace tandem {

struct ByteRange {
  const uint8_t* data = nullptr;
  size_t bytes = 0;
};

}  // namespace tandem
