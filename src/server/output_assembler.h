#pragma once
// Generated tokens -> the text a client sees, one token at a time: the incremental detokenizer
// (never splits a UTF-8 character), then stop strings (held back while undecided, cut when found),
// then, for chat, the output parser that separates reasoning, content and tool calls.
#include <string>
#include <vector>

#include "tokenizer/output_parser.h"
#include "tokenizer/tokenizer.h"
#include "server/stop_strings.h"

namespace tandem::server {

enum class OutputMode {
  Text,  // completions: everything is content
  Chat,  // chat: Gemma's markers split reasoning, content and tool calls
};

class OutputAssembler {
 public:
  // parse_tool_calls: chat only, false when the request offered no tools (OutputParserOptions).
  // min_tokens: stop strings are looked for from that token on (vLLM's min_tokens).
  OutputAssembler(const Tokenizer& tokenizer, OutputMode mode, std::vector<std::string> stop_strings,
                  bool skip_special_tokens, bool starts_in_reasoning, bool parse_tool_calls = true,
                  int min_tokens = 0);

  // What became certain with this token (often nothing: held back, or an incomplete character).
  ParsedOutput push(int32_t token);
  // The end of the output: whatever was held back.
  ParsedOutput finish();
  // A stop string appeared; the output ends before it and later tokens are ignored.
  bool stopped_by_string() const { return stops_.stopped(); }

 private:
  ParsedOutput route(const std::string& text);

  bool skipped(int32_t token) const;

  Tokenizer tokenizer_;
  OutputMode mode_;
  bool skip_special_tokens_;
  bool parse_tool_calls_;
  int min_tokens_;
  int pushed_ = 0;
  IncrementalDecoder decoder_;
  StopStringMatcher stops_;
  OutputParser parser_;
  std::string scratch_;
  bool finished_ = false;
};

}  // namespace tandem::server
