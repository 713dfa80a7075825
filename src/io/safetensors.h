#pragma once
// The safetensors format: an 8-byte little-endian header length, a JSON header naming each tensor's
// dtype, shape and byte range, then the raw data. Files are memory-mapped and every header field is
// checked before any tensor is used, so a malformed file gives an Error naming file and tensor.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/mapped_file.h"

namespace tandem {

struct TensorInfo {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // inside the file's mapping, not necessarily aligned
  size_t nbytes = 0;
  std::string file;               // path of the file holding it, for error messages

  int64_t numel() const;
  std::string shape_string() const;  // "[2560, 10240]"
};

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);

  const std::string& path() const { return file_.path(); }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const MappedFile& mapping() const { return file_; }

 private:
  MappedFile file_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

struct TensorSpec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  size_t nbytes() const;
};

// Writes one safetensors file, streaming the data: the header is written first from the specs,
// then the tensors' bytes in spec order through write().
class SafetensorsWriter {
 public:
  SafetensorsWriter(const std::string& path, std::vector<TensorSpec> specs,
                    const std::map<std::string, std::string>& metadata = {{"format", "pt"}});
  ~SafetensorsWriter();
  void write(const void* bytes, size_t n);
  void finish();  // checks that exactly the announced bytes were written, then closes
  size_t data_bytes() const { return total_; }

 private:
  std::string path_;
  std::FILE* out_ = nullptr;
  size_t total_ = 0;
  size_t written_ = 0;
};

}  // namespace tandem
