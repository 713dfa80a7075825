// Bad tokenizer.json files: each is an Error that names the file and says what is wrong, never a
// crash and never a tokenizer that would silently tokenize differently from Hugging Face.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.h"
#include "support/test_support.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer_fixtures.h"

namespace tandem::test {
namespace {

// Loads `json` from a file and expects an Error whose message has the path and every `needle`.
void expect_load_error(const std::string& json, std::initializer_list<std::string> needles) {
  TempDir dir;
  const std::string path = dir.file("tokenizer.json");
  write_file(path, json);
  try {
    Tokenizer::from_file(path);
    ADD_FAILURE() << "loaded without error: " << json.substr(0, 200);
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(path), std::string::npos) << message;
    for (const std::string& needle : needles) EXPECT_NE(message.find(needle), std::string::npos) << message;
  }
}

// A valid tiny file with `from` replaced by `to` (which must occur).
std::string edited(const std::string& from, const std::string& to, TinyTokenizerSpec spec = {}) {
  if (spec.tokens.empty()) {
    spec.tokens = {"a", "b", "ab"};
    spec.merges = {{"a", "b"}};
  }
  std::string json = tiny_tokenizer_json(spec);
  const size_t at = json.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) json.replace(at, from.size(), to);
  return json;
}

TEST(LoadErrors, MissingFileEmptyFileAndDirectory) {
  TempDir dir;
  for (const std::string& path : {dir.file("nope/tokenizer.json"), dir.path()}) {
    try {
      Tokenizer::from_file(path);
      ADD_FAILURE() << path;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
  }
  expect_load_error("", {"empty"});
}

TEST(LoadErrors, NotJson) {
  expect_load_error("{\"model\": {\"vocab\": {\"a\": 0}", {"JSON"});
  expect_load_error("this is not json", {"JSON"});
  expect_load_error("[1, 2, 3]", {"object"});
  const std::string valid = edited("\"a\"", "\"a\"");
  expect_load_error(valid.substr(0, valid.size() / 2), {"JSON"});  // cut short
}

TEST(LoadErrors, MissingOrWrongModel) {
  expect_load_error(R"({"version": "1.0", "added_tokens": []})", {"model"});
  expect_load_error(R"({"model": {"type": "BPE", "merges": []}})", {"vocab"});
  expect_load_error(R"({"model": {"type": "BPE", "vocab": {"a": 0}}})", {"merges"});
  expect_load_error(R"({"model": {"type": "BPE", "vocab": {}, "merges": []}})", {"vocab", "empty"});
  expect_load_error(edited("\"type\":\"BPE\"", "\"type\":\"WordPiece\""), {"model.type", "WordPiece"});
  expect_load_error(edited("\"type\":\"BPE\"", "\"type\":\"Unigram\""), {"Unigram"});
  expect_load_error(edited("\"dropout\":null", "\"dropout\":0.1"), {"dropout"});
  expect_load_error(edited("\"unk_token\":\"<unk>\"", "\"unk_token\":\"<nope>\""), {"unk_token", "<nope>"});
  expect_load_error(edited("\"ab\":262", "\"ab\":\"x\""), {"model.vocab", "ab"});
  expect_load_error(edited("\"ab\":262", "\"ab\":-4"), {"model.vocab", "ab"});
  // An id far past any vocabulary is refused before tables grow to it (it took 3 GB and hung).
  expect_load_error(edited("\"ab\":262", "\"ab\":1000000000"), {"model.vocab", "ab", "beyond any vocabulary"});
  // Two tokens with one id would tokenize silently differently.
  expect_load_error(edited("\"ab\":262", "\"ab\":261"), {"model.vocab", "the same id 261"});
}

TEST(LoadErrors, BadMerges) {
  expect_load_error(edited("\"a b\"", "\"a c\""), {"model.merges[0]", "\"c\""});
  expect_load_error(edited("\"a b\"", "\"b a\""), {"model.merges[0]", "\"ba\""});  // merged token missing
  expect_load_error(edited("\"a b\"", "\"ab\""), {"model.merges[0]"});
  expect_load_error(edited("\"a b\"", "\"a b c\""), {"model.merges[0]"});
  expect_load_error(edited("\"a b\"", "[\"a\"]"), {"model.merges[0]"});
  expect_load_error(edited("\"a b\"", "7"), {"model.merges[0]"});
  expect_load_error(edited("\"merges\":[", "\"merges\":{\"x\":["), {"merges"});
}

TEST(LoadErrors, UnsupportedPipelineKindsAreRefusedByName) {
  expect_load_error(edited("\"type\":\"Replace\",\"pattern\":{\"String\":\" \"}", "\"type\":\"NFKC\",\"pattern\":{\"String\":\" \"}"),
                    {"normalizer", "NFKC"});
  expect_load_error(edited("{\"String\":\" \"},\"content\":\"▁\"", "{\"Regex\":\"\\\\s\"},\"content\":\"▁\""),
                    {"normalizer.pattern", "regex"});
  expect_load_error(edited("\"type\":\"Split\"", "\"type\":\"ByteLevel\""), {"pre_tokenizer", "ByteLevel"});
  expect_load_error(edited("\"invert\":false", "\"invert\":true"), {"invert"});
  expect_load_error(edited("{\"type\":\"ByteFallback\"}", "{\"type\":\"ByteLevel\"}"), {"decoder", "ByteLevel"});
  expect_load_error(edited(",\"decoder\":{", ",\"decoder\":null,\"unused\":{"), {"decoder"});
  expect_load_error(edited("\"type\":\"TemplateProcessing\"", "\"type\":\"RobertaProcessing\""),
                    {"post_processor", "RobertaProcessing"});
  expect_load_error(edited("\"content\":\"<bos>\",\"special\":true", "\"content\":\"<bos>\",\"lstrip\":true,\"special\":true"),
                    {"added_tokens[2]", "lstrip"});
  expect_load_error(edited("\"content\":\"<eos>\",\"special\":true", "\"content\":\"<eos>\",\"single_word\":true,\"special\":true"),
                    {"single_word"});
}

TEST(LoadErrors, MergesBeforeTheVocabularyStillLoad) {
  // JSON objects are unordered; a file with "merges" first must load the same.
  TinyTokenizerSpec spec;
  spec.tokens = {"a", "b", "ab"};
  spec.merges = {{"a", "b"}};
  std::string json = tiny_tokenizer_json(spec);
  const size_t vocab = json.find("\"vocab\":"), merges = json.find(",\"merges\":");
  ASSERT_LT(vocab, merges);
  const std::string merges_member = json.substr(merges + 1, json.find(']', merges) + 1 - (merges + 1));
  json.erase(merges, merges_member.size() + 1);
  json.insert(vocab, merges_member + ",");
  const Tokenizer t = Tokenizer::from_json(json, "reordered.json");
  EXPECT_EQ(t.encode("abab", false), (std::vector<int32_t>{262, 262}));
}

}  // namespace
}  // namespace tandem::test
