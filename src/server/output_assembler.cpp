#include "server/output_assembler.h"

#include "tokenizer/tool_syntax.h"

namespace tandem::server {

namespace {
// The chat parser needs Gemma's markers (<|channel>, <|tool_call>, ...) as text, so chat output is
// decoded with special tokens kept; completions follow `skip_special_tokens`.
DecodeOptions decode_options(OutputMode mode, bool skip_special_tokens) {
  return DecodeOptions{.skip_special_tokens = mode == OutputMode::Text && skip_special_tokens};
}
}  // namespace

OutputAssembler::OutputAssembler(const Tokenizer& tokenizer, OutputMode mode, std::vector<std::string> stop_strings,
                                 bool skip_special_tokens, bool starts_in_reasoning, bool parse_tool_calls,
                                 int min_tokens)
    : tokenizer_(tokenizer),
      mode_(mode),
      skip_special_tokens_(skip_special_tokens),
      parse_tool_calls_(parse_tool_calls),
      min_tokens_(min_tokens),
      decoder_(tokenizer, decode_options(mode, skip_special_tokens)),
      stops_(std::move(stop_strings)),
      parser_(OutputParserOptions{.starts_in_reasoning = starts_in_reasoning, .parse_tool_calls = parse_tool_calls}) {}

// Chat keeps the special tokens the parser acts on; when the client skips special tokens, the others
// (<bos>, <pad>, <|think|>, ...) must not reach the content as text. Where tool calls are parsed,
// that includes their string delimiter <|"|>: without it a string argument holding a comma, a
// bracket or a colon would no longer parse.
bool OutputAssembler::skipped(int32_t token) const {
  if (mode_ != OutputMode::Chat || !skip_special_tokens_ || !tokenizer_.is_special(token)) return false;
  const std::string_view text = tokenizer_.id_to_token(token);
  return !is_output_marker(text, parse_tool_calls_) && !(parse_tool_calls_ && text == kGemmaQuote);
}

ParsedOutput OutputAssembler::route(const std::string& text) {
  if (text.empty()) return {};
  if (mode_ == OutputMode::Chat) return parser_.push(text);
  ParsedOutput out;
  out.content = text;
  return out;
}

ParsedOutput OutputAssembler::push(int32_t token) {
  ++pushed_;
  if (finished_ || stops_.stopped() || skipped(token)) return {};
  scratch_.clear();
  decoder_.push(token, scratch_);
  // Before min_tokens no stop string can end the output (the text goes past the matcher).
  ParsedOutput out = route(pushed_ < min_tokens_ ? scratch_ : stops_.push(scratch_));
  if (stops_.stopped()) out.append(finish());
  return out;
}

ParsedOutput OutputAssembler::finish() {
  if (finished_) return {};
  finished_ = true;
  ParsedOutput out;
  if (!stops_.stopped()) {
    std::string tail = stops_.push(decoder_.flush());
    tail += stops_.flush();
    out = route(tail);
  }
  if (mode_ == OutputMode::Chat) out.append(parser_.finish());
  return out;
}

}  // namespace tandem::server
