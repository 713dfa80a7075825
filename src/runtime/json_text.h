#pragma once
// Byte classes and limits the JSON recognizer's files share (json_prefix.cpp, json_scalars.cpp,
// json_output.cpp); internal to runtime/.
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/json_grammar.h"

namespace tandem::json_text {

constexpr int kMaxDepth = 64;
constexpr int kMaxSpaces = 32;
constexpr uint32_t kMaxBareKey = 64;  // characters of an undeclared key in Gemma's syntax
// Digits of a number's integer part and exponent: past these a double overflows, which strict parsers
// (nlohmann's, .NET's) refuse.
constexpr int kMaxIntegerDigits = 20, kMaxExponentDigits = 2;
// Past any double: strict parsers (nlohmann's, .NET's) refuse these. Bounded integers stay within int64.
constexpr int kMaxBoundedDigits = 19;
constexpr size_t kMaxWays = 32;       // stacks followed at once (ways anyOf and enum leave open)
constexpr int kMaxForkLevels = 16;    // anyOf within anyOf (server/json_schema resolves them to one level)
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

// How much of a Gemma marker (kGemmaMarkers) free text ends with: a node of the markers' trie (0:
// none), or kSpelled when the byte completes one. Every marker starts with '<' and holds no other.
inline constexpr uint8_t kSpelled = 0xFF;
inline uint8_t next_marker_state(uint8_t state, unsigned char c) {
  struct Trie {
    std::vector<std::vector<std::pair<unsigned char, uint8_t>>> children{1};  // per node: (byte, child)
    std::vector<bool> terminal{false};
    uint8_t child(uint8_t node, unsigned char c) const {
      for (const auto& [byte, to] : children[node])
        if (byte == c) return to;
      return 0;
    }
  };
  static const Trie trie = [] {
    Trie t;
    for (std::string_view marker : kGemmaMarkers) {
      uint8_t node = 0;
      for (unsigned char c : marker) {
        uint8_t to = t.child(node, c);
        if (to == 0) {
          to = uint8_t(t.children.size());
          t.children.emplace_back();
          t.terminal.push_back(false);
          t.children[node].emplace_back(c, to);
        }
        node = to;
      }
      t.terminal[node] = true;
    }
    return t;
  }();
  uint8_t to = trie.child(state, c);
  if (to == 0 && state != 0) to = trie.child(0, c);  // (only '<' starts a marker)
  return to != 0 && trie.terminal[to] ? kSpelled : to;
}

}  // namespace tandem::json_text
