#pragma once
// Everything a loaded tokenizer.json becomes. Built once by load_tokenizer_json, then only read
// (shared between threads through Tokenizer's shared_ptr to const).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/text_pipeline.h"
#include "tokenizer/token_table.h"

namespace tandem::tok {

// The decoder stage, precomputed per id: the text each token decodes to (after the decoder's
// Replace steps) and, for <0xNN> tokens when the decoder has ByteFallback, the raw byte.
class DecodedPieces {
 public:
  void add(std::string_view text, int byte_value);  // in id order, holes included
  std::string_view text(int32_t id) const {
    return {arena_.data() + offsets_[id], offsets_[id + 1] - offsets_[id]};
  }
  int byte_value(int32_t id) const { return byte_value_[id]; }  // -1: not a byte token

 private:
  std::string arena_;
  std::vector<uint32_t> offsets_{0};
  std::vector<int16_t> byte_value_;
};

struct TokenizerData {
  std::string origin;  // the file it came from, for error messages

  TokenTable tokens;  // model vocabulary and added tokens
  BpeModel bpe;
  Normalizer normalizer;
  PreTokenizer pre_tokenizer;
  AddedTokenMatcher raw_added;         // added tokens with normalized=false: matched in the input
  AddedTokenMatcher normalized_added;  // normalized=true: matched in normalized text
  std::vector<uint8_t> special;        // by id: added token marked "special"

  DecodedPieces decoded;
  std::vector<int32_t> template_prefix;  // post-processor tokens around the text (add_bos)
  std::vector<int32_t> template_suffix;
  int32_t bos_id = -1;

  // Appends the ids of `text` (valid UTF-8).
  void encode(std::string_view text, std::vector<int32_t>& out) const;

  // The one decoding loop shared by decode() and IncrementalDecoder: `pending` carries the bytes
  // of a UTF-8 sequence not yet complete. Throws Error for ids without a token.
  void decode_step(int32_t id, bool skip_special, std::string& pending, std::string& out) const;
  static void decode_finish(std::string& pending, std::string& out);

 private:
  void encode_normalized(std::string_view normalized, std::vector<int32_t>& out) const;
};

}  // namespace tandem::tok
