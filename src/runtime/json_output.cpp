#include "runtime/json_output.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "runtime/json_text.h"

namespace tandem {

using json_text::Utf8Lead;
using json_text::utf8_lead;

TokenBytes::TokenBytes(std::vector<std::string> token_bytes) : bytes(std::move(token_bytes)) {
  string_content.resize(bytes.size());
  text_content.resize(bytes.size());
  characters.resize(bytes.size());
  for (size_t id = 0; id < bytes.size(); ++id) {
    const std::string& b = bytes[id];
    bool text = !b.empty(), plain = text;  // whole UTF-8 characters; and none that a JSON string escapes
    int continuation = 0;  // bytes the current character still needs
    unsigned char next_min = 0x80, next_max = 0xBF;
    size_t count = 0;
    for (size_t i = 0; i < b.size() && text; ++i) {
      const auto c = static_cast<unsigned char>(b[i]);
      if (continuation > 0) {
        text = c >= next_min && c <= next_max;
        next_min = 0x80, next_max = 0xBF;
        --continuation;
        continue;
      }
      ++count;
      if (c < 0x80) {
        plain = plain && c >= 0x20 && c != '"' && c != '\\';
      } else {
        const Utf8Lead lead = utf8_lead(c);
        text = lead.continuation > 0;
        continuation = lead.continuation;
        next_min = lead.first_min, next_max = lead.first_max;
      }
    }
    text = text && continuation == 0 && count <= std::numeric_limits<uint16_t>::max();
    text_content[id] = text;
    string_content[id] = text && plain;
    characters[id] = text ? uint16_t(count) : 0;
  }
}

JsonOutputConstraint::JsonOutputConstraint(std::shared_ptr<const TokenBytes> vocabulary, std::vector<int32_t> end_tokens,
                                           std::shared_ptr<const JsonGrammar> grammar)
    : vocabulary_(std::move(vocabulary)),
      end_tokens_(std::move(end_tokens)),
      grammar_(std::move(grammar)),
      state_(grammar_ ? JsonPrefix(*grammar_) : JsonPrefix()),
      scratch_(state_) {}

bool JsonOutputConstraint::is_end(int32_t token) const {
  return std::find(end_tokens_.begin(), end_tokens_.end(), token) != end_tokens_.end();
}

void JsonOutputConstraint::mask(std::span<float> logits) const {
  // The bytes that can come next, one feed each: most tokens are settled by their first byte.
  std::array<bool, 256> first{};
  for (int c = 0; c < 256; ++c) {
    scratch_.assign(state_);
    first[size_t(c)] = scratch_.feed(static_cast<unsigned char>(c));
  }
  const std::vector<std::string>& bytes = vocabulary_->bytes;
  const int64_t string_room = state_.string_content_room();
  const std::vector<uint8_t>& content = state_.gemma_syntax() ? vocabulary_->text_content : vocabulary_->string_content;
  const bool complete = state_.complete();
  bool any = false;
  for (size_t id = 0; id < logits.size(); ++id) {
    if (logits[id] == -INFINITY) continue;
    bool allowed = false;
    if (id < bytes.size() && content[id] && vocabulary_->characters[id] <= string_room) {
      allowed = true;
    } else if (id < bytes.size() && !bytes[id].empty()) {
      const std::string& b = bytes[id];
      if (first[static_cast<unsigned char>(b[0])]) {
        if (b.size() == 1) {
          allowed = true;
        } else {
          scratch_.assign(state_);
          allowed = std::all_of(b.begin(), b.end(), [&](char c) { return scratch_.feed(static_cast<unsigned char>(c)); });
        }
      }
    } else {
      allowed = complete && is_end(int32_t(id));
    }
    if (allowed) any = true;
    else logits[id] = -INFINITY;
  }
  // Nothing can follow (a complete value and no stop token, with ignore_eos): whitespace then ran out.
  if (!any)
    for (int32_t id : end_tokens_)
      if (size_t(id) < logits.size()) logits[size_t(id)] = 0.0f;
}

void JsonOutputConstraint::accept(int32_t token) {
  if (token < 0 || size_t(token) >= vocabulary_->bytes.size()) return;
  for (char c : vocabulary_->bytes[size_t(token)]) state_.feed(static_cast<unsigned char>(c));
}

}  // namespace tandem
