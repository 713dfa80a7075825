#include "core/huge_pages.h"

#include <sys/mman.h>

#include <new>

namespace tandem {

void* huge_page_alloc(size_t bytes) {
  if (bytes < kHugePageBytes) {
    if (void* p = std::malloc(bytes == 0 ? 1 : bytes)) return p;
    throw std::bad_alloc();
  }
  const size_t rounded = (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  void* p = std::aligned_alloc(kHugePageBytes, rounded);
  if (!p) throw std::bad_alloc();
  ::madvise(p, rounded, MADV_HUGEPAGE);  // before the first touch: the pages are faulted in huge
  return p;
}

}  // namespace tandem
