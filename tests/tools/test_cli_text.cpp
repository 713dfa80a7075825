// The text-facing commands end to end: `chat-template` prints exactly what the official template
// renders, and `generate --prompt` tokenizes with the model's tokenizer.json like `tokenize` does.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "support/test_support.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;
using nlohmann::json;

std::string tandem_cmd(const std::string& args) { return test::shell_quote(test::tandem_binary()) + " " + args; }

TEST(ChatTemplateCli, PrintsTheOfficialRenderingsExactly) {
  const json cases = json::parse(test::read_file(test::shared_dir() + "/data/gemma4_chat_template_cases.json"));
  const json expected = json::parse(test::read_file(test::shared_dir() + "/data/gemma4_chat_template_expected.json"));
  for (size_t i = 0; i < cases.size(); ++i) {
    test::TempDir dir;
    json request = {{"messages", cases[i]["messages"]}};
    if (cases[i].contains("tools")) request["tools"] = cases[i]["tools"];
    test::write_file(dir.file("request.json"), request.dump());
    std::string args = "chat-template --messages " + dir.file("request.json");
    if (cases[i].value("enable_thinking", false)) args += " --thinking";
    if (!cases[i].value("add_generation_prompt", true)) args += " --no-generation-prompt";
    const auto r = test::run(tandem_cmd(args));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, expected[i].get<std::string>()) << "case " << i;
  }
}

TEST(ChatTemplateCli, BadMessagesGiveAClearError) {
  test::TempDir dir;
  test::write_file(dir.file("bad.json"), R"([{"role": "wizard", "content": "hi"}])");
  auto r = test::run(tandem_cmd("chat-template --messages " + dir.file("bad.json")));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("wizard"));
  r = test::run(tandem_cmd("chat-template --messages " + dir.file("missing.json")));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("missing.json"));
}

TEST(GenerateCli, PromptIsTokenizedWithBosLikeTokenize) {
  const std::string model = test::demo_model_with_tokenizer();
  if (model.empty()) GTEST_SKIP() << "the Gemma tokenizer is not available (npm unreachable)";
  const std::string text = "The capital of France is";
  const auto tokenized = test::run(tandem_cmd("tokenize --tokenizer " + model + "/tokenizer.json --bos --text " +
                                              test::shell_quote(text)));
  ASSERT_EQ(tokenized.exit_code, 0) << tokenized.err;
  std::string ids;
  for (int id : json::parse(tokenized.out)["ids"].get<std::vector<int>>()) ids += (ids.empty() ? "" : ",") + std::to_string(id);
  EXPECT_EQ(ids.rfind("2,", 0), 0u) << "a text prompt starts with <bos>";
  const auto by_text = test::run(tandem_cmd("generate --model " + model + " --prompt " + test::shell_quote(text) +
                                            " --max-tokens 6 --ignore-eos"));
  const auto by_ids = test::run(tandem_cmd("generate --model " + model + " --ids " + ids + " --max-tokens 6 --ignore-eos"));
  ASSERT_EQ(by_text.exit_code, 0) << by_text.err;
  ASSERT_EQ(by_ids.exit_code, 0) << by_ids.err;
  const json a = json::parse(by_text.out), b = json::parse(by_ids.out);
  EXPECT_EQ(a["ids"], b["ids"]);
  EXPECT_TRUE(a["text"].is_string());
  const auto neither = test::run(tandem_cmd("generate --model " + model + " --max-tokens 2"));
  EXPECT_NE(neither.exit_code, 0);
  EXPECT_THAT(neither.err, HasSubstr("--ids"));
}

}  // namespace
}  // namespace tandem
