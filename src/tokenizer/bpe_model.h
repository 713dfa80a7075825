#pragma once
// The BPE model of a Hugging Face tokenizer.json: turns one pre-tokenized, normalized "word" into
// token ids. Gemma has no word-level pre-tokenization (a whole line is one word), so merging must
// stay fast on long inputs; see docs/tokenizer.md for how this matches Hugging Face exactly.
#include <cstdint>
#include <string_view>
#include <vector>

#include "tokenizer/merge_table.h"
#include "tokenizer/token_table.h"

namespace tandem::tok {

// Code point -> id of the single-character token, in 256-entry blocks allocated only for the parts
// of Unicode the vocabulary covers.
class CharTable {
 public:
  CharTable();
  void set(uint32_t code_point, int32_t id);
  int32_t get(uint32_t code_point) const {  // -1 when the character is not a token
    return blocks_[(size_t(index_[code_point >> 8]) << 8) | (code_point & 0xFF)];
  }

 private:
  std::vector<uint16_t> index_;  // one entry per block of 256 code points; block 0 is all -1
  std::vector<int32_t> blocks_;
};

struct BpeOptions {
  bool byte_fallback = false;  // characters missing from the vocabulary become <0xNN> tokens
  bool fuse_unk = false;       // consecutive unknown tokens become one
  bool ignore_merges = false;  // a word that is itself a token is not merged from characters
  int32_t unk_id = -1;         // -1: no unknown token (unknown characters are dropped)
};

class BpeModel {
 public:
  BpeOptions options;
  CharTable chars;
  MergeTable merges;
  int32_t byte_tokens[256];  // id of <0xNN>, or -1

  BpeModel();
  // Marks `code_point` as appearing right before U+2581 inside some token; see encode_word.
  void add_glue_before_word_start(uint32_t code_point);

  // Appends the ids of `word` (valid UTF-8, already normalized and pre-tokenized) to `out`.
  void encode_word(std::string_view word, const TokenTable& vocab, std::vector<int32_t>& out) const;

 private:
  struct Symbol {
    int32_t id;  // -1: character outside the vocabulary
    uint32_t start;
    uint32_t length;
  };
  void encode_chunk(std::string_view word, std::vector<Symbol>& symbols, size_t word_begin,
                    std::vector<int32_t>& out) const;
  void merge_short(std::vector<Symbol>& symbols) const;
  void merge_long(std::vector<Symbol>& symbols) const;
  void emit(std::string_view word, const Symbol& symbol, size_t word_begin, std::vector<int32_t>& out) const;
  bool glues_before_word_start(uint32_t code_point) const;

  std::vector<uint32_t> glue_before_word_start_;  // sorted
};

}  // namespace tandem::tok
