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
    // (A '<' may begin a marker, which Gemma's free text must not spell: such tokens are read.)
    text_content[id] = text && b.find('<') == std::string::npos;
    string_content[id] = text && plain;
    characters[id] = text ? uint16_t(count) : 0;
  }
  for (size_t id = 0; id < bytes.size(); ++id)
    if (!bytes[id].empty()) by_bytes.push_back(int32_t(id));
  std::sort(by_bytes.begin(), by_bytes.end(), [&](int32_t a, int32_t b) { return bytes[size_t(a)] < bytes[size_t(b)]; });
  shared_with_previous.resize(by_bytes.size(), 0);
  for (size_t i = 1; i < by_bytes.size(); ++i) {
    const std::string &a = bytes[size_t(by_bytes[i - 1])], &b = bytes[size_t(by_bytes[i])];
    size_t n = 0;
    while (n < a.size() && n < b.size() && a[n] == b[n] && n < std::numeric_limits<uint16_t>::max()) ++n;
    shared_with_previous[i] = uint16_t(n);
  }
}

JsonOutputConstraint::JsonOutputConstraint(std::shared_ptr<const TokenBytes> vocabulary, std::vector<int32_t> end_tokens,
                                           std::shared_ptr<const JsonGrammar> grammar)
    : vocabulary_(std::move(vocabulary)),
      end_tokens_(std::move(end_tokens)),
      grammar_(std::move(grammar)),
      state_(grammar_ ? JsonPrefix(*grammar_) : JsonPrefix()) {}

bool JsonOutputConstraint::is_end(int32_t token) const {
  return std::find(end_tokens_.begin(), end_tokens_.end(), token) != end_tokens_.end();
}

// A mask settles most tokens without reading them (string content inside a string). The others are
// read in byte order (TokenBytes::by_bytes), each from the state after the bytes it shares with the
// token read before it: a prefix is read once for all the tokens that start with it, and the tokens
// that share a refused prefix are refused without reading. A few are read one by one.
void JsonOutputConstraint::mask(std::span<float> logits) const {
  const TokenBytes& vocabulary = *vocabulary_;
  const int64_t string_room = state_.string_content_room();
  const std::vector<uint8_t>& content = state_.gemma_syntax() ? vocabulary.text_content : vocabulary.string_content;
  enum Verdict : uint8_t { kOpen, kAllowed, kRefused };
  std::vector<uint8_t>& verdicts = allowed_;
  verdicts.assign(logits.size(), kOpen);
  std::vector<int32_t>& open = open_;
  open.clear();
  const bool complete = state_.complete();
  for (size_t id = 0; id < logits.size(); ++id) {
    const bool with_bytes = id < vocabulary.bytes.size() && !vocabulary.bytes[id].empty();
    if (logits[id] == -INFINITY) verdicts[id] = kRefused;
    else if (!with_bytes) verdicts[id] = complete && is_end(int32_t(id)) ? kAllowed : kRefused;
    else if (content[id] && vocabulary.characters[id] <= string_room) verdicts[id] = kAllowed;
    else open.push_back(int32_t(id));
  }
  if (prefix_states_.empty()) prefix_states_.resize(2, state_);
  if (open.size() < 4096) {
    std::array<uint8_t, 256> first{};  // 0: not read, 1: refused, 2: taken
    for (int32_t id : open) {
      const std::string& bytes = vocabulary.bytes[size_t(id)];
      uint8_t& byte = first[static_cast<unsigned char>(bytes[0])];
      if (byte == 0) {
        prefix_states_[0].assign(state_);
        byte = prefix_states_[0].feed(static_cast<unsigned char>(bytes[0])) ? 2 : 1;
      }
      bool taken = byte == 2;
      if (taken && bytes.size() > 1) {
        prefix_states_[1].assign(state_);
        taken = std::all_of(bytes.begin(), bytes.end(), [&](char c) { return prefix_states_[1].feed(static_cast<unsigned char>(c)); });
      }
      verdicts[size_t(id)] = taken ? kAllowed : kRefused;
    }
  } else {
    prefix_states_[0].assign(state_);
    constexpr size_t kNone = std::numeric_limits<size_t>::max();
    size_t read_depth = 0;      // prefix_states_[0..read_depth]: after that many bytes of the token read last
    size_t refused_at = kNone;  // the token read last was refused at its byte refused_at - 1
    size_t shared = kNone;      // bytes the current token shares with the token read last
    for (size_t i = 0; i < vocabulary.by_bytes.size(); ++i) {
      const int32_t id = vocabulary.by_bytes[i];
      shared = std::min<size_t>(shared, vocabulary.shared_with_previous[i]);
      if (size_t(id) >= logits.size() || verdicts[size_t(id)] != kOpen) continue;
      if (refused_at != kNone && shared >= refused_at) {  // it starts with a refused prefix
        verdicts[size_t(id)] = kRefused;
        continue;
      }
      const std::string& bytes = vocabulary.bytes[size_t(id)];
      size_t depth = std::min(shared, read_depth);
      if (prefix_states_.size() < bytes.size() + 1) prefix_states_.resize(bytes.size() + 1, state_);
      refused_at = kNone;
      for (; depth < bytes.size(); ++depth) {
        prefix_states_[depth + 1].assign(prefix_states_[depth]);
        if (!prefix_states_[depth + 1].feed(static_cast<unsigned char>(bytes[depth]))) {
          refused_at = depth + 1;
          break;
        }
      }
      read_depth = depth;
      shared = kNone;
      verdicts[size_t(id)] = refused_at == kNone ? kAllowed : kRefused;
    }
  }
  bool any = false;
  for (size_t id = 0; id < logits.size(); ++id) {
    if (verdicts[id] == kAllowed) any = true;
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
