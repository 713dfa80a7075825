#pragma once
// The recognizer behind output held to JSON (json_output.h): a grammar's values read a byte at a time.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/json_grammar.h"

namespace tandem {

// Reads JSON held to a grammar a byte at a time, and says whether the bytes so far begin a value it
// allows (by default any JSON object). RFC 8259 throughout: strings with escapes and UTF-8, numbers,
// the three literals, nesting up to 64 levels. \u escapes of UTF-16 surrogates must pair up, strings
// hold well-formed UTF-8 (RFC 3629) and numbers stay within a double (20 integer digits, 2 exponent
// digits), as strict parsers require. The value starts at the first byte and nothing follows it, and
// whitespace runs are held to 32 bytes (a newline and 31 of indentation), so a model cannot stall in
// them forever. Where the grammar leaves a choice open (anyOf, enum), each way still open is followed.
class JsonPrefix {
 public:
  JsonPrefix();  // any JSON object
  explicit JsonPrefix(const JsonGrammar& grammar);  // which must outlive it
  bool feed(unsigned char c);  // false: no value begins with the bytes so far and c (the state is then spent)
  bool complete() const;
  // Inside a string, between characters: how many more characters it takes (any TokenBytes::
  // string_content token that short can come next, or text_content one in Gemma's syntax); -1
  // elsewhere.
  int64_t string_content_room() const;
  bool gemma_syntax() const { return grammar_->tool_calls_only; }
  // This state, keeping this one's buffers (no allocation once they are large enough).
  void assign(const JsonPrefix& other);

 private:
  enum class Mode : uint8_t { Value, ObjectFirst, ObjectKey, Key, Colon, Member, AfterMember, ArrayFirst, Item,
                              AfterItem, String, Escape, Unicode, Number, Literal,
                              // Tool calls (ToolCallGrammar): between calls, in a thought, in "call:NAME",
                              // below a call's arguments, and after them.
                              Calls, Thought, CallName, CallArguments, AfterCall };
  struct Frame {
    int32_t node = 0;
    Mode mode = Mode::Value;
    uint8_t spaces = 0;      // whitespace bytes in a row
    uint8_t step = 0;        // Number: its state; Unicode: hex digits read
    uint8_t digits = 0;      // Number: digits of its integer part or its exponent so far
    uint8_t utf8_left = 0;   // String: continuation bytes the current character still needs
    uint8_t utf8_min = 0x80, utf8_max = 0xBF;  // String: the range of the next continuation byte
    uint8_t unit = 0;        // Unicode: the escape's first two hex digits
    bool key = false;        // String: an undeclared key of an object
    bool high = false;       // Unicode: the escape is a high surrogate
    bool need_low = false;   // String: a high surrogate's escape came last, so its low one must follow
    bool negative = false;   // Number
    bool thought_passed = false;  // Calls: a thought came (or cannot come any more)
    uint8_t marker = 0;      // String, Thought in Gemma's syntax: how much of a marker the text ends with
    // Object: the property whose value comes next (-1: undeclared); Key, CallName: the first
    // candidate; Literal: the text (kTrue, kFalse, kNull or a node literal); Calls: the function.
    int32_t which = 0;
    // Object: declared properties passed; Array: items; String: characters; Key, Literal, CallName:
    // bytes matched; Calls: calls made.
    uint32_t count = 0;
    uint64_t candidates = 0;  // Key, CallName: bit b, property (function) which + b still matches
    uint32_t literals_end = 0;  // Literal: the node's literals [which, literals_end) still match
    uint64_t magnitude = 0;   // Number with bounds: its integer part so far
    uint64_t fraction = 0;    // Number with bounds: its fraction digits so far, as an integer
    uint8_t fraction_digits = 0;
    bool operator==(const Frame&) const = default;
  };

  void advance(size_t begin, unsigned char c, int level);
  void fork(size_t begin, unsigned char c, int level);
  bool fits(int32_t node, size_t depth) const;  // a value of `node` below `depth` containers
  bool begin_value(Frame& f, unsigned char c, size_t depth) const;
  void end_value(size_t begin);  // the top frame's value ended
  void key_ended(int32_t property);
  bool number(Frame& f, unsigned char c, bool& ended) const;
  bool string(Frame& f, unsigned char c, bool& ended) const;
  static bool begin_character(Frame& f, unsigned char c);
  void drop_repeated_ways();
  bool number_complete(const Frame& f) const;
  bool number_reachable(const Frame& f) const;
  __int128 number_value(const Frame& f) const;  // in the units of the node's bounds

  const JsonGrammar* grammar_;
  // The ways still open, one stack of frames each (innermost last), one after another in frames_.
  std::vector<Frame> frames_;
  std::vector<size_t> ends_;
  // Scratch of feed(): the next stacks, and a stack being forked per level.
  std::vector<Frame> next_frames_;
  std::vector<size_t> next_ends_;
  std::vector<std::vector<Frame>> forked_;
};

}  // namespace tandem
