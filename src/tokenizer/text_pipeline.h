#pragma once
// The normalizer and pre-tokenizer stages of tokenizer.json, restricted to the kinds Gemma's file
// uses (string Replace; string Split). The loader refuses any other kind, so text is never
// tokenized by a pipeline we only half implement.
#include <string>
#include <string_view>
#include <vector>

namespace tandem::tok {

struct Replacement {
  std::string pattern;  // never empty
  std::string content;
};

// Every occurrence of each pattern, left to right without overlaps, in order of the list.
class Normalizer {
 public:
  std::vector<Replacement> replacements;
  bool empty() const { return replacements.empty(); }
  void apply(std::string_view text, std::string& out) const;  // `out` is overwritten
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// Hugging Face's Split pre-tokenizer with a string pattern (invert = false). Empty pieces are
// dropped, as Hugging Face does.
class PreTokenizer {
 public:
  bool enabled = false;
  std::string pattern;
  SplitBehavior behavior = SplitBehavior::kIsolated;

  template <typename OnPiece>
  void split(std::string_view text, OnPiece&& on_piece) const {
    if (!enabled) {
      on_piece(text);
      return;
    }
    split_into(text, pieces_scratch());
    for (std::string_view piece : pieces_scratch()) on_piece(piece);
  }

 private:
  void split_into(std::string_view text, std::vector<std::string_view>& pieces) const;
  static std::vector<std::string_view>& pieces_scratch();
};

}  // namespace tandem::tok
