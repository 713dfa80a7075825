#include "server/served_model.h"

#include <cstdio>

namespace tandem::server {

std::optional<unsigned char> byte_fallback_value(std::string_view piece) {
  unsigned value = 0;
  if (piece.size() == 6 && piece.substr(0, 3) == "<0x" && piece.back() == '>' &&
      std::sscanf(std::string(piece.substr(3, 2)).c_str(), "%2x", &value) == 1)
    return static_cast<unsigned char>(value);
  return std::nullopt;
}

std::shared_ptr<const TokenBytes> output_token_bytes(const Tokenizer& tokenizer) {
  std::vector<std::string> bytes(size_t(tokenizer.vocab_size()));
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    if (tokenizer.is_special(id)) {
      // The control tokens of Gemma's tool-call syntax, as bytes no text has (runtime/json_grammar.h).
      static const std::pair<std::string_view, unsigned char> kControls[] = {
          {"<|\"|>", kGemmaQuoteByte},          {"<|tool_call>", kToolCallOpenByte}, {"<tool_call|>", kToolCallCloseByte},
          {"<|channel>", kChannelOpenByte}, {"<channel|>", kChannelCloseByte}};
      for (const auto& [text, byte] : kControls)
        if (tokenizer.id_to_token(id) == text) bytes[size_t(id)] = std::string(1, char(byte));
      continue;
    }
    if (const auto byte = byte_fallback_value(tokenizer.id_to_token(id))) {
      // Bytes 0xF8-0xFF never occur in UTF-8 text; the control tokens above stand in for some of them,
      // so these byte tokens read as 0xFF, which no output takes.
      bytes[size_t(id)] = std::string(1, char(*byte >= kGemmaQuoteByte ? 0xFF : *byte));
      continue;
    }
    const int32_t one[1] = {id};
    bytes[size_t(id)] = tokenizer.decode(one);
  }
  return std::make_shared<TokenBytes>(std::move(bytes));
}

}  // namespace tandem::server
