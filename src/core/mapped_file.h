#pragma once
// A read-only memory map of a whole file. Weights are used in place from here (zero-copy).
#include <cstddef>
#include <cstdint>
#include <stop_token>
#include <string>

namespace tandem {

class MappedFile {
 public:
  MappedFile() = default;
  explicit MappedFile(const std::string& path);  // throws Error naming the file
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  bool contains(const void* p) const {
    return data_ && static_cast<const uint8_t*>(p) >= data_ && static_cast<const uint8_t*>(p) < data_ + size_;
  }
  const std::string& path() const { return path_; }

  // Hints that the byte range will be read soon / read sequentially (madvise); harmless if ignored.
  void advise_willneed(size_t offset, size_t length) const;
  void advise_sequential() const;
  // No huge-page mappings of the range (MADV_NOHUGEPAGE): for data read a few KB at random places.
  void advise_no_huge_pages(size_t offset, size_t length) const;
  // Reads bytes [offset, offset + length) of the file with pread, so that they sit in the page
  // cache and later touches of the mapping are minor faults, not disk reads. Nothing is mapped
  // into this process (RSS unchanged). Returns false if the file cannot be read or `stop` was
  // requested first (checked between 8 MB reads).
  bool read_into_page_cache(size_t offset, size_t length, std::stop_token stop = {}) const;
  // Copies bytes [offset, offset + length) of the file into dst with pread, without touching the
  // mapping (for data gathered a few KB at a time: a touched mapping counts whole page-cache folios
  // as this process's RSS). Returns false if the range is outside the file or cannot be read.
  bool read(size_t offset, size_t length, void* dst) const;

 private:
  void release();
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  int fd_ = -1;  // kept open for read()
};

}  // namespace tandem

namespace tandem {

// MemAvailable from /proc/meminfo (bytes the kernel can hand out without swapping), 0 if unknown.
uint64_t available_memory_bytes();

}  // namespace tandem
