// Output held to JSON end to end: response_format json_object and json_schema on the demo model
// (random weights, the real Gemma 4 tokenizer), over curl and the official OpenAI Node SDK, with the
// replies checked by ajv (an independent JSON Schema validator).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/openai_server_fixture.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;
using nlohmann::json;
using test::OpenAIServer;

// response_format json_object: the answer is held to a JSON object. On random weights it starts
// with '{' where it would otherwise start with anything; a bias towards '}' closes the object at
// once, and the answer then ends with the stop token (finish "stop"), streamed or not.
TEST_F(OpenAIServer, JsonObjectOutputIsAJsonObject) {
  auto chat = [&](const json& extra) {
    json body = {{"messages", {{{"role", "user"}, {"content", "Give me a JSON object about rivers."}}}},
                 {"max_tokens", 24}, {"temperature", 0}};
    body.update(extra);
    return test::curl(url("/v1/chat/completions") + " -d " + test::shell_quote(body.dump()));
  };
  const json json_mode = {{"response_format", {{"type", "json_object"}}}};
  const auto plain = chat(json::object());
  const auto held = chat(json_mode);
  ASSERT_EQ(held.status, 200) << held.body;
  const std::string content = held.json()["choices"][0]["message"]["content"];
  const size_t first = content.find_first_not_of(" \t\n\r");
  ASSERT_NE(first, std::string::npos) << content;
  EXPECT_EQ(content[first], '{') << content;
  EXPECT_NE(plain.json()["choices"][0]["message"]["content"], held.json()["choices"][0]["message"]["content"]);
  if (held.json()["choices"][0]["finish_reason"] == "stop") {
    EXPECT_TRUE(json::parse(content).is_object()) << content;
  }

  const auto brace = test::curl(url("/tokenize") + " -d " +
                                test::shell_quote(json{{"prompt", "}"}, {"add_special_tokens", false}}.dump()));
  ASSERT_EQ(brace.json()["tokens"].size(), 1u) << brace.body;
  json closing = json_mode;
  closing["logit_bias"] = {{std::to_string(brace.json()["tokens"][0].get<int>()), 100}};
  const auto closed = chat(closing);
  ASSERT_EQ(closed.status, 200) << closed.body;
  const json closed_reply = closed.json();
  const json& choice = closed_reply["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "stop") << closed.body;
  EXPECT_TRUE(json::parse(choice["message"]["content"].get<std::string>()).is_object()) << closed.body;
  closing["stream"] = true;
  const auto streamed = chat(closing);
  std::string text;
  for (size_t at = 0; (at = streamed.body.find("data: {", at)) != std::string::npos; ++at) {
    const json chunk = json::parse(streamed.body.substr(at + 6, streamed.body.find('\n', at) - at - 6));
    if (!chunk["choices"].empty()) text += chunk["choices"][0]["delta"].value("content", "");
  }
  EXPECT_EQ(text, choice["message"]["content"]);
}

// response_format json_schema, sampled at temperature 1 on random weights: every reply that
// finishes is valid for its schema, and most finish; streamed replies equal the others; the SDK's
// parse() reads the greedy reply; /v1/completions takes the format too; a pattern is refused. And
// tool_choice "required" or a named function: the reply is calls with valid arguments.
TEST_F(OpenAIServer, JsonSchemaOutputIsValidForItsSchema) {
  const json r = check("structured");
  int finished = 0;
  for (const json& result : r["results"]) {
    SCOPED_TRACE(result.dump());
    EXPECT_EQ(result["content"], result["streamed_content"]);
    if (result["finish_reason"] != "stop") continue;
    ++finished;
    EXPECT_EQ(result["valid"], true);
  }
  EXPECT_GE(finished, int(r["results"].size()) * 2 / 3) << r["results"].dump();
  EXPECT_TRUE(r["parsed"].is_object()) << r.dump();
  EXPECT_EQ(r["parsed"], json::parse(r["parsed_content"].get<std::string>()));
  EXPECT_EQ(r["completion"]["finish_reason"], "stop") << r.dump();
  EXPECT_EQ(r["completion_valid"], true) << r.dump();
  // tool_choice "required" and a named function hold the reply to calls: every reply that finishes
  // is calls, each valid for its function's parameters (a named choice: one call of that function).
  int called = 0;
  for (const json& reply : r["forced"]) {
    SCOPED_TRACE(reply.dump());
    std::vector<std::string> names;
    for (const json& call : reply["calls"]) names.push_back(call["name"]);
    EXPECT_EQ(json(names), reply["streamed_names"]);
    if (reply["finish_reason"] == "length") continue;
    ++called;
    EXPECT_EQ(reply["finish_reason"], "tool_calls");
    EXPECT_TRUE(reply["content"].is_null());
    ASSERT_FALSE(reply["calls"].empty());
    for (const json& call : reply["calls"]) EXPECT_EQ(call["valid"], true);
    if (reply["tool_choice"].is_object()) {
      EXPECT_EQ(reply["calls"].size(), 1u);
      EXPECT_EQ(reply["calls"][0]["name"], "lookup");
    }
  }
  EXPECT_GE(called, 3) << r["forced"].dump();
  EXPECT_EQ(r["markers"]["content"], "\"a<turn|>b<|channel>thought\\nc<channel|>d<|tool_call>call:f{}<tool_call|>\"")
      << r["markers"].dump();
  EXPECT_FALSE(r["markers"].contains("reasoning_content") && !r["markers"]["reasoning_content"].is_null());
  EXPECT_EQ(r["refused"]["status"], 400) << r.dump();
  EXPECT_EQ(r["refused"]["error"]["param"], "response_format");
  EXPECT_THAT(r["refused"]["error"]["message"].get<std::string>(), HasSubstr("'pattern' is not supported"));
}

}  // namespace
}  // namespace tandem
