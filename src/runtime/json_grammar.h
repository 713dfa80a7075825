#pragma once
// What output held to JSON may be: a JSON Schema compiled to plain nodes (server/json_schema.cpp
// writes them from OpenAI's response_format json_schema; `any_object()` is json_object), which
// JsonPrefix (json_output.h) reads output against a byte at a time.
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace tandem {

struct JsonSchemaNode {
  enum Type : uint8_t {
    kNull = 1, kBoolean = 2, kInteger = 4, kNumber = 8, kString = 16, kArray = 32, kObject = 64, kAnyType = 127
  };
  uint8_t types = kAnyType;  // kNumber includes the integers
  // Non-empty: the value is one of these nodes' values, and the fields below are unused.
  std::vector<int32_t> any_of;
  // Non-empty: the value is one of these JSON texts, byte for byte (enum, const).
  std::vector<std::string> literals;

  struct Property {
    std::string key;  // as written between the quotes (escaped)
    int32_t node = 0;
    bool required = false;
  };
  std::vector<Property> properties;  // written in this order, the optional ones may be left out
  int32_t other_properties = -1;     // the node of values under keys not declared; -1: none
  int32_t items = 0;                 // an array's items
  uint32_t min_items = 0, max_items = std::numeric_limits<uint32_t>::max();
  uint32_t min_length = 0, max_length = std::numeric_limits<uint32_t>::max();  // a string's characters
  // When `bounded`, numbers within [minimum, maximum], in units of 10^-kBoundDecimals, written
  // without an exponent, with at most kBoundDecimals fraction digits and 19 integer digits (integer
  // nodes: multiples of 10^kBoundDecimals, so the bounds are whole).
  static constexpr int kBoundDecimals = 15;
  bool bounded = false;
  __int128 minimum = 0, maximum = 0;
};

struct JsonGrammar {
  std::vector<JsonSchemaNode> nodes;
  int32_t root = 0;

  // Any JSON object (OpenAI's json_object).
  static const JsonGrammar& any_object();
};

}  // namespace tandem
