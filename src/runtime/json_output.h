#pragma once
// Output held to JSON (OpenAI's response_format json_object and json_schema) or to tool calls (a
// forced tool_choice): before each draw,
// every token that would take the output off every value the grammar allows is masked, so the
// sampler (greedy or not) only ever picks a token that keeps it a prefix of one, and the stop tokens
// only once the value is complete. The check is on bytes: each token's bytes run through a JSON
// recognizer from the output's current state.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/json_grammar.h"
#include "runtime/json_prefix.h"

namespace tandem {

// What each token id adds to the output, as bytes (byte-fallback tokens their one byte); empty for
// special tokens, which never appear inside JSON.
struct TokenBytes {
  explicit TokenBytes(std::vector<std::string> token_bytes);
  std::vector<std::string> bytes;
  // 1 where the token is whole UTF-8 characters that a JSON string holds as they are (no quote,
  // backslash or control byte): most of a vocabulary, settled inside a string without reading it.
  std::vector<uint8_t> string_content;
  // 1 where the token is whole UTF-8 characters (any, control bytes included): what a string in
  // Gemma's tool syntax or a thought holds as it is.
  std::vector<uint8_t> text_content;
  std::vector<uint16_t> characters;  // of each text_content token
  // The ids of the tokens with bytes, sorted by them, and how many leading bytes each shares with the
  // one before it: the mask reads a prefix once for every token that starts with it.
  std::vector<int32_t> by_bytes;
  std::vector<uint16_t> shared_with_previous;
};

class JsonOutputConstraint {
 public:
  // end_tokens: the tokens that stop the request, allowed once the value is complete. A null grammar
  // is any JSON object.
  JsonOutputConstraint(std::shared_ptr<const TokenBytes> vocabulary, std::vector<int32_t> end_tokens,
                       std::shared_ptr<const JsonGrammar> grammar = nullptr);
  // Sets to -inf the logits of the tokens that cannot come next.
  void mask(std::span<float> logits) const;
  // The token drawn (one mask() allowed).
  void accept(int32_t token);
  bool complete() const { return state_.complete(); }

 private:
  bool is_end(int32_t token) const;
  std::shared_ptr<const TokenBytes> vocabulary_;
  std::vector<int32_t> end_tokens_;
  std::shared_ptr<const JsonGrammar> grammar_;
  JsonPrefix state_;
  // Scratch of mask(): the states after each leading byte of the token being read, and the verdicts.
  mutable std::vector<JsonPrefix> prefix_states_;
  mutable std::vector<uint8_t> allowed_;
  mutable std::vector<int32_t> open_;
};

}  // namespace tandem
