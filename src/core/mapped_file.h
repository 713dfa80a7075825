#pragma once
// A read-only memory map of a whole file. Weights are used in place from here (zero-copy).
#include <cstddef>
#include <cstdint>
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
  const std::string& path() const { return path_; }

  // Hints that the byte range will be read soon / read sequentially (madvise); harmless if ignored.
  void advise_willneed(size_t offset, size_t length) const;
  void advise_sequential() const;

 private:
  void release();
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace tandem
