#include "tokenizer/added_tokens.h"

namespace tandem::tok {

AddedTokenMatcher::AddedTokenMatcher() : nodes_(1) {}

int32_t AddedTokenMatcher::child(int32_t node, unsigned char byte) const {
  for (const auto& [b, index] : nodes_[node].children)
    if (b == byte) return index;
  return -1;
}

void AddedTokenMatcher::add(std::string_view content, int32_t id) {
  if (content.empty()) return;  // an empty token would match everywhere; Hugging Face skips it too
  int32_t node = 0;
  for (char c : content) {
    const auto byte = static_cast<unsigned char>(c);
    int32_t next = child(node, byte);
    if (next < 0) {
      next = static_cast<int32_t>(nodes_.size());
      nodes_.emplace_back();
      nodes_[node].children.emplace_back(byte, next);
    }
    node = next;
  }
  nodes_[node].token_id = id;
  can_start_[static_cast<unsigned char>(content[0])] = true;
}

AddedTokenMatcher::Match AddedTokenMatcher::longest_match(std::string_view text, size_t start) const {
  Match best{0, -1};
  int32_t node = 0;
  for (size_t i = start; i < text.size(); ++i) {
    node = child(node, static_cast<unsigned char>(text[i]));
    if (node < 0) break;
    if (nodes_[node].token_id >= 0) best = Match{i + 1 - start, nodes_[node].token_id};
  }
  return best;
}

}  // namespace tandem::tok
