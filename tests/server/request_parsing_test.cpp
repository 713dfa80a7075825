// Request bodies -> validated parameters, without a server: every refusal names its field.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/api_error.h"
#include "server/chat_request.h"
#include "server/generation_params.h"
#include "server/json_fields.h"

namespace tandem::server {
namespace {

using ::testing::HasSubstr;
using nlohmann::json;

const std::vector<const char*> kChatLimits = {"max_completion_tokens", "max_tokens"};

SamplingParams model_defaults() {
  SamplingParams s;
  s.temperature = 1.0f;
  s.top_k = 64;
  s.top_p = 0.95f;
  return s;
}

GenerationParams parse(const std::string& body) {
  return parse_generation_params(json::parse(body), model_defaults(), kChatLimits, 0);
}

// Expects parsing `body` to fail with `status` naming `param`.
void expect_refused(const std::string& body, const std::string& param, int status = 400, const std::string& code = {}) {
  SCOPED_TRACE(body);
  try {
    parse(body);
    ADD_FAILURE() << "accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, status);
    EXPECT_EQ(e.param, param);
    EXPECT_EQ(e.code, code);
    EXPECT_EQ(e.body()["error"]["param"], param);
  }
}

TEST(GenerationParams, OmittedFieldsTakeTheModelDefaults) {
  const GenerationParams p = parse("{}");
  EXPECT_EQ(p.sampling.temperature, 1.0f);
  EXPECT_EQ(p.sampling.top_k, 64);
  EXPECT_EQ(p.sampling.top_p, 0.95f);
  EXPECT_FALSE(p.sampling.seed.has_value());
  EXPECT_EQ(p.max_tokens, 0);
  EXPECT_FALSE(p.stream);
  EXPECT_TRUE(p.stop.empty());
}

TEST(GenerationParams, ReadsEveryField) {
  const GenerationParams p = parse(R"({"temperature": 0, "top_p": 0.5, "top_k": 5, "min_p": 0.1, "seed": 42,
      "presence_penalty": 1.5, "frequency_penalty": -1, "repetition_penalty": 1.2, "max_tokens": 9,
      "stop": ["a", "bc"], "stream": true, "stream_options": {"include_usage": true}, "n": 1, "ignore_eos": true})");
  EXPECT_TRUE(p.sampling.greedy());
  EXPECT_EQ(p.sampling.top_p, 0.5f);
  EXPECT_EQ(p.sampling.top_k, 5);
  EXPECT_FLOAT_EQ(p.sampling.min_p, 0.1f);
  EXPECT_EQ(p.sampling.seed, 42u);
  EXPECT_EQ(p.sampling.presence_penalty, 1.5f);
  EXPECT_EQ(p.sampling.frequency_penalty, -1.0f);
  EXPECT_FLOAT_EQ(p.sampling.repetition_penalty, 1.2f);
  EXPECT_EQ(p.max_tokens, 9);
  EXPECT_EQ(p.max_tokens_param, "max_tokens");
  EXPECT_EQ(p.stop, (std::vector<std::string>{"a", "bc"}));
  EXPECT_TRUE(p.stream);
  EXPECT_TRUE(p.include_usage);
  EXPECT_TRUE(p.ignore_eos);
  EXPECT_EQ(parse(R"({"stop": "x"})").stop, std::vector<std::string>{"x"});
  EXPECT_EQ(parse(R"({"top_k": -1})").sampling.top_k, 0);
  EXPECT_EQ(parse(R"({"max_tokens": 3.0})").max_tokens, 3);
  EXPECT_EQ(parse(R"({"temperature": null})").sampling.temperature, 1.0f);
  const auto bias = parse(R"({"logit_bias": {"7": -100, "12": 2.5}})").sampling.logit_bias;
  EXPECT_EQ(bias, (std::vector<std::pair<int32_t, float>>{{7, -100.0f}, {12, 2.5f}}));
}

TEST(GenerationParams, ResponseFormatJsonObjectHoldsTheOutputToJson) {
  EXPECT_EQ(parse(R"({"response_format": {"type": "json_object"}})").json_format, "json_object");
  EXPECT_EQ(parse(R"({"response_format": {"type": "json_object"}})").json_grammar, nullptr) << "any object";
  EXPECT_EQ(parse(R"({"response_format": {"type": "text"}})").json_format, "");
  EXPECT_EQ(parse("{}").json_format, "");
  expect_refused(R"({"response_format": {"type": "json_object"}, "ignore_eos": true})", "ignore_eos");
}

TEST(GenerationParams, MaxCompletionTokensWinsOverMaxTokens) {
  const GenerationParams p = parse(R"({"max_tokens": 5, "max_completion_tokens": 7})");
  EXPECT_EQ(p.max_tokens, 7);
  EXPECT_EQ(p.max_tokens_param, "max_completion_tokens");
}

TEST(GenerationParams, RefusesOutOfRangeAndWrongTypes) {
  expect_refused(R"({"temperature": "hot"})", "temperature");
  expect_refused(R"({"temperature": -0.1})", "temperature");
  expect_refused(R"({"temperature": 2.1})", "temperature");
  expect_refused(R"({"top_p": 0})", "top_p");
  expect_refused(R"({"top_p": 1.01})", "top_p");
  expect_refused(R"({"top_k": -2})", "top_k");
  expect_refused(R"({"top_k": 1.5})", "top_k");
  expect_refused(R"({"min_p": 2})", "min_p");
  expect_refused(R"({"presence_penalty": 3})", "presence_penalty");
  expect_refused(R"({"frequency_penalty": -3})", "frequency_penalty");
  expect_refused(R"({"repetition_penalty": 0})", "repetition_penalty");
  expect_refused(R"({"seed": "x"})", "seed");
  expect_refused(R"({"max_tokens": -1})", "max_tokens");
  expect_refused(R"({"max_tokens": 0})", "max_tokens");
  expect_refused(R"({"max_completion_tokens": "9"})", "max_completion_tokens");
  expect_refused(R"({"n": 0})", "n");
  expect_refused(R"({"n": 129})", "n");
  expect_refused(R"({"n": 1.5})", "n");
  expect_refused(R"({"n": 2, "best_of": 3})", "best_of");
  expect_refused(R"({"stop": 5})", "stop");
  expect_refused(R"({"stop": ["a", 1]})", "stop");
  expect_refused(R"({"stop": ["a", "b", "c", "d", "e"]})", "stop");
  expect_refused(R"({"stop": [""]})", "stop");
  expect_refused(R"({"stream": "yes"})", "stream");
  expect_refused(R"({"stream_options": {"include_usage": true}})", "stream_options");
  expect_refused(R"({"stream": true, "stream_options": 1})", "stream_options");
  expect_refused(R"({"logit_bias": {"5": 101}})", "logit_bias");
  expect_refused(R"({"logit_bias": {"5": "up"}})", "logit_bias");
  expect_refused(R"({"logit_bias": {"five": 1}})", "logit_bias");
  expect_refused(R"({"logit_bias": {"-1": 1}})", "logit_bias");
  expect_refused(R"({"logit_bias": {"007": 1}})", "logit_bias");
  expect_refused(R"({"logit_bias": {"-0": 1}})", "logit_bias");
  expect_refused(R"({"logit_bias": {"+5": 1}})", "logit_bias");
  expect_refused(R"({"logit_bias": "x"})", "logit_bias");
  expect_refused(R"({"response_format": {"type": "regex", "regex": "a+"}})", "response_format");
  expect_refused(R"({"response_format": {"type": "json_schema"}})", "response_format");
  expect_refused(R"({"response_format": {"type": "json_schema", "json_schema": {"schema": {"pattern": "a+"}}}})",
                 "response_format");
  expect_refused(R"({"response_format": {}})", "response_format");
}

TEST(GenerationParams, ModelNameMustMatchWhenGiven) {
  EXPECT_NO_THROW(check_model_name(json::parse(R"({"model": "gemma"})"), "gemma"));
  EXPECT_NO_THROW(check_model_name(json::parse("{}"), "gemma"));
  try {
    check_model_name(json::parse(R"({"model": "gpt"})"), "gemma");
    ADD_FAILURE();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 404);
    EXPECT_EQ(e.code, "model_not_found");
  }
}

