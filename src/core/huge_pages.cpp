#include "core/huge_pages.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
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

void prefault_fresh_pages(void* p, size_t bytes) {
  if (!p || bytes == 0) return;
  ::madvise(p, bytes, MADV_HUGEPAGE);
#ifndef MADV_POPULATE_WRITE
  constexpr int MADV_POPULATE_WRITE = 23;  // Linux 5.14; older kernels answer EINVAL
#endif
  if (::madvise(p, bytes, MADV_POPULATE_WRITE) == 0) return;
  const size_t page = size_t(::sysconf(_SC_PAGESIZE) > 0 ? ::sysconf(_SC_PAGESIZE) : 4096);
  volatile uint8_t* bytes_at = static_cast<volatile uint8_t*>(p);
  for (size_t i = 0; i < bytes; i += page) bytes_at[i] = 0;
}

}  // namespace tandem
