#pragma once
// Gemma's tokenizer: a Hugging Face tokenizer.json (BPE with byte fallback) giving the same ids
// as Hugging Face. Loaded once, immutable, cheap to copy (copies share the data) and safe to use
// from any number of threads at once. Design notes: docs/tokenizer.md.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

namespace tok {
struct TokenizerData;
}

struct DecodeOptions {
  // Hugging Face's default (false) writes special tokens out as their text, e.g. "<bos>".
  bool skip_special_tokens = false;
};

class Tokenizer {
 public:
  // Throws Error naming the file and what is wrong: missing, not JSON, no model or vocabulary,
  // a model or pipeline kind this tokenizer does not implement.
  static Tokenizer from_file(const std::string& path);
  // The same from tokenizer.json text in memory; `origin` names it in error messages.
  static Tokenizer from_json(std::string_view json, const std::string& origin = "tokenizer.json");

  // add_bos adds the post-processor's special tokens (Gemma: <bos> in front), as Hugging Face's
  // add_special_tokens=true does. Bytes that are not valid UTF-8 are read as U+FFFD.
  std::vector<int32_t> encode(std::string_view text, bool add_bos) const;
  // Byte tokens (<0xNN>) are joined into UTF-8, invalid sequences becoming U+FFFD; "▁" becomes a
  // space. Throws Error naming the first id that is out of range.
  std::string decode(std::span<const int32_t> ids, DecodeOptions options = {}) const;

  int32_t vocab_size() const;  // one past the largest id, added tokens included
  std::optional<int32_t> token_to_id(std::string_view token) const;
  // The token's text as in tokenizer.json ("▁Hello", "<0x0A>"); throws Error when out of range.
  std::string_view id_to_token(int32_t id) const;
  int32_t bos_id() const;
  bool is_special(int32_t id) const;  // an added token marked special (false when out of range)

 private:
  friend class IncrementalDecoder;
  explicit Tokenizer(std::shared_ptr<const tok::TokenizerData> data) : data_(std::move(data)) {}
  std::shared_ptr<const tok::TokenizerData> data_;
};

// Streaming decode for generated tokens: push() returns only finished text, so a character split
// over several byte tokens comes out once, whole, when its last byte arrives. The concatenation of
// every push() and the final flush() equals Tokenizer::decode of all the ids.
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(Tokenizer tokenizer, DecodeOptions options = {});

  std::string push(int32_t id);            // throws Error for an id out of range
  void push(int32_t id, std::string& out);  // the same, appending to `out`
  // Whatever is held back (an incomplete character becomes U+FFFD); the decoder starts afresh.
  std::string flush();

 private:
  Tokenizer tokenizer_;
  DecodeOptions options_;
  std::string pending_;  // bytes of an unfinished UTF-8 character (at most 3)
};

}  // namespace tandem
