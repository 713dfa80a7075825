#pragma once
// A std::allocator for the tokenizer's big lookup tables (tens of MB, read at random): they are
// placed on 2 MB pages where the kernel allows (transparent huge pages, madvise mode), which cuts
// both the TLB misses of random lookups and the number of page faults while the tables are built.
// Falls back to ordinary pages silently.
#include <cstddef>
#include <cstdlib>

#include "core/huge_pages.h"

namespace tandem::tok {

template <typename T>
struct HugePageAllocator {
  using value_type = T;

  HugePageAllocator() = default;
  template <typename U>
  HugePageAllocator(const HugePageAllocator<U>&) {}

  T* allocate(size_t n) { return static_cast<T*>(huge_page_alloc(n * sizeof(T))); }
  void deallocate(T* p, size_t) { std::free(p); }

  template <typename U>
  bool operator==(const HugePageAllocator<U>&) const { return true; }
};

}  // namespace tandem::tok
