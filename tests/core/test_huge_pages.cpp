#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstdint>
#include <cstring>

#include "core/huge_pages.h"
#include "support/test_support.h"

namespace tandem {
namespace {

// A reserved region starts on a 2 MB boundary, holds every byte asked for, and is advised for huge
// pages (VmFlags "hg") before anything touches it.
TEST(HugePages, ReservedRegionsStartOnA2MBBoundaryAdvisedForHugePages) {
  for (size_t bytes : {size_t(1), kHugePageBytes, 5 * kHugePageBytes + 12345}) {
    auto* p = static_cast<uint8_t*>(reserve_huge_page_region(bytes));
    ASSERT_NE(p, nullptr) << bytes;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kHugePageBytes, 0u) << bytes;
    const test::MappingFlags m = test::mapping_flags_of(p);
    EXPECT_LE(m.begin, reinterpret_cast<uintptr_t>(p)) << bytes;
    EXPECT_GE(m.end, reinterpret_cast<uintptr_t>(p) + bytes) << bytes;
    if (test::kernel_has_transparent_huge_pages()) {
      EXPECT_NE(m.flags.find(" hg"), std::string::npos) << m.flags;
    }
    std::memset(p, 7, bytes);
    EXPECT_EQ(p[0], 7);
    EXPECT_EQ(p[bytes - 1], 7);
    ::munmap(p, bytes);
  }
  EXPECT_EQ(reserve_huge_page_region(0), nullptr);
}

}  // namespace
}  // namespace tandem
