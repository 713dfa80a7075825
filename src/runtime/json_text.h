#pragma once
// Byte classes and limits the JSON recognizer's files share (json_prefix.cpp, json_scalars.cpp,
// json_output.cpp); internal to runtime/.
#include <cstddef>
#include <cstdint>
#include <string>

#include "runtime/json_grammar.h"

namespace tandem::json_text {

constexpr int kMaxDepth = 64;
constexpr int kMaxSpaces = 32;
// Digits of a number's integer part and exponent: past these a double overflows, which strict parsers
// (nlohmann's, .NET's) refuse.
constexpr int kMaxIntegerDigits = 20, kMaxExponentDigits = 2;
// Past any double: strict parsers (nlohmann's, .NET's) refuse these. Bounded integers stay within int64.
constexpr int kMaxBoundedDigits = 19;
constexpr size_t kMaxWays = 32;       // stacks followed at once (ways anyOf and enum leave open)
constexpr int kMaxForkLevels = 16;    // anyOf within anyOf
constexpr int32_t kTrue = -1, kFalse = -2, kNull = -3;
inline const std::string kLiteralTexts[3] = {"true", "false", "null"};
constexpr __int128 kBoundScale = 1'000'000'000'000'000;  // 10^JsonSchemaNode::kBoundDecimals
enum NumberStep : uint8_t { Minus, Zero, Integer, Dot, Fraction, Exponent, ExponentSign, ExponentDigits };

// The bytes a UTF-8 lead byte needs after it, and the range its first continuation byte must be in
// (RFC 3629: no overlong forms, no surrogates, nothing past U+10FFFF); 0 needed for a byte that
// cannot lead.
struct Utf8Lead {
  int continuation = 0;
  unsigned char first_min = 0x80, first_max = 0xBF;
};
inline Utf8Lead utf8_lead(unsigned char c) {
  if (c >= 0xC2 && c <= 0xDF) return {1};
  if (c == 0xE0) return {2, 0xA0, 0xBF};
  if (c == 0xED) return {2, 0x80, 0x9F};
  if (c >= 0xE1 && c <= 0xEF) return {2};
  if (c == 0xF0) return {3, 0x90, 0xBF};
  if (c == 0xF4) return {3, 0x80, 0x8F};
  if (c >= 0xF1 && c <= 0xF3) return {3};
  return {0};
}

inline bool is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
inline bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
inline bool is_hex(unsigned char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

// The last required property's index (-1: none): an object closes only past it.
inline int64_t last_required(const JsonSchemaNode& node) {
  for (size_t j = node.properties.size(); j-- > 0;)
    if (node.properties[j].required) return int64_t(j);
  return -1;
}

}  // namespace tandem::json_text
