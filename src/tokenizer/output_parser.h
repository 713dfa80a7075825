#pragma once
// Gemma 4's model output -> what the OpenAI API returns: reasoning (the thought channel), content,
// and tool calls. The grammar is in docs/chat-format.md ("Parsing model output"):
//   <|channel>thought\n REASONING <channel|>     -> reasoning_content
//   <|tool_call>call:NAME{ARGS}<tool_call|>      -> tool_calls (ARGS in Gemma's value syntax)
//   <turn|>, <|turn>, <|tool_response>, <eos>    -> end of the answer (the rest is dropped)
//   anything else                                -> content
// The text is the detokenized output with special tokens kept as their text.
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tool_syntax.h"

namespace tandem {

struct ParsedOutput {
  std::string reasoning;
  std::string content;
  std::vector<ToolCall> tool_calls;

  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
  void append(ParsedOutput&& more);
  bool operator==(const ParsedOutput&) const = default;
};

struct OutputParserOptions {
  // True when the prompt already opened the thought channel (it ends with "<|channel>thought\n", as
  // the template's generation prompt does after a tool response with thinking on).
  bool starts_in_reasoning = false;
  // False when the request offered no tools (or tool_choice "none"): <|tool_call> and <tool_call|>
  // are then content like any text, as a client that asked for no tools expects no tool_calls.
  bool parse_tool_calls = true;
};

// True when `text` is one of the markers the parser acts on (the tool-call pair only when
// `tool_calls`): what chat output keeps of the special tokens when the client asks to skip them.
bool is_output_marker(std::string_view text, bool tool_calls);

// True when `prompt` ends inside an open thought channel.
bool prompt_opens_reasoning(std::string_view prompt);

// Streaming: push text as it is decoded; each Delta holds what became certain. Text that may be the
// start of a marker (a trailing "<|chan"), an unfinished UTF-8 sequence, and a tool call until its
// <tool_call|> are held back. Never throws on model output: a tool call that does not parse is
// returned as content, markers included, so nothing the model wrote is lost.
class OutputParser {
 public:
  using Delta = ParsedOutput;

  explicit OutputParser(OutputParserOptions options = {});
  Delta push(std::string_view text);
  // The end of the output: releases held-back text (an unclosed tool call becomes content).
  Delta finish();

 private:
  enum class State { kContent, kChannelHeader, kReasoning, kToolCall, kEnded };
  void drain(bool at_end, Delta& delta);
  void emit_text(std::string_view text, Delta& delta) const;

  State state_;
  bool parse_tool_calls_;
  std::string pending_;           // received, not yet emitted
  size_t tool_call_scanned_ = 0;  // bytes of pending_ known to hold no <tool_call|>
};

// One-shot: the same result as pushing all of `text` and finishing.
ParsedOutput parse_output(std::string_view text, OutputParserOptions options = {});

}  // namespace tandem
