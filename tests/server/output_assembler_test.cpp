// Tokens -> client text with the real Gemma 4 tokenizer: whole characters only, stop strings, and
// Gemma's reasoning and tool-call markers split out for chat.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/output_assembler.h"
#include "server/server_fixture.h"

namespace tandem::server {
namespace {

class Assembler : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = test::gemma4_tokenizer_path();
    if (!path.empty()) tokenizer_ = new Tokenizer(Tokenizer::from_file(path));
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    tokenizer_ = nullptr;
  }
  void SetUp() override {
    if (!tokenizer_) GTEST_SKIP() << "npm or its registry is unreachable: no Gemma tokenizer";
  }
  // Feeds the tokens of `text` one at a time and collects the output, then finishes.
  ParsedOutput run(OutputAssembler& a, const std::string& text) {
    ParsedOutput all;
    for (int32_t id : tokenizer_->encode(text, false)) all.append(a.push(id));
    all.append(a.finish());
    return all;
  }
  static Tokenizer* tokenizer_;
};
Tokenizer* Assembler::tokenizer_ = nullptr;

TEST_F(Assembler, ACharacterSplitOverByteTokensComesOutWhole) {
  OutputAssembler a(*tokenizer_, OutputMode::Text, {}, true, false);
  std::vector<int32_t> bytes;
  for (const char* b : {"<0xE6>", "<0x97>", "<0xA5>"}) bytes.push_back(*tokenizer_->token_to_id(b));  // 日
  EXPECT_EQ(a.push(bytes[0]).content, "");
  EXPECT_EQ(a.push(bytes[1]).content, "");
  EXPECT_EQ(a.push(bytes[2]).content, "日");
}

TEST_F(Assembler, StopStringEndsTheOutput) {
  OutputAssembler a(*tokenizer_, OutputMode::Text, {"how"}, true, false);
  EXPECT_EQ(run(a, "Hello world, how are you?").content, "Hello world, ");
  EXPECT_TRUE(a.stopped_by_string());
}

TEST_F(Assembler, MinTokensLetsNoStopStringEndTheOutputBeforeThem) {
  const std::string text = "how now, how are you";
  const size_t tokens = tokenizer_->encode(text, false).size();
  OutputAssembler early(*tokenizer_, OutputMode::Text, {"how"}, true, false, true, 0);
  EXPECT_EQ(run(early, text).content, "");
  // The first "how" is the first token: with min_tokens 3 only the second one can stop the output.
  OutputAssembler later(*tokenizer_, OutputMode::Text, {"how"}, true, false, true, 3);
  EXPECT_EQ(run(later, text).content, "how now, ");
  EXPECT_TRUE(later.stopped_by_string());
  OutputAssembler never(*tokenizer_, OutputMode::Text, {"how"}, true, false, true, int(tokens) + 1);
  EXPECT_EQ(run(never, text).content, text);
}

TEST_F(Assembler, TextModeSkipsSpecialTokensWhenAsked) {
  OutputAssembler skip(*tokenizer_, OutputMode::Text, {}, true, false);
  EXPECT_EQ(run(skip, "<bos>Hi").content, "Hi");
  OutputAssembler keep(*tokenizer_, OutputMode::Text, {}, false, false);
  EXPECT_EQ(run(keep, "<bos>Hi").content, "<bos>Hi");
}

TEST_F(Assembler, ChatSeparatesReasoningContentAndToolCalls) {
  OutputAssembler a(*tokenizer_, OutputMode::Chat, {}, true, false);
  const ParsedOutput out = run(a, "<|channel>thought\nLet me check.<channel|>Sure: "
                                  "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}<tool_call|>");
  EXPECT_EQ(out.reasoning, "Let me check.");
  EXPECT_EQ(out.content, "Sure: ");
  ASSERT_EQ(out.tool_calls.size(), 1u);
  EXPECT_EQ(out.tool_calls[0].name, "get_weather");
  EXPECT_EQ(out.tool_calls[0].arguments, nlohmann::json({{"city", "Paris"}}));
}

// Skipping special tokens keeps a call's string delimiters: a string holding a comma, a bracket or a
// colon parses only with them.
TEST_F(Assembler, ChatKeepsTheStringsOfToolCallsWhole) {
  OutputAssembler a(*tokenizer_, OutputMode::Chat, {}, true, false);
  const ParsedOutput out = run(a, "<|tool_call>call:note{text:<|\"|>a, b]: {c}<|\"|>,n:2}<tool_call|>");
  ASSERT_EQ(out.tool_calls.size(), 1u) << out.content;
  EXPECT_EQ(out.tool_calls[0].arguments, nlohmann::json({{"text", "a, b]: {c}"}, {"n", 2}}));
  EXPECT_EQ(out.content, "");
}

TEST_F(Assembler, ChatSkipsSpecialTokensButTheMarkers) {
  const std::string text = "<bos>A<pad><|channel>thought\nhm<channel|>B<|think|>C";
  OutputAssembler skip(*tokenizer_, OutputMode::Chat, {}, true, false);
  const ParsedOutput out = run(skip, text);
  EXPECT_EQ(out.reasoning, "hm");
  EXPECT_EQ(out.content, "ABC");
  OutputAssembler keep(*tokenizer_, OutputMode::Chat, {}, false, false);
  EXPECT_EQ(run(keep, text).content, "<bos>A<pad>B<|think|>C");
}

TEST_F(Assembler, ChatWithoutToolsKeepsACallAsContent) {
  const std::string text = "Sure <|tool_call>call:f{a:1}<tool_call|>";
  OutputAssembler tools(*tokenizer_, OutputMode::Chat, {}, true, false, true);
  EXPECT_EQ(run(tools, text).tool_calls.size(), 1u);
  // Skipping special tokens drops the call's markers (special tokens) but keeps what the model wrote.
  OutputAssembler none(*tokenizer_, OutputMode::Chat, {}, true, false, false);
  const ParsedOutput skipped = run(none, text);
  EXPECT_TRUE(skipped.tool_calls.empty());
  EXPECT_EQ(skipped.content, "Sure call:f{a:1}");
  OutputAssembler kept(*tokenizer_, OutputMode::Chat, {}, false, false, false);
  EXPECT_EQ(run(kept, text).content, text);
}

TEST_F(Assembler, ChatPromptThatOpenedReasoning) {
  OutputAssembler a(*tokenizer_, OutputMode::Chat, {}, true, true);
  const ParsedOutput out = run(a, "thinking<channel|>answer");
  EXPECT_EQ(out.reasoning, "thinking");
  EXPECT_EQ(out.content, "answer");
}

TEST_F(Assembler, StreamingEqualsOneShot) {
  const std::string text = "Héllo 🌊 wörld <|channel>thought\nhm<channel|>done";
  OutputAssembler streamed(*tokenizer_, OutputMode::Chat, {"wör"}, true, false);
  const ParsedOutput out = run(streamed, text);
  EXPECT_EQ(out.content, "Héllo 🌊 ");
  EXPECT_EQ(out.reasoning, "");
}

}  // namespace
}  // namespace tandem::server