TEST(ChatRequest, RendersTheChatTemplate) {
  const ChatRequest r = parse_chat_request(json::parse(R"({"messages": [{"role": "user", "content": "Hi"}]})"),
                                           model_defaults());
  EXPECT_EQ(r.prompt, "<bos><|turn>user\nHi<turn|>\n<|turn>model\n");
  EXPECT_FALSE(r.starts_in_reasoning);
  const ChatRequest thinking = parse_chat_request(
      json::parse(R"({"messages": [{"role": "user", "content": "Hi"}], "chat_template_kwargs": {"enable_thinking": true}})"),
      model_defaults());
  EXPECT_TRUE(thinking.thinking);
  EXPECT_THAT(thinking.prompt, HasSubstr("<|think|>"));
}

// A JSON answer cannot follow a prompt that has already opened the thought channel (thinking on,
// after a tool response), nor call tools; a plain request with json_object is taken.
TEST(ChatRequest, JsonObjectIsRefusedAfterAnOpenedThoughtChannelOrWithTools) {
  const std::string body = R"({"messages": [{"role": "user", "content": "Weather?"},
      {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "sunny"}],
      "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}], "tool_choice": "none",
      "chat_template_kwargs": {"enable_thinking": true})";
  const ChatRequest open = parse_chat_request(json::parse(body + "}"), model_defaults());
  ASSERT_TRUE(open.starts_in_reasoning) << open.prompt;
  auto refusal_of = [](const std::string& request) -> json {
    try {
      parse_chat_request(json::parse(request), model_defaults());
    } catch (const ApiError& e) {
      return e.body()["error"];
    }
    return "accepted";
  };
  const json thought = refusal_of(body + R"(, "response_format": {"type": "json_object"}})");
  EXPECT_EQ(thought["param"], "response_format");
  EXPECT_THAT(thought["message"].get<std::string>(), HasSubstr("thought channel"));
  // Nor can it call the tools it is offered.
  const json tools = refusal_of(R"({"messages": [{"role": "user", "content": "Hi"}], "response_format": {"type":
      "json_object"}, "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]})");
  EXPECT_EQ(tools["param"], "response_format");
  EXPECT_THAT(tools["message"].get<std::string>(), HasSubstr("cannot call tools"));
  const ChatRequest plain = parse_chat_request(
      json::parse(R"({"messages": [{"role": "user", "content": "Hi"}], "response_format": {"type": "json_object"}})"),
      model_defaults());
  EXPECT_EQ(plain.params.json_format, "json_object");
}

