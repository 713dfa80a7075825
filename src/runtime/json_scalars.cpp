// The scalars of JSON a byte at a time: numbers (with the bounds of a schema) and strings (JSON's,
// with escapes, or Gemma's tool syntax, without).
#include <algorithm>
#include <cctype>
#include <limits>

#include "runtime/json_prefix.h"
#include "runtime/json_text.h"

namespace tandem {

using namespace json_text;

__int128 JsonPrefix::number_value(const Frame& f) const {
  __int128 fraction = f.fraction;
  for (int d = f.fraction_digits; d < JsonSchemaNode::kBoundDecimals; ++d) fraction *= 10;
  const __int128 magnitude = __int128(f.magnitude) * kBoundScale + fraction;
  return f.negative ? -magnitude : magnitude;
}

// Whether some number within the node's bounds begins with the bytes so far (any does without bounds).
bool JsonPrefix::number_reachable(const Frame& f) const {
  const JsonSchemaNode& node = grammar_->nodes[size_t(f.node)];
  if (!node.bounded) return true;
  const bool fractions = node.types & JsonSchemaNode::kNumber;
  const __int128 lo = node.minimum, hi = node.maximum;
  // Whether [a, b] (the magnitudes the prefix reaches) meets the bounds. Integer nodes: a, b, lo and
  // hi are all whole, so the overlap holds a whole number.
  const auto meets = [&](__int128 a, __int128 b) {
    if (f.negative) std::swap(a, b), a = -a, b = -b;
    return a <= hi && b >= lo;
  };
  const __int128 magnitude = __int128(f.magnitude) * kBoundScale;
  switch (f.step) {
    case Minus: return lo <= std::min<__int128>(hi, 0);  // "-0" or any negative within 19 digits
    case Zero: return meets(0, fractions ? kBoundScale - 1 : 0);
    case Dot: return meets(magnitude, magnitude + kBoundScale - 1);
    case Fraction: {
      __int128 span = 1;
      for (int d = f.fraction_digits; d < JsonSchemaNode::kBoundDecimals; ++d) span *= 10;
      const __int128 value = f.negative ? -number_value(f) : number_value(f);
      return meets(value, value + span - 1);
    }
    default: {  // Integer: k more integer digits, then maybe a fraction
      __int128 low = f.magnitude, count = 1;  // with k more digits: [low, low + count - 1]
      for (int digits = f.digits; digits <= kMaxBoundedDigits; ++digits, low *= 10, count *= 10)
        if (meets(low * kBoundScale, (low + count - 1) * kBoundScale + (fractions ? kBoundScale - 1 : 0))) return true;
      return false;
    }
  }
}

bool JsonPrefix::number_complete(const Frame& f) const {
  if (f.step != Zero && f.step != Integer && f.step != Fraction && f.step != ExponentDigits) return false;
  const JsonSchemaNode& node = grammar_->nodes[size_t(f.node)];
  if (!node.bounded) return true;
  const __int128 value = number_value(f);
  return value >= node.minimum && value <= node.maximum;
}

// A number ends at the first byte that cannot go on it (`ended`), which then counts after the number.
bool JsonPrefix::number(Frame& f, unsigned char c, bool& ended) const {
  const JsonSchemaNode& node = grammar_->nodes[size_t(f.node)];
  const bool bounded = node.bounded, fractions = node.types & JsonSchemaNode::kNumber;
  const bool exponent_mark = c == 'e' || c == 'E';
  switch (f.step) {
    case Minus:
      if (!is_digit(c)) return false;
      f.step = c == '0' ? Zero : Integer;
      f.digits = 1;
      f.magnitude = uint64_t(c - '0');
      return number_reachable(f);
    case Zero:
    case Integer:
      if (f.step == Integer && is_digit(c)) {
        if (++f.digits > (bounded ? kMaxBoundedDigits : kMaxIntegerDigits)) return false;
        f.magnitude = f.magnitude * 10 + uint64_t(c - '0');  // (wraps unbounded, where it is not read)
        return number_reachable(f);
      }
      if (fractions && c == '.') return f.step = Dot, number_reachable(f);
      if (fractions && !bounded && exponent_mark) return f.step = Exponent, true;
      break;
    case Dot:
      if (!is_digit(c)) return false;
      f.step = Fraction;
      [[fallthrough]];
    case Fraction:
      if (is_digit(c)) {
        if (!bounded) return true;
        if (f.fraction_digits == JsonSchemaNode::kBoundDecimals) return false;
        f.fraction = f.fraction * 10 + uint64_t(c - '0');
        ++f.fraction_digits;
        return number_reachable(f);
      }
      if (!bounded && exponent_mark) return f.step = Exponent, true;
      break;
    case Exponent:
      if (c == '+' || c == '-') return f.step = ExponentSign, true;
      [[fallthrough]];
    case ExponentSign:
      if (!is_digit(c)) return false;
      f.step = ExponentDigits;
      f.digits = 1;
      return true;
    case ExponentDigits:
      if (is_digit(c)) return ++f.digits <= kMaxExponentDigits;
      break;
  }
  if (!number_complete(f)) return false;
  ended = true;
  return true;
}

// A character of a string begins with c: ASCII, or a UTF-8 lead byte whose continuation bytes the
// frame then expects.
bool JsonPrefix::begin_character(Frame& f, unsigned char c) {
  if (c < 0x80) return true;
  const Utf8Lead lead = utf8_lead(c);
  if (lead.continuation == 0) return false;
  f.utf8_left = uint8_t(lead.continuation);
  f.utf8_min = lead.first_min, f.utf8_max = lead.first_max;
  return true;
}

// A string's next byte; `ended` at its closing quote. Keys of undeclared properties have no length
// bounds.
bool JsonPrefix::string(Frame& f, unsigned char c, bool& ended) const {
  const JsonSchemaNode& node = grammar_->nodes[size_t(f.node)];
  const uint32_t min_length = f.key ? 0 : node.min_length;
  const uint32_t max_length = f.key ? std::numeric_limits<uint32_t>::max() : node.max_length;
  if (grammar_->tool_calls_only && f.utf8_left == 0) {
    // Gemma's syntax: no escapes; a value runs to its <|"|>, a bare key to its ':'. An undeclared key
    // is a name (letters, digits, _ - . or any non-ASCII, up to 64 characters), as the template writes
    // keys, and no text spells a marker.
    if (f.key && c == ':') return ended = true, f.count > 0;
    if (f.key && c < 0x80 && !std::isalnum(c) && c != '_' && c != '-' && c != '.') return false;
    if (!f.key && c == kGemmaQuoteByte) return ended = true, f.count >= min_length;
    if (++f.count > (f.key ? kMaxBareKey : max_length)) return false;
    f.marker = next_marker_state(f.marker, c);
    if (f.marker == kSpelled) return false;
    return begin_character(f, c);
  }
  switch (f.mode) {
    case Mode::String: {
      if (f.need_low && c != '\\') return false;
      if (f.utf8_left > 0) {
        if (c < f.utf8_min || c > f.utf8_max) return false;
        f.utf8_min = 0x80, f.utf8_max = 0xBF;
        --f.utf8_left;
        return true;
      }
      if (c == '"') {
        ended = true;
        return f.count >= min_length;
      }
      // A character begins (but not at the low half of an escaped surrogate pair).
      if (!f.need_low && ++f.count > max_length) return false;
      if (c == '\\') return f.mode = Mode::Escape, true;
      if (c < 0x20) return false;
      return begin_character(f, c);
    }
    case Mode::Escape:
      if (c == 'u') return f.mode = Mode::Unicode, f.step = 0, f.unit = 0, true;
      if (f.need_low) return false;
      if (c != '"' && c != '\\' && c != '/' && c != 'b' && c != 'f' && c != 'n' && c != 'r' && c != 't') return false;
      f.mode = Mode::String;
      return true;
    case Mode::Unicode: {
      if (!is_hex(c)) return false;
      if (++f.step <= 2) f.unit = uint8_t(f.unit * 16 + (is_digit(c) ? c - '0' : (c | 0x20) - 'a' + 10));
      if (f.step == 1 && f.need_low && f.unit != 0xD) return false;
      if (f.step == 2) {  // D800-DBFF: a high surrogate; DC00-DFFF: a low one, only right after a high one
        const bool low = f.unit >= 0xDC && f.unit <= 0xDF;
        if (low != f.need_low) return false;
        f.high = f.unit >= 0xD8 && f.unit <= 0xDB;
      }
      if (f.step == 4) {
        f.mode = Mode::String;
        f.need_low = f.high;
      }
      return true;
    }
    default: return false;
  }
}

}  // namespace tandem
