#pragma once
// Gemma 4's value syntax for tool arguments and results, in both directions:
//   strings <|"|>text<|"|> (no escaping), numbers, true/false/null, {key:value,...}, [value,...]
// Keys are written bare in tool calls and results, and wrapped in <|"|> in declarations.
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace tandem {

inline constexpr std::string_view kGemmaQuote = "<|\"|>";

// The template's format_argument macro: JSON -> Gemma text, object keys in dictsort order.
void append_gemma_value(std::string& out, const nlohmann::json& value, bool quote_keys);
std::string format_gemma_value(const nlohmann::json& value, bool quote_keys);

// Gemma text -> JSON: exactly one value, with optional surrounding whitespace. Accepts both bare
// and <|"|>-quoted keys, and (leniently) a bare word as a string. Throws Error when malformed.
nlohmann::json parse_gemma_value(std::string_view text);

// A call the model made: the function's name and its arguments, always a JSON object.
struct ToolCall {
  std::string name;
  nlohmann::json arguments;
  bool operator==(const ToolCall&) const = default;
};
// The text between <|tool_call> and <tool_call|>: "call:NAME{key:value,...}". Throws Error.
ToolCall parse_gemma_tool_call(std::string_view body);

}  // namespace tandem
