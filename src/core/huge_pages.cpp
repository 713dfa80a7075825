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

void* reserve_huge_page_region(size_t bytes) {
  if (bytes == 0) return nullptr;
  const size_t page = size_t(::sysconf(_SC_PAGESIZE) > 0 ? ::sysconf(_SC_PAGESIZE) : 4096);
  const size_t length = (bytes + page - 1) / page * page;
  const size_t span = length + kHugePageBytes;  // room to start on a 2 MB boundary
  void* raw = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const uintptr_t first = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t begin = (first + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  if (begin > first) ::munmap(raw, begin - first);
  const uintptr_t end = begin + length, last = first + span;
  if (last > end) ::munmap(reinterpret_cast<void*>(end), last - end);
  ::madvise(reinterpret_cast<void*>(begin), length, MADV_HUGEPAGE);  // best effort, before any touch
  return reinterpret_cast<void*>(begin);
}

}  // namespace tandem
