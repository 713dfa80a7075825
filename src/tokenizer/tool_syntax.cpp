#include "tokenizer/tool_syntax.h"

#include <cstring>

#include "core/error.h"
#include "tokenizer/jinja_compat.h"

namespace tandem {

using nlohmann::json;

void append_gemma_value(std::string& out, const json& value, bool quote_keys) {
  switch (value.type()) {
    case json::value_t::null: out += "null"; return;
    case json::value_t::boolean: out += value.get<bool>() ? "true" : "false"; return;
    case json::value_t::string:
      out += kGemmaQuote;
      out += value.get_ref<const std::string&>();
      out += kGemmaQuote;
      return;
    case json::value_t::object: {
      out += '{';
      bool first = true;
      for (const auto& [key, item] : jinja::dictsort(value)) {
        if (!first) out += ',';
        first = false;
        if (quote_keys) out += kGemmaQuote;
        out += *key;
        if (quote_keys) out += kGemmaQuote;
        out += ':';
        append_gemma_value(out, *item, quote_keys);
      }
      out += '}';
      return;
    }
    case json::value_t::array: {
      out += '[';
      bool first = true;
      for (const json& item : value) {
        if (!first) out += ',';
        first = false;
        append_gemma_value(out, item, quote_keys);
      }
      out += ']';
      return;
    }
    default: out += jinja::python_str(value); return;  // numbers, printed as Python prints them
  }
}

std::string format_gemma_value(const json& value, bool quote_keys) {
  std::string out;
  append_gemma_value(out, value, quote_keys);
  return out;
}

namespace {

constexpr int kMaxNesting = 256;  // deeper text is rejected rather than risking the stack

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::string_view trim_ascii(std::string_view text) {
  while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
  return text;
}

// JSON's number grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
bool is_json_number(std::string_view t) {
  size_t i = 0;
  auto digits = [&] {
    const size_t start = i;
    while (i < t.size() && t[i] >= '0' && t[i] <= '9') ++i;
    return i > start;
  };
  if (i < t.size() && t[i] == '-') ++i;
  if (i < t.size() && t[i] == '0')
    ++i;
  else if (!digits())
    return false;
  if (i < t.size() && t[i] == '.') {
    ++i;
    if (!digits()) return false;
  }
  if (i < t.size() && (t[i] == 'e' || t[i] == 'E')) {
    ++i;
    if (i < t.size() && (t[i] == '+' || t[i] == '-')) ++i;
    if (!digits()) return false;
  }
  return i == t.size();
}

class GemmaValueParser {
 public:
  explicit GemmaValueParser(std::string_view text) : text_(text) {}

  json parse_document() {
    json value = parse_value(0);
    skip_space();
    if (pos_ != text_.size()) fail_here("unexpected text after the value");
    return value;
  }

 private:
  [[noreturn]] void fail_here(std::string_view what) const {
    fail("malformed tool syntax: {} at byte {} of '{}'", what, pos_, text_);
  }

  void skip_space() {
    while (pos_ < text_.size() && is_space(text_[pos_])) ++pos_;
  }
  bool at_quote() const { return text_.substr(pos_).starts_with(kGemmaQuote); }
  bool at(char c) const { return pos_ < text_.size() && text_[pos_] == c; }

  json parse_value(int depth) {
    if (depth > kMaxNesting) fail_here("nesting too deep");
    skip_space();
    if (pos_ == text_.size()) fail_here("expected a value");
    if (at_quote()) return parse_string();
    if (at('{')) return parse_object(depth);
    if (at('[')) return parse_array(depth);
    return parse_word();
  }

  // Strings are not escaped: a string runs to the next <|"|>.
  std::string parse_string() {
    pos_ += kGemmaQuote.size();
    const size_t end = text_.find(kGemmaQuote, pos_);
    if (end == std::string_view::npos) fail_here("unterminated <|\"|> string");
    std::string value(text_.substr(pos_, end - pos_));
    pos_ = end + kGemmaQuote.size();
    return value;
  }

  json parse_object(int depth) {
    ++pos_;
    json object = json::object();
    skip_space();
    if (at('}')) {
      ++pos_;
      return object;
    }
    for (;;) {
      std::string key = parse_key();
      skip_space();
      if (!at(':')) fail_here("expected ':' after a key");
      ++pos_;
      object[key] = parse_value(depth + 1);
      skip_space();
      if (at(',')) {
        ++pos_;
        continue;
      }
      if (at('}')) {
        ++pos_;
        return object;
      }
      fail_here("expected ',' or '}' in an object");
    }
  }

  json parse_array(int depth) {
    ++pos_;
    json array = json::array();
    skip_space();
    if (at(']')) {
      ++pos_;
      return array;
    }
    for (;;) {
      array.push_back(parse_value(depth + 1));
      skip_space();
      if (at(',')) {
        ++pos_;
        continue;
      }
      if (at(']')) {
        ++pos_;
        return array;
      }
      fail_here("expected ',' or ']' in a list");
    }
  }

  // Bare keys run to the ':'; quoted ones are strings.
  std::string parse_key() {
    skip_space();
    if (at_quote()) return parse_string();
    const size_t start = pos_;
    while (pos_ < text_.size() && !std::strchr(":,{}[]", text_[pos_]) && !at_quote()) ++pos_;
    const std::string_view key = trim_ascii(text_.substr(start, pos_ - start));
    if (key.empty()) fail_here("expected a key");
    return std::string(key);
  }

  // true, false, null, a JSON number, or else (leniently) an unquoted word taken as a string.
  json parse_word() {
    const size_t start = pos_;
    while (pos_ < text_.size() && !std::strchr(",{}[]", text_[pos_]) && !at_quote()) ++pos_;
    const std::string_view word = trim_ascii(text_.substr(start, pos_ - start));
    if (word.empty()) fail_here("expected a value");
    if (word == "true") return true;
    if (word == "false") return false;
    if (word == "null") return nullptr;
    if (is_json_number(word)) return json::parse(word);
    return std::string(word);
  }

  std::string_view text_;
  size_t pos_ = 0;
};

}  // namespace

json parse_gemma_value(std::string_view text) { return GemmaValueParser(text).parse_document(); }

ToolCall parse_gemma_tool_call(std::string_view body) {
  constexpr std::string_view kPrefix = "call:";
  const std::string_view text = trim_ascii(body);
  if (!text.starts_with(kPrefix)) fail("malformed tool call: '{}' does not start with 'call:'", body);
  const size_t brace = text.find('{');
  if (brace == std::string_view::npos) fail("malformed tool call: no '{{' after the name in '{}'", body);
  const std::string_view name = trim_ascii(text.substr(kPrefix.size(), brace - kPrefix.size()));
  if (name.empty() || name.find_first_of(" \t\r\n,:[]}<>\"") != std::string_view::npos)
    fail("malformed tool call: bad function name '{}'", name);
  ToolCall call{std::string(name), parse_gemma_value(text.substr(brace))};
  if (!call.arguments.is_object()) fail("malformed tool call: the arguments of '{}' are not an object", name);
  return call;
}

}  // namespace tandem
