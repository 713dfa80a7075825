#pragma once
// Typed access to a simdjson DOM for the tokenizer.json loader: every failure throws Error naming
// the file and the JSON path ("model.vocab: expected an object, found an array").
#include <simdjson.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "core/error.h"

namespace tandem::tok {

class JsonReader {
 public:
  using Element = simdjson::dom::element;
  using Object = simdjson::dom::object;
  using Array = simdjson::dom::array;

  explicit JsonReader(const std::string& origin) : origin_(origin) {}

  template <typename... Args>
  [[noreturn]] void fail(std::string_view path, fmt::format_string<Args...> what, Args&&... args) const {
    throw Error(fmt::format("{}: {}: {}", origin_, path, fmt::format(what, std::forward<Args>(args)...)));
  }

  static const char* kind(Element e) {
    switch (e.type()) {
      case simdjson::dom::element_type::ARRAY: return "an array";
      case simdjson::dom::element_type::OBJECT: return "an object";
      case simdjson::dom::element_type::INT64:
      case simdjson::dom::element_type::UINT64:
      case simdjson::dom::element_type::DOUBLE: return "a number";
      case simdjson::dom::element_type::STRING: return "a string";
      case simdjson::dom::element_type::BOOL: return "a boolean";
      case simdjson::dom::element_type::NULL_VALUE: return "null";
    }
    return "something else";
  }

  Object object(Element e, std::string_view path) const {
    Object o;
    if (e.get_object().get(o)) fail(path, "expected an object, found {}", kind(e));
    return o;
  }
  Array array(Element e, std::string_view path) const {
    Array a;
    if (e.get_array().get(a)) fail(path, "expected an array, found {}", kind(e));
    return a;
  }
  std::string_view string(Element e, std::string_view path) const {
    std::string_view s;
    if (e.get_string().get(s)) fail(path, "expected a string, found {}", kind(e));
    return s;
  }
  int64_t integer(Element e, std::string_view path) const {
    int64_t v;
    if (e.get_int64().get(v)) fail(path, "expected an integer, found {}", kind(e));
    return v;
  }
  bool boolean(Element e, std::string_view path) const {
    bool v;
    if (e.get_bool().get(v)) fail(path, "expected true or false, found {}", kind(e));
    return v;
  }

  // The member, or nullopt when it is absent or null (tokenizer.json writes null for "none").
  static std::optional<Element> member(Object o, std::string_view key) {
    Element e;
    if (o.at_key(key).get(e) || e.is_null()) return std::nullopt;
    return e;
  }
  Element required(Object o, std::string_view key, std::string_view path) const {
    auto e = member(o, key);
    if (!e) fail(path, "missing \"{}\"", key);
    return *e;
  }
  bool flag(Object o, std::string_view key, bool fallback, std::string_view path) const {
    auto e = member(o, key);
    return e ? boolean(*e, fmt::format("{}.{}", path, key)) : fallback;
  }
  // An object's "type", e.g. "BPE" or "Replace".
  std::string_view type(Object o, std::string_view path) const {
    return string(required(o, "type", path), fmt::format("{}.type", path));
  }

  const std::string& origin() const { return origin_; }

 private:
  const std::string& origin_;
};

}  // namespace tandem::tok
