#pragma once
// A checkpoint folder as Hugging Face publishes it: model.safetensors, or shards listed in
// model.safetensors.index.json, plus JSON side files. Knows nothing about any particular model.
#include <nlohmann/json.hpp>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/files.h"
#include "io/safetensors.h"

namespace tandem {

class CheckpointFiles {
 public:
  explicit CheckpointFiles(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const TensorInfo* find(std::string_view name) const;
  const TensorInfo& get(std::string_view name) const;  // Error "missing tensor" if absent
  std::vector<const TensorInfo*> tensors() const;      // sorted by name
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }
  const std::map<std::string, std::string>& metadata() const;  // of the first file
  // The mapping that holds address p (a tensor's data), or nullptr.
  const MappedFile* mapping_of(const void* p) const;

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::unordered_map<std::string_view, const TensorInfo*> by_name_;
};

// Reads and parses a JSON file; Error naming the file if it is missing or malformed.
nlohmann::json read_json_file(const std::string& path);
std::optional<nlohmann::json> read_json_file_if_present(const std::string& path);

}  // namespace tandem
