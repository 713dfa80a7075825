// Gemma4Checkpoint::warm_ple_table: the PLE table's bytes in the page cache, found through the
// checkpoint's own file mappings (CheckpointFiles::mapping_of).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <vector>

#include "model/checkpoint.h"
#include "support/test_support.h"

namespace tandem {
namespace {

// Pages of [p, p + bytes) that mincore reports in memory, and the total.
std::pair<size_t, size_t> resident_pages(const uint8_t* p, size_t bytes) {
  const size_t page = size_t(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = reinterpret_cast<uintptr_t>(p) / page * page;
  const size_t span = reinterpret_cast<uintptr_t>(p) + bytes - first;
  std::vector<unsigned char> flags((span + page - 1) / page);
  EXPECT_EQ(::mincore(reinterpret_cast<void*>(first), span, flags.data()), 0);
  size_t in = 0;
  for (unsigned char f : flags) in += f & 1;
  return {in, flags.size()};
}

TEST(Checkpoint, WarmPleTableReadsTheWholeTableIntoThePageCache) {
  auto ckpt = Gemma4Checkpoint::open(test::golden_tiny_checkpoint());
  for (const auto& file : ckpt->files.files()) {  // best effort: start from a cold cache
    const int fd = ::open(file->mapping().path().c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
  const WeightMatrix& table = ckpt->weights.ple_table;
  ASSERT_FALSE(table.empty());
  ASSERT_TRUE(ckpt->warm_ple_table());
  const auto [in, total] = resident_pages(table.data, size_t(table.rows) * size_t(table.row_stride));
  EXPECT_EQ(in, total);
}

TEST(Checkpoint, FindsTheMappingThatHoldsATensor) {
  auto ckpt = Gemma4Checkpoint::open(test::golden_tiny_checkpoint());
  const std::vector<uint8_t> elsewhere(4096);
  EXPECT_EQ(ckpt->files.mapping_of(elsewhere.data()), nullptr);
  const WeightMatrix& embed = ckpt->weights.embed;
  const MappedFile* m = ckpt->files.mapping_of(embed.data);
  ASSERT_NE(m, nullptr);
  EXPECT_TRUE(embed.data >= m->data() && embed.data + embed.row_stride * embed.rows <= m->data() + m->size());
}

}  // namespace
}  // namespace tandem
