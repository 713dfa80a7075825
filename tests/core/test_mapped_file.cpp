// MappedFile: reading a range into the page cache without mapping it, and MemAvailable.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <stop_token>
#include <string>
#include <vector>

#include "core/mapped_file.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

class PageCache : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = (fs::temp_directory_path() / ("tandem-page-cache-" + std::to_string(::getpid()))).string();
    std::ofstream out(path_, std::ios::binary);
    bytes_.resize((size_t(3) << 20) + 123);
    for (size_t i = 0; i < bytes_.size(); ++i) bytes_[i] = char((i * 2654435761u) >> 13);
    out.write(bytes_.data(), std::streamsize(bytes_.size()));
  }
  void TearDown() override { fs::remove(path_); }

  // Best effort: the file's pages leave the page cache (clean pages, so the kernel may drop them).
  void evict() const {
    const int fd = ::open(path_.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }

  // Pages of [offset, offset + length) of m that mincore reports in memory, and the total.
  static std::pair<size_t, size_t> resident_pages(const MappedFile& m, size_t offset, size_t length) {
    const size_t page = size_t(::sysconf(_SC_PAGESIZE));
    const size_t first = offset / page, last = (offset + length + page - 1) / page;
    std::vector<unsigned char> flags(last - first);
    EXPECT_EQ(::mincore(const_cast<uint8_t*>(m.data()) + first * page, (last - first) * page, flags.data()), 0);
    size_t in = 0;
    for (unsigned char f : flags) in += f & 1;
    return {in, flags.size()};
  }

  std::string path_;
  std::vector<char> bytes_;
};

TEST_F(PageCache, ReadCopiesExactlyTheRangeAndRefusesOneOutsideTheFile) {
  MappedFile m(path_);
  const size_t offset = 4096 * 3 + 17, length = 70000;
  std::vector<char> got(length + 1, 'x');
  ASSERT_TRUE(m.read(offset, length, got.data()));
  EXPECT_TRUE(std::equal(got.begin(), got.begin() + long(length), bytes_.begin() + long(offset)));
  EXPECT_EQ(got[length], 'x');
  ASSERT_TRUE(m.read(bytes_.size() - 5, 5, got.data()));
  EXPECT_TRUE(std::equal(got.begin(), got.begin() + 5, bytes_.end() - 5));
  EXPECT_FALSE(m.read(bytes_.size() - 5, 6, got.data()));
  EXPECT_FALSE(m.read(bytes_.size() + 1, 0, got.data()));
  MappedFile moved(std::move(m));
  EXPECT_TRUE(moved.read(0, 3, got.data()));
  EXPECT_FALSE(m.read(0, 3, got.data()));  // NOLINT(bugprone-use-after-move): a moved-from map reads nothing
}

TEST_F(PageCache, ReadsTheRangeInWithoutChangingTheMapping) {
  MappedFile m(path_);
  evict();
  const size_t offset = 4096 + 100, length = (size_t(2) << 20) + 5;
  ASSERT_TRUE(m.read_into_page_cache(offset, length));
  const auto [in, total] = resident_pages(m, offset, length);
  EXPECT_EQ(in, total);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(m.data()), m.size()), std::string(bytes_.data(), bytes_.size()));
}

TEST_F(PageCache, ClipsAtTheEndAndRefusesRangesPastIt) {
  MappedFile m(path_);
  EXPECT_TRUE(m.read_into_page_cache(m.size() - 10, 1 << 20));  // clipped to the last 10 bytes
  EXPECT_TRUE(m.read_into_page_cache(m.size(), 0));
  EXPECT_FALSE(m.read_into_page_cache(m.size(), 1));
}

TEST_F(PageCache, StopsWhenAsked) {
  MappedFile m(path_);
  std::stop_source source;
  source.request_stop();
  EXPECT_FALSE(m.read_into_page_cache(0, m.size(), source.get_token()));
}

TEST(AvailableMemory, IsReportedOnLinux) {
  const uint64_t bytes = available_memory_bytes();
  EXPECT_GT(bytes, uint64_t(1) << 20);
  EXPECT_LT(bytes, uint64_t(1) << 50);
}

}  // namespace
}  // namespace tandem