TEST(ChatRequest, ToolChoiceNoneLeavesToolsOut) {
  const std::string tools =
      R"("tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
          "properties": {"city": {"type": "string"}}}}}])";
  const std::string messages = R"("messages": [{"role": "user", "content": "Weather?"}])";
  const auto render = [&](const std::string& extra) {
    return parse_chat_request(json::parse("{" + messages + ", " + tools + extra + "}"), model_defaults()).prompt;
  };
  EXPECT_THAT(render(""), HasSubstr("declaration:get_weather"));
  EXPECT_THAT(render(R"(, "tool_choice": "auto")"), HasSubstr("declaration:get_weather"));
  EXPECT_THAT(render(R"(, "tool_choice": "none")"), ::testing::Not(HasSubstr("declaration:get_weather")));
  EXPECT_THAT(render(R"(, "tool_choice": {"type": "function", "function": {"name": "get_weather"}})"),
              HasSubstr("declaration:get_weather"));
  EXPECT_THROW(render(R"(, "tool_choice": {"type": "function", "function": {"name": "other"}})"), ApiError);
  EXPECT_THROW(render(R"(, "tool_choice": "maybe")"), ApiError);
  EXPECT_THROW(render(R"(, "tool_choice": {"type": "tool", "function": {"name": "get_weather"}})"), ApiError);
}

TEST(ChatRequest, ToolCallsAreParsedOnlyWhenToolsWereOffered) {
  const std::string tools = R"("tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}])";
  const std::string messages = R"("messages": [{"role": "user", "content": "x"}])";
  const auto offered = [&](const std::string& extra) {
    return parse_chat_request(json::parse("{" + messages + extra + "}"), model_defaults()).tools_offered;
  };
  EXPECT_FALSE(offered(""));
  EXPECT_FALSE(offered(R"(, "tools": [])"));
  EXPECT_TRUE(offered(", " + tools));
  EXPECT_FALSE(offered(", " + tools + R"(, "tool_choice": "none")"));
}

// A text-only server must not answer about media it never saw, nor drop fields that change the answer.
TEST(ChatRequest, RefusesMediaPartsAndUnsupportedFields) {
  const auto refusal = [](const std::string& body) -> std::pair<std::string, std::string> {
    try {
      parse_chat_request(json::parse(body), model_defaults());
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      return {e.param, e.what()};
    }
    return {"(accepted)", ""};
  };
  const auto image = refusal(R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "what is it?"},
      {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]})");
  EXPECT_EQ(image.first, "messages[0].content[1]");
  EXPECT_THAT(image.second, HasSubstr("'image_url' are not supported"));
  EXPECT_EQ(refusal(R"({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type":
      "input_audio", "input_audio": {"data": "", "format": "wav"}}]}]})").first, "messages[1].content[0]");
  const std::string messages = R"("messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}])";
  EXPECT_EQ(refusal("{" + messages + "}").first, "(accepted)");
  EXPECT_EQ(refusal("{" + messages + R"(, "functions": [{"name": "f", "parameters": {}}]})").first, "functions");
  EXPECT_EQ(refusal("{" + messages + R"(, "function_call": "auto"})").first, "function_call");
  EXPECT_EQ(refusal("{" + messages + R"(, "modalities": ["text", "audio"]})").first, "modalities");
  EXPECT_EQ(refusal("{" + messages + R"(, "modalities": ["text"]})").first, "(accepted)");
  EXPECT_EQ(refusal("{" + messages + R"(, "audio": {"voice": "alloy", "format": "wav"}})").first, "audio");
  EXPECT_EQ(refusal("{" + messages + R"(, "best_of": 2})").first, "best_of");
  EXPECT_EQ(refusal("{" + messages + R"(, "best_of": 1, "min_tokens": 0})").first, "(accepted)");
  EXPECT_EQ(refusal("{" + messages + R"(, "n": 3, "best_of": 3})").first, "(accepted)");
  EXPECT_EQ(refusal("{" + messages + R"(, "min_tokens": 5})").first, "(accepted)");
  EXPECT_EQ(refusal("{" + messages + R"(, "max_tokens": 3, "min_tokens": 5})").first, "min_tokens");
  EXPECT_EQ(refusal("{" + messages + R"(, "min_tokens": -1})").first, "min_tokens");
}

