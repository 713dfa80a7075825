#include "tokenizer/tokenizer_data.h"

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace tandem::tok {

void DecodedPieces::add(std::string_view text, int byte_value) {
  arena_.append(text);
  offsets_.push_back(static_cast<uint32_t>(arena_.size()));
  byte_value_.push_back(static_cast<int16_t>(byte_value));
}

// The order of Hugging Face's pipeline: added tokens are cut out of the raw text first, then each
// remaining span is normalized, cut again at normalized added tokens, pre-tokenized, and each
// piece goes through the BPE model.
void TokenizerData::encode(std::string_view text, std::vector<int32_t>& out) const {
  thread_local std::string normalized;
  raw_added.split(
      text,
      [&](std::string_view plain) {
        if (normalizer.empty()) {
          encode_normalized(plain, out);
        } else {
          std::string& buffer = normalized;  // thread_local: no allocation per span
          normalizer.apply(plain, buffer);
          // encode_normalized never normalizes again, so the buffer is not reused underneath it.
          encode_normalized(buffer, out);
        }
      },
      [&](int32_t id) { out.push_back(id); });
}

void TokenizerData::encode_normalized(std::string_view normalized, std::vector<int32_t>& out) const {
  const auto encode_plain = [&](std::string_view plain) {
    pre_tokenizer.split(plain, [&](std::string_view word) { bpe.encode_word(word, tokens, out); });
  };
  if (normalized_added.empty()) {
    encode_plain(normalized);
  } else {
    normalized_added.split(normalized, encode_plain, [&](int32_t id) { out.push_back(id); });
  }
}

void TokenizerData::decode_step(int32_t id, bool skip_special, std::string& pending, std::string& out) const {
  if (id < 0 || id >= tokens.size())
    fail("token id {} is out of range (the vocabulary has ids 0 to {})", id, tokens.size() - 1);
  if (!tokens.text(id)) fail("token id {} is not assigned to any token in {}", id, origin);
  if (skip_special && special[id]) return;
  const int byte = decoded.byte_value(id);
  if (byte >= 0) {
    pending += static_cast<char>(byte);
    pending.erase(0, utf8::decode_lossy(pending, /*final=*/false, out));
    return;
  }
  decode_finish(pending, out);
  out += decoded.text(id);
}

void TokenizerData::decode_finish(std::string& pending, std::string& out) {
  if (pending.empty()) return;
  utf8::decode_lossy(pending, /*final=*/true, out);
  pending.clear();
}

}  // namespace tandem::tok
