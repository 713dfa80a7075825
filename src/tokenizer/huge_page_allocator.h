#pragma once
// A std::allocator for the tokenizer's big lookup tables (tens of MB, read at random): they are
// placed on 2 MB pages where the kernel allows (transparent huge pages, madvise mode), which cuts
// both the TLB misses of random lookups and the number of page faults while the tables are built.
// Falls back to ordinary pages silently.
#include <sys/mman.h>

#include <cstddef>
#include <cstdlib>
#include <new>

namespace tandem::tok {

template <typename T>
struct HugePageAllocator {
  using value_type = T;
  static constexpr size_t kHugePage = size_t(2) << 20;

  HugePageAllocator() = default;
  template <typename U>
  HugePageAllocator(const HugePageAllocator<U>&) {}

  T* allocate(size_t n) {
    const size_t bytes = n * sizeof(T);
    if (bytes < kHugePage) {
      if (void* p = std::malloc(bytes)) return static_cast<T*>(p);
      throw std::bad_alloc();
    }
    const size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
    void* p = std::aligned_alloc(kHugePage, rounded);
    if (!p) throw std::bad_alloc();
    ::madvise(p, rounded, MADV_HUGEPAGE);
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) { std::free(p); }

  template <typename U>
  bool operator==(const HugePageAllocator<U>&) const { return true; }
};

}  // namespace tandem::tok
