#include "io/checkpoint.h"

#include <sys/stat.h>

#include <algorithm>
#include <set>

#include "core/error.h"

namespace tandem {

nlohmann::json read_json_file(const std::string& path) {
  const std::string text = read_text_file(path);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not valid JSON ({})", path, e.what());
  }
}

std::optional<nlohmann::json> read_json_file_if_present(const std::string& path) {
  if (!file_exists(path)) return std::nullopt;
  return read_json_file(path);
}

CheckpointFiles::CheckpointFiles(const std::string& dir) : dir_(dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) fail("{}: not a model folder", dir);

  const std::string index_path = dir + "/model.safetensors.index.json";
  std::vector<std::string> shard_names;
  nlohmann::json weight_map;
  if (file_exists(index_path)) {
    nlohmann::json index = read_json_file(index_path);
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
      fail("{}: has no weight_map object", index_path);
    weight_map = index["weight_map"];
    std::set<std::string> unique;
    for (auto& [tensor, file] : weight_map.items()) {
      if (!file.is_string()) fail("{}: weight_map entry '{}' is not a file name", index_path, tensor);
      const std::string f = file.get<std::string>();
      if (f.find('/') != std::string::npos)
        fail("{}: weight_map entry '{}' points outside the folder ({})", index_path, tensor, f);
      if (unique.insert(f).second) shard_names.push_back(f);
    }
    std::sort(shard_names.begin(), shard_names.end());
    if (shard_names.empty()) fail("{}: weight_map is empty", index_path);
  } else if (file_exists(dir + "/model.safetensors")) {
    shard_names.push_back("model.safetensors");
  } else {
    fail("{}: no model.safetensors or model.safetensors.index.json", dir);
  }

  for (const auto& name : shard_names) {
    const std::string path = dir + "/" + name;
    if (!file_exists(path)) fail("{}: shard listed in the index is missing", path);
    files_.push_back(std::make_unique<SafetensorsFile>(path));
  }
  for (const auto& file : files_) {
    for (const auto& t : file->tensors()) {
      auto [it, inserted] = by_name_.emplace(t.name, &t);
      if (!inserted)
        fail("tensor '{}' appears in both {} and {}", t.name, it->second->file, t.file);
    }
  }
  // The index and the shards must agree, or a loader following either one gets different weights.
  for (auto& [tensor, file] : weight_map.items()) {
    const TensorInfo* t = find(tensor);
    const std::string expected = dir + "/" + file.get<std::string>();
    if (!t) fail("{}: index lists tensor '{}' but the shard does not contain it", expected, tensor);
    if (t->file != expected)
      fail("{}: index says tensor '{}' is in {}, but it is in {}", index_path, tensor, expected, t->file);
  }
}

const TensorInfo* CheckpointFiles::find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

const MappedFile* CheckpointFiles::mapping_of(const void* p) const {
  for (const auto& file : files_)
    if (file->mapping().contains(p)) return &file->mapping();
  return nullptr;
}

const TensorInfo& CheckpointFiles::get(std::string_view name) const {
  const TensorInfo* t = find(name);
  if (!t) fail("{}: missing tensor '{}'", dir_, name);
  return *t;
}

std::vector<const TensorInfo*> CheckpointFiles::tensors() const {
  std::vector<const TensorInfo*> all;
  for (const auto& [name, t] : by_name_) all.push_back(t);
  std::sort(all.begin(), all.end(), [](auto* a, auto* b) { return a->name < b->name; });
  return all;
}

const std::map<std::string, std::string>& CheckpointFiles::metadata() const {
  return files_.front()->metadata();
}

}  // namespace tandem
