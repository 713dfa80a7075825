#pragma once
// What output held to JSON may be: a JSON Schema compiled to plain nodes (server/json_schema.cpp
// writes them from OpenAI's response_format json_schema and from the tools' parameters;
// `any_object()` is json_object), which JsonPrefix (json_output.h) reads output against a byte at
// a time.
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

struct JsonSchemaNode {
  enum Type : uint8_t {
    kNull = 1, kBoolean = 2, kInteger = 4, kNumber = 8, kString = 16, kArray = 32, kObject = 64, kAnyType = 127
  };
  uint8_t types = kAnyType;  // kNumber includes the integers
  // Non-empty: the value is one of these nodes' values, and the fields below are unused.
  std::vector<int32_t> any_of;
  // Non-empty: the value is one of these JSON texts, byte for byte (enum, const), sorted and unique.
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
  // The fewest nested objects and arrays a value needs (of any type; an object; an array), so that
  // none is begun that cannot close within the 64 levels.
  uint32_t min_depth = 0, min_object_depth = 1, min_array_depth = 1;
};

// Bytes no UTF-8 text has, standing in TokenBytes for the Gemma 4 control tokens of its tool-call
// syntax, so the recognizer reads them as it reads text. (Byte tokens of 0xF8-0xFF read as 0xFF,
// which nothing takes.)
inline constexpr unsigned char kGemmaQuoteByte = 0xF8;      // <|"|>
inline constexpr unsigned char kToolCallOpenByte = 0xF9;    // <|tool_call>
inline constexpr unsigned char kToolCallCloseByte = 0xFA;   // <tool_call|>
inline constexpr unsigned char kChannelOpenByte = 0xFB;     // <|channel>
inline constexpr unsigned char kChannelCloseByte = 0xFC;    // <channel|>

// Gemma's markers as the output parser finds them in text: free text in a tool call or a thought must
// not spell one out of ordinary tokens, or the parser would end the string, call or thought there.
inline constexpr std::string_view kGemmaMarkers[] = {"<|\"|>",    "<|tool_call>", "<tool_call|>", "<|channel>",
                                                     "<channel|>", "<|turn>",      "<turn|>",      "<eos>",
                                                     "<|tool_response>", "<tool_response|>"};
inline bool spells_gemma_marker(std::string_view text) {
  for (std::string_view marker : kGemmaMarkers)
    if (text.find(marker) != std::string_view::npos) return true;
  return false;
}

// Output held to tool calls (tool_choice "required" or a named function) in Gemma 4's syntax:
// [<|channel>thought<channel|>] <|tool_call>call:NAME{ARGS}<tool_call|> ..., each ARGS a value of
// its function's node written in Gemma's value syntax (keys bare, strings between <|"|> as they
// are, no escapes), in place of JSON.
struct ToolCallGrammar {
  struct Function {
    std::string name;
    int32_t parameters = 0;  // an object node
  };
  std::vector<Function> functions;
  uint32_t max_calls = 1;
  enum class Thought : uint8_t { None, Optional, Open } thought = Thought::None;  // Open: the prompt opened it
};

struct JsonGrammar {
  std::vector<JsonSchemaNode> nodes;
  int32_t root = 0;
  bool tool_calls_only = false;  // `tool_calls` replaces the root value
  ToolCallGrammar tool_calls;

  // Any JSON object (OpenAI's json_object).
  static const JsonGrammar& any_object();
};

}  // namespace tandem
