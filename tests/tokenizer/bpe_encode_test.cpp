// Encoding semantics on small hand-written tokenizer.json files: merge order, both merge formats,
// byte fallback, unknown tokens, added tokens, the BOS template, and long inputs against a naive
// reference BPE.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

#include "tokenizer/tokenizer.h"
#include "tokenizer_fixtures.h"

namespace tandem::test {
namespace {

using Ids = std::vector<int32_t>;

int32_t byte_id(unsigned char b) { return 4 + b; }

Tokenizer tiny(const TinyTokenizerSpec& spec) { return Tokenizer::from_json(tiny_tokenizer_json(spec), "tiny.json"); }

int32_t id_of(const Tokenizer& t, const std::string& token) {
  auto id = t.token_to_id(token);
  EXPECT_TRUE(id.has_value()) << token;
  return id.value_or(-1);
}

TEST(BpeEncode, MergesAsStringsAndAsPairsGiveTheSameIds) {
  TinyTokenizerSpec spec;
  spec.tokens = {"a", "b", "c", "ab", "abc"};
  spec.merges = {{"a", "b"}, {"ab", "c"}};
  const Tokenizer strings = tiny(spec);
  spec.pair_merges = true;
  const Tokenizer pairs = tiny(spec);
  EXPECT_EQ(strings.encode("abc", false), Ids{id_of(strings, "abc")});
  EXPECT_EQ(pairs.encode("abc", false), strings.encode("abc", false));
  EXPECT_EQ(pairs.encode("cabcab", false), strings.encode("cabcab", false));
}

TEST(BpeEncode, LowestRankMergesFirst) {
  TinyTokenizerSpec spec;
  spec.tokens = {"a", "b", "c", "ab", "bc"};
  spec.merges = {{"b", "c"}, {"a", "b"}};
  Tokenizer t = tiny(spec);
  EXPECT_EQ(t.encode("abc", false), (Ids{id_of(t, "a"), id_of(t, "bc")}));
  spec.merges = {{"a", "b"}, {"b", "c"}};
  t = tiny(spec);
  EXPECT_EQ(t.encode("abc", false), (Ids{id_of(t, "ab"), id_of(t, "c")}));
}

TEST(BpeEncode, EqualRanksMergeLeftmostFirst) {
  TinyTokenizerSpec spec;
  spec.tokens = {"a", "aa"};
  spec.merges = {{"a", "a"}};
  const Tokenizer t = tiny(spec);
  const int32_t a = id_of(t, "a"), aa = id_of(t, "aa");
  EXPECT_EQ(t.encode("aaa", false), (Ids{aa, a}));
  EXPECT_EQ(t.encode("aaaaa", false), (Ids{aa, aa, a}));
}

TEST(BpeEncode, CharactersOutsideTheVocabularyFallBackToBytes) {
  TinyTokenizerSpec spec;
  spec.tokens = {"a", "b"};
  const Tokenizer t = tiny(spec);
  EXPECT_EQ(t.encode("é", false), (Ids{byte_id(0xC3), byte_id(0xA9)}));
  EXPECT_EQ(t.encode("a😀b", false),
            (Ids{id_of(t, "a"), byte_id(0xF0), byte_id(0x9F), byte_id(0x98), byte_id(0x80), id_of(t, "b")}));
}

TEST(BpeEncode, WithoutByteFallbackUnknownCharactersAreUnkAndFuseUnkJoinsRuns) {
  TinyTokenizerSpec spec;
  spec.tokens = {"a"};
  spec.byte_fallback = false;
  Tokenizer t = tiny(spec);
  const int32_t a = id_of(t, "a");
  EXPECT_EQ(t.encode("éé a", false), (Ids{3, 3, 3, a}));  // no "▁" in this vocabulary either
  spec.fuse_unk = true;
  t = tiny(spec);
  EXPECT_EQ(t.encode("éé a", false), (Ids{3, a}));
  EXPECT_EQ(t.encode("éaé", false), (Ids{3, a, 3}));
}

TEST(BpeEncode, SpacesBecomeWordStartMarksWithoutAPrefixSpace) {
  TinyTokenizerSpec spec;
  spec.tokens = {"▁", "h", "i", "hi", "▁hi", "▁▁"};
  spec.merges = {{"h", "i"}, {"▁", "hi"}, {"▁", "▁"}};
  const Tokenizer t = tiny(spec);
  EXPECT_EQ(t.encode("hi hi", false), (Ids{id_of(t, "hi"), id_of(t, "▁hi")}));
  // "▁▁hi": h+i first, then ▁+hi (rank 1) before ▁+▁ (rank 2).
  EXPECT_EQ(t.encode("  hi", false), (Ids{id_of(t, "▁"), id_of(t, "▁hi")}));
  EXPECT_EQ(t.encode("  ", false), (Ids{id_of(t, "▁▁")}));
  EXPECT_EQ(t.encode(" ", false), (Ids{id_of(t, "▁")}));
}

TEST(BpeEncode, AddedTokensAreCutOutBeforeBpeLeftmostLongest) {
  TinyTokenizerSpec spec;
  spec.tokens = {"a", "b", "c", "ab", "<", ">"};
  spec.merges = {{"a", "b"}};
  spec.added_tokens = R"([
      {"id": 2, "content": "<bos>", "special": true, "normalized": false},
      {"id": 1000, "content": "<c>", "special": true, "normalized": false},
      {"id": 1001, "content": "<c>>", "special": false, "normalized": false},
      {"id": 1002, "content": "bc", "special": false, "normalized": false},
      {"id": 1003, "content": "a b", "special": false, "normalized": true}])";
  const Tokenizer t = tiny(spec);
  const int32_t a = id_of(t, "a"), b = id_of(t, "b"), ab = id_of(t, "ab");
  EXPECT_EQ(t.encode("ab<c>ab", false), (Ids{ab, 1000, ab}));
  EXPECT_EQ(t.encode("<c>>", false), (Ids{1001}));               // longest at the same place
  EXPECT_EQ(t.encode("abc", false), (Ids{a, 1002}));             // found inside a word too
  EXPECT_EQ(t.encode("<bos>ab", true), (Ids{2, 2, ab}));         // typed "<bos>" is the token too
  EXPECT_EQ(t.encode("ba b", false), (Ids{b, 1003}));            // normalized: matched as "a▁b"
  EXPECT_EQ(t.encode("ba\xE2\x96\x81" "b", false), (Ids{b, 1003}));  // and so is a typed "▁"
  EXPECT_TRUE(t.is_special(1000));
  EXPECT_FALSE(t.is_special(1001));
  EXPECT_EQ(t.vocab_size(), 1004);
  EXPECT_EQ(t.token_to_id("<c>"), 1000);
  EXPECT_EQ(t.id_to_token(1003), "a b");
}

