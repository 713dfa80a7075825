#include "core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <vector>

#include "core/error.h"

namespace tandem {

MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    fail("{}: cannot stat: {}", path, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("{}: not a regular file", path);
  }
  size_ = size_t(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      fail("{}: cannot mmap {} bytes: {}", path, size_, std::strerror(err));
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  fd_ = fd;
}

MappedFile::~MappedFile() { release(); }

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)), data_(other.data_), size_(other.size_), fd_(other.fd_) {
  other.data_ = nullptr;
  other.size_ = 0;
  other.fd_ = -1;
}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    data_ = other.data_;
    size_ = other.size_;
    fd_ = other.fd_;
    other.data_ = nullptr;
    other.size_ = 0;
    other.fd_ = -1;
  }
  return *this;
}

void MappedFile::release() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
  if (fd_ >= 0) ::close(fd_);
  data_ = nullptr;
  size_ = 0;
  fd_ = -1;
}

bool MappedFile::read(size_t offset, size_t length, void* dst) const {
  if (fd_ < 0 || offset > size_ || length > size_ - offset) return false;
  auto* out = static_cast<char*>(dst);
  for (size_t done = 0; done < length;) {
    const ssize_t got = ::pread(fd_, out + done, length - done, off_t(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    done += size_t(got);
  }
  return true;
}

void MappedFile::advise_willneed(size_t offset, size_t length) const {
  if (!data_ || offset >= size_) return;
  const size_t page = size_t(::sysconf(_SC_PAGESIZE));
  size_t begin = offset / page * page;
  size_t end = std::min(size_, offset + length);
  ::madvise(const_cast<uint8_t*>(data_) + begin, end - begin, MADV_WILLNEED);
}

bool MappedFile::read_into_page_cache(size_t offset, size_t length, std::stop_token stop) const {
  if (offset >= size_) return length == 0;
  const size_t end = std::min(size_, offset + length);
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  ::posix_fadvise(fd, off_t(offset), off_t(end - offset), POSIX_FADV_SEQUENTIAL);
  constexpr size_t kChunk = size_t(8) << 20;
  std::vector<char> buffer(std::min(kChunk, end - offset));
  bool ok = true;
  for (size_t at = offset; at < end && ok;) {
    if (stop.stop_requested()) {
      ok = false;
      break;
    }
    const ssize_t got = ::pread(fd, buffer.data(), std::min(kChunk, end - at), off_t(at));
    if (got < 0 && errno == EINTR) continue;
    ok = got > 0;
    if (ok) at += size_t(got);
  }
  ::close(fd);
  return ok;
}

void MappedFile::advise_no_huge_pages(size_t offset, size_t length) const {
  if (!data_ || offset >= size_) return;
  const size_t page = size_t(::sysconf(_SC_PAGESIZE));
  const size_t begin = offset / page * page;
  const size_t end = std::min(size_, offset + length);
  ::madvise(const_cast<uint8_t*>(data_) + begin, end - begin, MADV_NOHUGEPAGE);
}

void MappedFile::advise_sequential() const {
  if (data_) ::madvise(const_cast<uint8_t*>(data_), size_, MADV_SEQUENTIAL);
}

}  // namespace tandem

namespace tandem {

uint64_t available_memory_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  while (meminfo >> key >> kib) {
    if (key == "MemAvailable:") return kib * 1024;
    meminfo.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return 0;
}

}  // namespace tandem
