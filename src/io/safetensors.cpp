#include "io/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include "core/error.h"

namespace tandem {

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorInfo::shape_string() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

size_t TensorSpec::nbytes() const {
  size_t n = dtype_size(dtype);
  for (int64_t d : shape) n *= size_t(d);
  return n;
}

namespace {

constexpr uint64_t kMaxHeaderBytes = 100u << 20;  // the format's own limit

// Parses the header JSON, refusing duplicate tensor names (a plain parse would keep the last one).
nlohmann::json parse_header(const std::string& path, std::string_view text) {
  std::set<std::string> seen;
  std::string duplicate;
  auto on_event = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (depth == 1 && event == nlohmann::json::parse_event_t::key && parsed.is_string()) {
      if (!seen.insert(parsed.get<std::string>()).second && duplicate.empty())
        duplicate = parsed.get<std::string>();
    }
    return true;
  };
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text.begin(), text.end(), on_event);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: the safetensors header is not valid JSON ({})", path, e.what());
  }
  if (!duplicate.empty()) fail("{}: tensor '{}' appears twice in the header", path, duplicate);
  if (!header.is_object()) fail("{}: the safetensors header is not a JSON object", path);
  return header;
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : file_(path) {
  const size_t size = file_.size();
  if (size < 8) fail("{}: truncated: {} bytes, too short for a safetensors header", path, size);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | file_.data()[i];
  if (header_len > size - 8)
    fail("{}: header length {} runs past the end of the file ({} bytes)", path, header_len, size);
  if (header_len > kMaxHeaderBytes) fail("{}: header length {} is implausibly large", path, header_len);

  const char* text = reinterpret_cast<const char*>(file_.data() + 8);
  nlohmann::json header = parse_header(path, std::string_view(text, header_len));
  const uint8_t* data_start = file_.data() + 8 + header_len;
  const size_t data_size = size - 8 - header_len;

  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (entry.is_object())
        for (auto& [k, v] : entry.items())
          if (v.is_string()) metadata_[k] = v.get<std::string>();
      continue;
    }
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
        !entry.contains("data_offsets"))
      fail("{}: tensor '{}': header entry needs dtype, shape and data_offsets", path, name);
    const auto& dt = entry["dtype"];
    auto dtype = dt.is_string() ? dtype_from_name(dt.get<std::string>()) : std::nullopt;
    if (!dtype) fail("{}: tensor '{}': unknown dtype {}", path, name, dt.dump());
    const auto& shape_json = entry["shape"];
    const auto& offsets = entry["data_offsets"];
    if (!shape_json.is_array()) fail("{}: tensor '{}': shape is not a list", path, name);
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned())
      fail("{}: tensor '{}': data_offsets must be two non-negative integers", path, name);

    TensorInfo info;
    info.name = name;
    info.dtype = *dtype;
    info.file = path;
    unsigned __int128 bytes = dtype_size(*dtype);
    for (const auto& d : shape_json) {
      if (!d.is_number_unsigned()) fail("{}: tensor '{}': shape {} is invalid", path, name, shape_json.dump());
      info.shape.push_back(d.get<int64_t>());
      // Checked each step: a product past 2^64 bytes could wrap (even in 128 bits) into a size that fits.
      bytes *= d.get<uint64_t>();
      if (d.get<uint64_t>() > uint64_t(INT64_MAX) || bytes > UINT64_MAX)
        fail("{}: tensor '{}': shape {} is larger than any file", path, name, shape_json.dump());
    }
    const uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
    if (begin > end || end > data_size)
      fail("{}: tensor '{}': data_offsets [{}, {}] out of range (data section is {} bytes)", path, name,
           begin, end, data_size);
    if (bytes != end - begin)
      fail("{}: tensor '{}': shape {} of {} needs {} bytes but data_offsets span {}", path, name,
           info.shape_string(), dtype_name(*dtype), uint64_t(bytes), end - begin);
    info.data = data_start + begin;
    info.nbytes = end - begin;
    tensors_.push_back(std::move(info));
  }

  std::vector<const TensorInfo*> by_offset;
  for (const auto& t : tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->data < b->data; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo* prev = by_offset[i - 1];
    if (by_offset[i]->data < prev->data + prev->nbytes)
      fail("{}: tensors '{}' and '{}' overlap in the data section", path, prev->name, by_offset[i]->name);
  }
  std::sort(tensors_.begin(), tensors_.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const TensorInfo& t, std::string_view n) { return t.name < n; });
  return it != tensors_.end() && it->name == name ? &*it : nullptr;
}

SafetensorsWriter::SafetensorsWriter(const std::string& path, std::vector<TensorSpec> specs,
                                     const std::map<std::string, std::string>& metadata)
    : path_(path) {
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  for (const auto& spec : specs) {
    const size_t n = spec.nbytes();
    header[spec.name] = {{"dtype", std::string(dtype_name(spec.dtype))},
                         {"shape", spec.shape},
                         {"data_offsets", {total_, total_ + n}}};
    total_ += n;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keeps the data section 8-byte aligned
  out_ = std::fopen(path.c_str(), "wb");
  if (!out_) fail("{}: cannot create: {}", path, std::strerror(errno));
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(text.size()) >> (8 * i));
  if (std::fwrite(len, 1, 8, out_) != 8 || std::fwrite(text.data(), 1, text.size(), out_) != text.size())
    fail("{}: write failed: {}", path, std::strerror(errno));
}

SafetensorsWriter::~SafetensorsWriter() {
  if (out_) std::fclose(out_);
}

void SafetensorsWriter::write(const void* bytes, size_t n) {
  if (written_ + n > total_) fail("{}: more tensor data written than the header announced", path_);
  if (n && std::fwrite(bytes, 1, n, out_) != n) fail("{}: write failed: {}", path_, std::strerror(errno));
  written_ += n;
}

void SafetensorsWriter::finish() {
  if (!out_) return;
  if (written_ != total_)
    fail("{}: {} bytes of tensor data written, header announced {}", path_, written_, total_);
  if (std::fclose(out_) != 0) {
    out_ = nullptr;
    fail("{}: close failed: {}", path_, std::strerror(errno));
  }
  out_ = nullptr;
}

}  // namespace tandem