TEST(BpeEncode, AddBosAppliesThePostProcessorTemplate) {
  TinyTokenizerSpec spec;
  spec.tokens = {"a"};
  Tokenizer t = tiny(spec);
  EXPECT_EQ(t.bos_id(), 2);
  EXPECT_EQ(t.encode("a", true), (Ids{2, id_of(t, "a")}));
  EXPECT_EQ(t.encode("", true), (Ids{2}));
  EXPECT_EQ(t.encode("", false), Ids{});
  spec.post_processor = R"({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
      {"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "<eos>", "type_id": 0}}]})";
  t = tiny(spec);
  EXPECT_EQ(t.encode("a", true), (Ids{2, id_of(t, "a"), 1}));
  spec.post_processor = "";  // none: add_bos still puts <bos> first
  t = tiny(spec);
  EXPECT_EQ(t.encode("a", true), (Ids{2, id_of(t, "a")}));
}

TEST(BpeEncode, IgnoreMergesTakesAWholeWordThatIsAToken) {
  TinyTokenizerSpec spec;
  spec.tokens = {"a", "b", "ab", "aab"};
  spec.merges = {{"a", "b"}};
  Tokenizer t = tiny(spec);
  EXPECT_EQ(t.encode("aab", false), (Ids{id_of(t, "a"), id_of(t, "ab")}));
  spec.ignore_merges = true;
  t = tiny(spec);
  EXPECT_EQ(t.encode("aab", false), Ids{id_of(t, "aab")});
}

TEST(BpeEncode, SplitPreTokenizerBehaviorsKeepWordsApart) {
  // Without the normalizer the Split pattern " " does match; each piece is merged on its own.
  TinyTokenizerSpec spec;
  spec.tokens = {"a", " ", "a ", " a"};
  spec.merges = {{"a", " "}, {" ", "a"}};
  spec.pair_merges = true;  // "a  " would be ambiguous as a string merge
  spec.normalizer = "";
  Tokenizer t = tiny(spec);  // MergedWithPrevious: "a " | "a"
  EXPECT_EQ(t.encode("a a", false), (Ids{id_of(t, "a "), id_of(t, "a")}));
  spec.pre_tokenizer = R"({"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithNext", "invert": false})";
  t = tiny(spec);  // "a" | " a"
  EXPECT_EQ(t.encode("a a", false), (Ids{id_of(t, "a"), id_of(t, " a")}));
  spec.pre_tokenizer = R"({"type": "Split", "pattern": {"String": " "}, "behavior": "Isolated", "invert": false})";
  t = tiny(spec);
  EXPECT_EQ(t.encode("a a", false), (Ids{id_of(t, "a"), id_of(t, " "), id_of(t, "a")}));
  spec.pre_tokenizer = R"({"type": "Split", "pattern": {"String": " "}, "behavior": "Removed", "invert": false})";
  t = tiny(spec);
  EXPECT_EQ(t.encode("a  a", false), (Ids{id_of(t, "a"), id_of(t, "a")}));
}

TEST(BpeEncode, InvalidUtf8IsReadAsReplacementCharacters) {
  TinyTokenizerSpec spec;
  spec.tokens = {"a", "\xEF\xBF\xBD"};
  const Tokenizer t = tiny(spec);
  const int32_t a = id_of(t, "a"), fffd = id_of(t, "\xEF\xBF\xBD");
  EXPECT_EQ(t.encode("a\xFF" "a", false), (Ids{a, fffd, a}));
  EXPECT_EQ(t.encode("\xE2\x82" "a", false), (Ids{fffd, a}));  // one U+FFFD per maximal invalid part
  EXPECT_EQ(t.encode("\xC0\xAF", false), (Ids{fffd, fffd}));
}

// ---- long inputs against a naive O(n^2) reference of Hugging Face's BPE ------------------------

std::vector<std::string> code_points(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    const size_t n = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

Ids reference_bpe(const Tokenizer& t, const std::map<std::pair<std::string, std::string>, int>& ranks,
                  const std::string& normalized) {
  std::vector<std::string> symbols = code_points(normalized);
  for (;;) {
    int best_rank = -1;
    size_t best = 0;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      auto it = ranks.find({symbols[i], symbols[i + 1]});
      if (it != ranks.end() && (best_rank < 0 || it->second < best_rank)) {
        best_rank = it->second;
        best = i;
      }
    }
    if (best_rank < 0) break;
    symbols[best] += symbols[best + 1];
    symbols.erase(symbols.begin() + best + 1);
  }
  Ids ids;
  for (const std::string& s : symbols) ids.push_back(*t.token_to_id(s));
  return ids;
}

TEST(BpeEncode, LongAndShortInputsMatchANaiveReference) {
  // Random merges over a small alphabet with the word-start mark, so that tokens also have "▁"
  // inside and at the end (the cases where words may not be cut apart), and inputs long enough
  // for the heap-based merge loop.
  std::mt19937 rng(1234);
  const std::vector<std::string> alphabet = {"a", "b", "c", "▁"};
  TinyTokenizerSpec spec;
  spec.tokens = alphabet;
  std::map<std::pair<std::string, std::string>, int> ranks;
  std::vector<std::string> tokens = alphabet;
  while (spec.merges.size() < 150) {
    const std::string& x = tokens[rng() % tokens.size()];
    const std::string& y = tokens[rng() % tokens.size()];
    if (ranks.count({x, y}) || code_points(x + y).size() > 6) continue;
    const std::string merged = x + y;
    ranks[{x, y}] = static_cast<int>(spec.merges.size());
    spec.merges.emplace_back(x, y);
    if (std::find(tokens.begin(), tokens.end(), merged) == tokens.end()) {
      tokens.push_back(merged);
      spec.tokens.push_back(merged);
    }
  }
  const Tokenizer t = tiny(spec);
  for (int trial = 0; trial < 400; ++trial) {
    const size_t length = 1 + rng() % (trial < 200 ? 40 : 600);
    std::string text, normalized;
    for (size_t i = 0; i < length; ++i) {
      const int r = static_cast<int>(rng() % 5);
      text += r < 3 ? alphabet[r] : r == 3 ? " " : "▁";
      normalized += r < 3 ? alphabet[r] : "▁";
    }
    ASSERT_EQ(t.encode(text, false), reference_bpe(t, ranks, normalized)) << "input: " << text;
  }
}

}  // namespace
}  // namespace tandem::test
