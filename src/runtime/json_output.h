#pragma once
// Output held to a JSON object (OpenAI's response_format {"type": "json_object"}): before each draw,
// every token that would take the output off every JSON object is masked, so the sampler (greedy or
// not) only ever picks a token that keeps it a prefix of one, and the stop tokens only once the
// object is closed. The check is on bytes: each token's bytes run through a JSON recognizer from
// the output's current state.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace tandem {

// What each token id adds to the output, as bytes (byte-fallback tokens their one byte); empty for
// special tokens, which never appear inside JSON.
struct TokenBytes {
  explicit TokenBytes(std::vector<std::string> token_bytes);
  std::vector<std::string> bytes;
  // 1 where the token is whole UTF-8 characters that a JSON string holds as they are (no quote,
  // backslash or control byte): most of a vocabulary, settled inside a string without reading it.
  std::vector<uint8_t> string_content;
};

// Reads a JSON object a byte at a time (RFC 8259: strings with escapes and UTF-8, numbers, the three
// literals, nesting up to 64 levels), and says whether the bytes so far begin one. \u escapes of
// UTF-16 surrogates must pair up, strings hold well-formed UTF-8 (RFC 3629) and numbers stay within
// a double (20 integer digits, 2 exponent digits), as strict parsers require. The object starts at
// the first byte and nothing follows it, and
// whitespace runs are held to 32 bytes (a newline and 31 of indentation), so a model cannot stall in
// them forever.
class JsonPrefix {
 public:
  bool feed(unsigned char c);  // false: no JSON object begins with the bytes so far and c (the state is then spent)
  bool complete() const { return mode_ == Mode::Done; }
  // Inside a string, between characters: any TokenBytes::string_content token can come next.
  bool takes_string_content() const { return mode_ == Mode::String && utf8_left_ == 0 && !need_low_; }

 private:
  enum class Mode : uint8_t { Start, Value, ArrayFirst, ObjectFirst, ObjectKey, Colon, AfterValue, String, Escape,
                              Unicode, Number, Literal, Done };
  enum Number : uint8_t { Minus, Zero, Integer, Dot, Fraction, Exponent, ExponentSign, ExponentDigits };
  bool begin_value(unsigned char c);
  bool push(bool object);
  void close();        // the innermost container ended
  void value_ended();  // a value inside a container ended
  bool number(unsigned char c);

  uint64_t objects_ = 0;  // bit d: the container at depth d is an object (not an array)
  uint8_t depth_ = 0;
  Mode mode_ = Mode::Start;
  uint8_t step_ = 0;      // Number: its Number state; Literal: characters matched; Unicode: hex digits read
  uint8_t literal_ = 0;   // Literal: 0 true, 1 false, 2 null
  bool key_ = false;      // String: an object's key
  uint8_t unit_ = 0;      // Unicode: the escape's first two hex digits
  bool high_ = false;     // Unicode: the escape is a high surrogate
  bool need_low_ = false; // String: a high surrogate's escape came last, so its low one must follow
  uint8_t utf8_left_ = 0; // String: continuation bytes the current character still needs
  uint8_t utf8_min_ = 0x80, utf8_max_ = 0xBF;  // String: the range of the next continuation byte
  uint8_t spaces_ = 0;    // whitespace bytes in a row
  uint8_t digits_ = 0;    // Number: digits of its integer part or its exponent so far
};

class JsonOutputConstraint {
 public:
  // end_tokens: the tokens that stop the request, allowed once the object is closed.
  JsonOutputConstraint(std::shared_ptr<const TokenBytes> vocabulary, std::vector<int32_t> end_tokens);
  // Sets to -inf the logits of the tokens that cannot come next.
  void mask(std::span<float> logits) const;
  // The token drawn (one mask() allowed).
  void accept(int32_t token);
  bool complete() const { return state_.complete(); }

 private:
  bool is_end(int32_t token) const;
  std::shared_ptr<const TokenBytes> vocabulary_;
  std::vector<int32_t> end_tokens_;
  JsonPrefix state_;
};

}  // namespace tandem
