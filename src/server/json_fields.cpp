#include "server/json_fields.h"

#include <fmt/format.h>

#include <cmath>

#include "server/api_error.h"

namespace tandem::server {

using nlohmann::json;

bool is_valid_utf8(std::string_view text, size_t* bad_offset) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char b = p[i];
    if (b < 0x80) {
      ++i;
      continue;
    }
    int length = 0;
    unsigned char low = 0x80, high = 0xBF;  // the allowed range of the second byte
    if (b >= 0xC2 && b <= 0xDF) {
      length = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      length = 3;
      if (b == 0xE0) low = 0xA0;   // overlong
      if (b == 0xED) high = 0x9F;  // surrogates
    } else if (b >= 0xF0 && b <= 0xF4) {
      length = 4;
      if (b == 0xF0) low = 0x90;   // overlong
      if (b == 0xF4) high = 0x8F;  // past U+10FFFF
    } else {
      if (bad_offset) *bad_offset = i;
      return false;
    }
    if (i + size_t(length) > n || p[i + 1] < low || p[i + 1] > high) {
      if (bad_offset) *bad_offset = i;
      return false;
    }
    for (int k = 2; k < length; ++k) {
      if ((p[i + size_t(k)] & 0xC0) != 0x80) {
        if (bad_offset) *bad_offset = i;
        return false;
      }
    }
    i += size_t(length);
  }
  return true;
}

namespace {

// The deepest bracket nesting outside strings. The JSON parser itself is iterative, but code that
// walks the result (and its destructor) recurses, so depth is bounded before parsing.
int nesting_depth(std::string_view text, int limit) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
      if (deepest > limit) return deepest;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

}  // namespace

json parse_json_object_body(std::string_view body, int max_depth) {
  size_t bad = 0;
  if (!is_valid_utf8(body, &bad))
    throw invalid_request({}, fmt::format("the request body is not valid UTF-8 (bad byte at offset {})", bad));
  if (nesting_depth(body, max_depth) > max_depth)
    throw invalid_request({}, fmt::format("the request body nests JSON deeper than {} levels", max_depth));
  json value;
  try {
    value = json::parse(body);
  } catch (const json::parse_error& e) {
    // nlohmann's message starts with "[json.exception.parse_error.101] "; keep what follows.
    std::string what = e.what();
    const size_t cut = what.find("] ");
    if (cut != std::string::npos) what = what.substr(cut + 2);
    throw invalid_request({}, "the request body is not valid JSON: " + what);
  } catch (const json::out_of_range& e) {
    // A number beyond float range (1e400): nlohmann refuses it while parsing, as JSON allows.
    std::string what = e.what();
    const size_t cut = what.find("] ");
    if (cut != std::string::npos) what = what.substr(cut + 2);
    throw invalid_request({}, "the request body holds a number out of range: " + what);
  }
  if (!value.is_object()) throw invalid_request({}, "the request body must be a JSON object, got " + json_kind(value));
  return value;
}

std::string json_kind(const json& value) {
  switch (value.type()) {
    case json::value_t::null: return "null";
    case json::value_t::object: return "an object";
    case json::value_t::array: return "an array";
    case json::value_t::string: return "a string";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a number";
    default: return "a value of another kind";
  }
}

const json* optional_field(const json& object, const char* name) {
  auto it = object.find(name);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<double> optional_number(const json& object, const char* name) {
  const json* v = optional_field(object, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) throw invalid_request(name, fmt::format("'{}' must be a number, got {}", name, json_kind(*v)));
  const double d = v->get<double>();
  if (!std::isfinite(d)) throw invalid_request(name, fmt::format("'{}' must be a finite number", name));
  return d;
}

std::optional<int64_t> optional_integer(const json& object, const char* name) {
  const json* v = optional_field(object, name);
  if (!v) return std::nullopt;
  if (v->is_number_unsigned()) {
    if (v->get<uint64_t>() > uint64_t(INT64_MAX)) throw invalid_request(name, fmt::format("'{}' is too large", name));
    return int64_t(v->get<uint64_t>());
  }
  if (v->is_number_integer()) return v->get<int64_t>();
  // Some clients serialize integers as 5.0; accept integral values only.
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::abs(d) < 9.0e18) return int64_t(d);
  }
  throw invalid_request(name, fmt::format("'{}' must be an integer, got {}", name, json_kind(*v)));
}

std::optional<bool> optional_bool(const json& object, const char* name) {
  const json* v = optional_field(object, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) throw invalid_request(name, fmt::format("'{}' must be a boolean, got {}", name, json_kind(*v)));
  return v->get<bool>();
}

std::optional<std::string> optional_string(const json& object, const char* name) {
  const json* v = optional_field(object, name);
  if (!v) return std::nullopt;
  if (!v->is_string()) throw invalid_request(name, fmt::format("'{}' must be a string, got {}", name, json_kind(*v)));
  return v->get<std::string>();
}

const json* optional_object(const json& object, const char* name, const std::string& param) {
  const json* v = optional_field(object, name);
  if (v && !v->is_object())
    throw invalid_request(param, fmt::format("'{}' must be an object, got {}", param, json_kind(*v)));
  return v;
}

}  // namespace tandem::server