TEST(ChatRequest, ContinueFinalMessageLeavesTheTurnOpen) {
  const auto prompt = [](const std::string& assistant, const std::string& extra) {
    return parse_chat_request(json::parse(R"({"messages": [{"role": "user", "content": "Hi"},
        {"role": "assistant", "content": )" + json(assistant).dump() + "}]" + extra + "}"),
                              model_defaults())
        .prompt;
  };
  const std::string head = "<bos><|turn>user\nHi<turn|>\n<|turn>model\n";
  EXPECT_EQ(prompt("Sure, here", ""), head + "Sure, here<turn|>\n<|turn>model\n");
  EXPECT_EQ(prompt("Sure, here", R"(, "continue_final_message": true)"), head + "Sure, here");
  EXPECT_EQ(prompt("Sure, here", R"(, "continue_final_message": true, "add_generation_prompt": false)"),
            head + "Sure, here");
  // The template trims the message; the prompt ends where its text ends, as Hugging Face cuts it.
  EXPECT_EQ(prompt("  Sure, here ", R"(, "continue_final_message": true)"), head + "Sure, here");
  EXPECT_THROW(prompt("Sure", R"(, "continue_final_message": true, "add_generation_prompt": true)"), ApiError);
  EXPECT_THROW(prompt("", R"(, "continue_final_message": true)"), ApiError);
}

TEST(ChatRequest, RefusalsNameTheField) {
  const auto param_of = [](const std::string& body) -> std::string {
    try {
      parse_chat_request(json::parse(body), model_defaults());
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      return e.param;
    }
    return "(accepted)";
  };
  EXPECT_EQ(param_of("{}"), "messages");
  EXPECT_EQ(param_of(R"({"messages": {}})"), "messages");
  EXPECT_EQ(param_of(R"({"messages": []})"), "messages");
  EXPECT_EQ(param_of(R"({"messages": [{"role": "robot", "content": "x"}]})"), "messages[0]");
  EXPECT_EQ(param_of(R"({"messages": [{"role": "user", "content": 5}]})"), "messages[0]");
  EXPECT_EQ(param_of(R"({"messages": [{"role": "user", "content": "x"}], "tools": {}})"), "tools");
  EXPECT_EQ(param_of(R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 3})"), "top_logprobs");
  EXPECT_EQ(param_of(R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21})"),
            "top_logprobs");
  EXPECT_EQ(param_of(R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": []})"),
            "chat_template_kwargs");
}

TEST(JsonBody, RefusesWhatIsNotAUtf8JsonObject) {
  EXPECT_NO_THROW(parse_json_object_body(R"({"a": "é"})"));
  for (const std::string& bad : std::vector<std::string>{std::string("{\"a\": \"\xC3\"}"),      // truncated sequence
                                std::string("{\"a\": \"\xC0\xAF\"}"),  // overlong
                                std::string("{\"a\": \"\xED\xA0\x80\"}"),  // surrogate
                                std::string("{\"a\": \"\xF4\x90\x80\x80\"}"),  // past U+10FFFF
                                std::string("{\"a\": 1"), std::string("[1]"), std::string("\"x\""),
                                std::string("{\"a\": 1e400}"), std::string("{\"a\": [-1e999]}"),  // past float range
                                std::string(1000, '[') + std::string(1000, ']')}) {
    SCOPED_TRACE(bad);
    try {
      parse_json_object_body(bad);
      ADD_FAILURE() << "accepted";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_EQ(e.type, "invalid_request_error");
    }
  }
}

TEST(ApiError, BodyHasOpenAIsShape) {
  const json body = invalid_request("temperature", "too hot").body();
  EXPECT_EQ(body, json::parse(R"({"error": {"message": "too hot", "type": "invalid_request_error",
                                            "param": "temperature", "code": null}})"));
  EXPECT_EQ(error_body(429, "busy", "queue_full")["error"]["type"], "rate_limit_error");
  EXPECT_EQ(error_body(503, "later")["error"]["type"], "server_error");
}

}  // namespace
}  // namespace tandem::server
