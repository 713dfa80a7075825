// `tandem tokenize` and `tandem detokenize` on a small tokenizer.json (skipped until the tandem
// binary is built).
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "support/test_support.h"
#include "tokenizer_fixtures.h"

namespace tandem::test {
namespace {

class TokenizeCli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(tandem_binary())) GTEST_SKIP() << "build the tandem target first";
    TinyTokenizerSpec spec;
    spec.tokens = {"a", "b", "ab", "▁"};  // ids 260..263
    spec.merges = {{"a", "b"}};
    tokenizer_ = dir_.file("tokenizer.json");
    write_file(tokenizer_, tiny_tokenizer_json(spec));
  }
  CommandResult tandem(const std::string& args) { return run(shell_quote(tandem_binary()) + " " + args); }

  TempDir dir_;
  std::string tokenizer_;
};

TEST_F(TokenizeCli, TokenizePrintsIds) {
  CommandResult r = tandem("tokenize --tokenizer " + shell_quote(tokenizer_) + " --text 'ab a' --bos");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out), (nlohmann::json{{"ids", {2, 262, 263, 260}}}));

  write_file(dir_.file("text.txt"), "ab\xC3\xA9");
  r = tandem("tokenize --tokenizer " + shell_quote(tokenizer_) + " --text-file " + shell_quote(dir_.file("text.txt")));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out), (nlohmann::json{{"ids", {262, 4 + 0xC3, 4 + 0xA9}}}));
}

TEST_F(TokenizeCli, DetokenizePrintsText) {
  CommandResult r = tandem("detokenize --tokenizer " + shell_quote(tokenizer_) + " --ids 2,262,263,260,199,173");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out), (nlohmann::json{{"text", "<bos>ab aé"}}));
  r = tandem("detokenize --skip-special --tokenizer " + shell_quote(tokenizer_) + " --ids 2,262");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out), (nlohmann::json{{"text", "ab"}}));
}

TEST_F(TokenizeCli, ErrorsExitWithOneAndSayWhy) {
  CommandResult r = tandem("detokenize --tokenizer " + shell_quote(tokenizer_) + " --ids 2,70000");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("70000"), std::string::npos) << r.err;
  r = tandem("tokenize --tokenizer " + shell_quote(dir_.file("missing.json")) + " --text hi");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("missing.json"), std::string::npos) << r.err;
  r = tandem("tokenize --tokenizer " + shell_quote(tokenizer_));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--text"), std::string::npos) << r.err;
  r = tandem("detokenize --tokenizer " + shell_quote(tokenizer_) + " --ids 1,x");
  EXPECT_EQ(r.exit_code, 1);
}

}  // namespace
}  // namespace tandem::test
