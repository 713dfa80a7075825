#pragma once
// Finds added tokens (tokenizer.json "added_tokens") in text before BPE runs. Matching is on exact
// strings, leftmost first and longest at that position, like Hugging Face (Aho-Corasick,
// LeftmostLongest) and the peer @huggingface/tokenizers (a trie walked from each position).
#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

namespace tandem::tok {

class AddedTokenMatcher {
 public:
  AddedTokenMatcher();
  void add(std::string_view content, int32_t id);  // a content added twice keeps the later id
  bool empty() const { return nodes_.size() == 1; }

  // Splits `text` into pieces in order: on_text(string_view) for text between matches (never
  // empty) and on_token(id) for each match.
  template <typename OnText, typename OnToken>
  void split(std::string_view text, OnText&& on_text, OnToken&& on_token) const {
    size_t plain_start = 0;
    size_t i = 0;
    while (i < text.size()) {
      if (!can_start_[static_cast<unsigned char>(text[i])]) {
        ++i;
        continue;
      }
      const Match m = longest_match(text, i);
      if (m.length == 0) {
        ++i;
        continue;
      }
      if (i > plain_start) on_text(text.substr(plain_start, i - plain_start));
      on_token(m.id);
      i += m.length;
      plain_start = i;
    }
    if (plain_start < text.size()) on_text(text.substr(plain_start));
  }

 private:
  struct Node {
    int32_t token_id = -1;
    std::vector<std::pair<unsigned char, int32_t>> children;  // byte -> node index
  };
  struct Match {
    size_t length;
    int32_t id;
  };
  Match longest_match(std::string_view text, size_t start) const;
  int32_t child(int32_t node, unsigned char byte) const;

  std::vector<Node> nodes_;  // nodes_[0] is the root
  std::array<bool, 256> can_start_{};
};

}  // namespace tandem::tok
