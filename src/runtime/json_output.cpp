#include "runtime/json_output.h"

#include <algorithm>
#include <array>
#include <cmath>

namespace tandem {

namespace {
constexpr int kMaxDepth = 64;
constexpr int kMaxSpaces = 32;
// Digits of a number's integer part and exponent: past these a double overflows, which strict parsers
// (nlohmann's, .NET's) refuse.
constexpr int kMaxIntegerDigits = 20, kMaxExponentDigits = 2;
constexpr const char* kLiterals[3] = {"true", "false", "null"};

// The bytes a UTF-8 lead byte needs after it, and the range its first continuation byte must be in
// (RFC 3629: no overlong forms, no surrogates, nothing past U+10FFFF); 0 needed for a byte that
// cannot lead.
struct Utf8Lead {
  int continuation = 0;
  unsigned char first_min = 0x80, first_max = 0xBF;
};
Utf8Lead utf8_lead(unsigned char c) {
  if (c >= 0xC2 && c <= 0xDF) return {1};
  if (c == 0xE0) return {2, 0xA0, 0xBF};
  if (c == 0xED) return {2, 0x80, 0x9F};
  if (c >= 0xE1 && c <= 0xEF) return {2};
  if (c == 0xF0) return {3, 0x90, 0xBF};
  if (c == 0xF4) return {3, 0x80, 0x8F};
  if (c >= 0xF1 && c <= 0xF3) return {3};
  return {0};
}

bool is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
bool is_hex(unsigned char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
}  // namespace

bool JsonPrefix::push(bool object) {
  if (depth_ == kMaxDepth) return false;
  if (object) objects_ |= uint64_t(1) << depth_;
  else objects_ &= ~(uint64_t(1) << depth_);
  ++depth_;
  mode_ = object ? Mode::ObjectFirst : Mode::ArrayFirst;
  return true;
}

void JsonPrefix::close() {
  --depth_;
  mode_ = depth_ == 0 ? Mode::Done : Mode::AfterValue;
}

void JsonPrefix::value_ended() { mode_ = Mode::AfterValue; }

bool JsonPrefix::begin_value(unsigned char c) {
  switch (c) {
    case '{': return push(true);
    case '[': return push(false);
    case '"':
      mode_ = Mode::String;
      key_ = false;
      return true;
    case '-':
      mode_ = Mode::Number;
      step_ = Minus;
      return true;
    case 't':
    case 'f':
    case 'n':
      mode_ = Mode::Literal;
      literal_ = c == 't' ? 0 : c == 'f' ? 1 : 2;
      step_ = 1;
      return true;
    default:
      if (!is_digit(c)) return false;
      mode_ = Mode::Number;
      step_ = c == '0' ? Zero : Integer;
      digits_ = 1;
      return true;
  }
}

// A number ends at the first byte that cannot go on it, which then counts after the number.
bool JsonPrefix::number(unsigned char c) {
  const bool exponent_mark = c == 'e' || c == 'E';
  switch (Number(step_)) {
    case Minus:
      if (!is_digit(c)) return false;
      step_ = c == '0' ? Zero : Integer;
      digits_ = 1;
      return true;
    case Zero:
    case Integer:
      if (step_ == Integer && is_digit(c)) return ++digits_ <= kMaxIntegerDigits;
      if (c == '.') return step_ = Dot, true;
      if (exponent_mark) return step_ = Exponent, true;
      break;
    case Dot:
      if (!is_digit(c)) return false;
      step_ = Fraction;
      return true;
    case Fraction:
      if (is_digit(c)) return true;
      if (exponent_mark) return step_ = Exponent, true;
      break;
    case Exponent:
      if (c == '+' || c == '-') return step_ = ExponentSign, true;
      [[fallthrough]];
    case ExponentSign:
      if (!is_digit(c)) return false;
      step_ = ExponentDigits;
      digits_ = 1;
      return true;
    case ExponentDigits:
      if (is_digit(c)) return ++digits_ <= kMaxExponentDigits;
      break;
  }
  value_ended();
  return feed(c);
}

bool JsonPrefix::feed(unsigned char c) {
  const bool in_token = mode_ == Mode::String || mode_ == Mode::Escape || mode_ == Mode::Unicode ||
                        mode_ == Mode::Number || mode_ == Mode::Literal;
  if (!in_token && is_space(c)) return mode_ != Mode::Start && mode_ != Mode::Done && ++spaces_ <= kMaxSpaces;
  spaces_ = 0;
  const bool in_object = depth_ > 0 && (objects_ >> (depth_ - 1) & 1);
  switch (mode_) {
    case Mode::Start: return c == '{' && push(true);
    case Mode::ArrayFirst:
      if (c == ']') return close(), true;
      return begin_value(c);
    case Mode::Value: return begin_value(c);
    case Mode::ObjectFirst:
    case Mode::ObjectKey:
      if (c == '}' && mode_ == Mode::ObjectFirst) return close(), true;
      if (c != '"') return false;
      mode_ = Mode::String;
      key_ = true;
      return true;
    case Mode::Colon:
      if (c != ':') return false;
      mode_ = Mode::Value;
      return true;
    case Mode::AfterValue:
      if (c == ',') return mode_ = in_object ? Mode::ObjectKey : Mode::Value, true;
      if (c == (in_object ? '}' : ']')) return close(), true;
      return false;
    case Mode::String:
      if (need_low_ && c != '\\') return false;
      if (utf8_left_ > 0) {
        if (c < utf8_min_ || c > utf8_max_) return false;
        utf8_min_ = 0x80, utf8_max_ = 0xBF;
        --utf8_left_;
        return true;
      }
      if (c == '"') {
        if (key_) mode_ = Mode::Colon;
        else value_ended();
        return true;
      }
      if (c == '\\') return mode_ = Mode::Escape, true;
      if (c < 0x20) return false;
      if (c < 0x80) return true;
      if (const Utf8Lead lead = utf8_lead(c); lead.continuation > 0) {
        utf8_left_ = uint8_t(lead.continuation);
        utf8_min_ = lead.first_min, utf8_max_ = lead.first_max;
        return true;
      }
      return false;
    case Mode::Escape:
      if (c == 'u') return mode_ = Mode::Unicode, step_ = 0, unit_ = 0, true;
      if (need_low_) return false;
      if (c != '"' && c != '\\' && c != '/' && c != 'b' && c != 'f' && c != 'n' && c != 'r' && c != 't') return false;
      mode_ = Mode::String;
      return true;
    case Mode::Unicode: {
      if (!is_hex(c)) return false;
      if (++step_ <= 2) unit_ = uint8_t(unit_ * 16 + (is_digit(c) ? c - '0' : (c | 0x20) - 'a' + 10));
      if (step_ == 1 && need_low_ && unit_ != 0xD) return false;
      if (step_ == 2) {  // D800-DBFF: a high surrogate; DC00-DFFF: a low one, only right after a high one
        const bool low = unit_ >= 0xDC && unit_ <= 0xDF;
        if (low != need_low_) return false;
        high_ = unit_ >= 0xD8 && unit_ <= 0xDB;
      }
      if (step_ == 4) {
        mode_ = Mode::String;
        need_low_ = high_;
      }
      return true;
    }
    case Mode::Number: return number(c);
    case Mode::Literal: {
      const char* word = kLiterals[literal_];
      if (c != static_cast<unsigned char>(word[step_])) return false;
      if (word[++step_] == '\0') value_ended();
      return true;
    }
    case Mode::Done: return false;
  }
  return false;
}

TokenBytes::TokenBytes(std::vector<std::string> token_bytes) : bytes(std::move(token_bytes)) {
  string_content.resize(bytes.size());
  for (size_t id = 0; id < bytes.size(); ++id) {
    const std::string& b = bytes[id];
    bool plain = !b.empty();
    int continuation = 0;  // bytes the current character still needs
    unsigned char next_min = 0x80, next_max = 0xBF;
    for (size_t i = 0; i < b.size() && plain; ++i) {
      const auto c = static_cast<unsigned char>(b[i]);
      if (continuation > 0) {
        plain = c >= next_min && c <= next_max;
        next_min = 0x80, next_max = 0xBF;
        --continuation;
      } else if (c < 0x80) {
        plain = c >= 0x20 && c != '"' && c != '\\';
      } else {
        const Utf8Lead lead = utf8_lead(c);
        plain = lead.continuation > 0;
        continuation = lead.continuation;
        next_min = lead.first_min, next_max = lead.first_max;
      }
    }
    string_content[id] = plain && continuation == 0;
  }
}

JsonOutputConstraint::JsonOutputConstraint(std::shared_ptr<const TokenBytes> vocabulary, std::vector<int32_t> end_tokens)
    : vocabulary_(std::move(vocabulary)), end_tokens_(std::move(end_tokens)) {}

bool JsonOutputConstraint::is_end(int32_t token) const {
  return std::find(end_tokens_.begin(), end_tokens_.end(), token) != end_tokens_.end();
}

void JsonOutputConstraint::mask(std::span<float> logits) const {
  // The bytes that can come next, one feed each: most tokens are settled by their first byte.
  std::array<bool, 256> first{};
  for (int c = 0; c < 256; ++c) {
    JsonPrefix next = state_;
    first[size_t(c)] = next.feed(static_cast<unsigned char>(c));
  }
  const std::vector<std::string>& bytes = vocabulary_->bytes;
  const bool string_content = state_.takes_string_content();
  bool any = false;
  for (size_t id = 0; id < logits.size(); ++id) {
    if (logits[id] == -INFINITY) continue;
    bool allowed = false;
    if (string_content && id < bytes.size() && vocabulary_->string_content[id]) {
      allowed = true;
    } else if (id < bytes.size() && !bytes[id].empty()) {
      const std::string& b = bytes[id];
      if (first[static_cast<unsigned char>(b[0])]) {
        JsonPrefix next = state_;
        allowed = std::all_of(b.begin(), b.end(), [&](char c) { return next.feed(static_cast<unsigned char>(c)); });
      }
    } else {
      allowed = state_.complete() && is_end(int32_t(id));
    }
    if (allowed) any = true;
    else logits[id] = -INFINITY;
  }
  // Nothing can follow (a closed object and no stop token, with ignore_eos): whitespace then ran out.
  if (!any)
    for (int32_t id : end_tokens_)
      if (size_t(id) < logits.size()) logits[size_t(id)] = 0.0f;
}

void JsonOutputConstraint::accept(int32_t token) {
  if (token < 0 || size_t(token) >= vocabulary_->bytes.size()) return;
  for (char c : vocabulary_->bytes[size_t(token)]) state_.feed(static_cast<unsigned char>(c));
}

}  // namespace tandem
