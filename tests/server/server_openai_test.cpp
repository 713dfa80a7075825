// `tandem serve` end to end on the demo model (random weights, the real Gemma 4 tokenizer), driven by
// the official OpenAI Node SDK (tests/js/server_client.mjs) and curl. Greedy text from random
// weights is gibberish, but deterministic, which is what these tests compare.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include <signal.h>

#include "server/openai_server_fixture.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;
using nlohmann::json;
using test::kModel;
using test::OpenAIServer;

TEST_F(OpenAIServer, HealthModelsAndMetricsOverCurl) {
  auto health = test::curl(url("/health"));
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(health.json()["status"], "ok");

  auto models = test::curl(url("/v1/models"));
  ASSERT_EQ(models.status, 200) << models.body;
  EXPECT_EQ(models.json()["object"], "list");
  EXPECT_EQ(models.json()["data"][0]["id"], kModel);
  EXPECT_EQ(test::curl(url(std::string("/v1/models/") + kModel)).status, 200);
  EXPECT_EQ(test::curl(url("/v1/models/other")).status, 404);

  test::curl(url("/generate") + " -d '{\"prompt\": \"Hello\", \"max_tokens\": 3}'");
  auto metrics = test::curl(url("/metrics"));
  ASSERT_EQ(metrics.status, 200);
  for (const char* name :
       {"vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
        "vllm:e2e_request_latency_seconds_bucket", "vllm:num_requests_running", "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
        "vllm:request_success_total{finished_reason=\"length\",model_name=\"demo-served\"} 1"})
    EXPECT_THAT(metrics.body, HasSubstr(name));
  EXPECT_THAT(metrics.body, HasSubstr("model_name=\"demo-served\""));
  EXPECT_THAT(server_.log(), HasSubstr("POST /generate 200"));  // one log line per request
}

// The next turn of a chat re-sends the conversation: its prompt starts with the first turn's
// prompt and answer, which the first request left in the cache. The server reports the reused
// tokens in usage and /metrics, and answers as a server that reuses nothing does.
TEST_F(OpenAIServer, TheNextTurnOfAChatReusesTheFirstTurnsCache) {
  auto chat = [&](const test::ServerProcess& server, const json& messages) {
    const json body = {{"model", kModel}, {"messages", messages}, {"max_tokens", 6}, {"temperature", 0}};
    auto reply = test::curl(test::shell_quote(server.base_url() + "/v1/chat/completions") +
                            " -H 'Content-Type: application/json' -d " + test::shell_quote(body.dump()));
    EXPECT_EQ(reply.status, 200) << reply.body;
    return reply.json();
  };
  json messages = {{{"role", "user"}, {"content", "Name three rivers."}}};
  const json first = chat(server_, messages);
  messages.push_back(first["choices"][0]["message"]);
  messages.push_back({{"role", "user"}, {"content", "And three mountains?"}});
  const json second = chat(server_, messages);
  const int first_prompt = first["usage"]["prompt_tokens"];
  EXPECT_GE(second["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), first_prompt);
  EXPECT_LT(second["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(),
            second["usage"]["prompt_tokens"].get<int>());
  const std::string metrics = test::curl(url("/metrics")).body;
  EXPECT_THAT(metrics, HasSubstr("vllm:prefix_cache_queries_total{model_name=\"demo-served\"} " +
                                 std::to_string(first_prompt + second["usage"]["prompt_tokens"].get<int>())));
  EXPECT_THAT(metrics, HasSubstr("vllm:prefix_cache_hits_total{model_name=\"demo-served\"} " +
                                 second["usage"]["prompt_tokens_details"]["cached_tokens"].dump()));

  test::ServerProcess without;
  without.start(model_dir_, {"--kv-memory", "256MiB", "--served-model-name", kModel, "--no-prefix-cache"});
  EXPECT_EQ(chat(without, messages)["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(chat(without, messages)["choices"], second["choices"]);
  EXPECT_EQ(without.stop(SIGTERM), 0);
}

// Prompt logprobs (echo with logprobs; max_tokens 0 for the prompt alone, as lm-eval scores
// continuations): each prompt token's log-probability given the tokens before it. Scoring a prompt
// that ends with a greedy answer gives the answer's tokens the logprobs their generation reported.
TEST_F(OpenAIServer, EchoWithLogprobsScoresThePrompt) {
  auto post = [&](const json& body) {
    auto reply = test::curl(url("/v1/completions") + " -H 'Content-Type: application/json' -d " +
                            test::shell_quote(body.dump()));
    EXPECT_EQ(reply.status, 200) << reply.body;
    return reply.json();
  };
  const std::vector<int> prompt = {2, 818, 5442, 563, 496, 1764};
  const json generated = post({{"prompt", prompt}, {"max_tokens", 4}, {"temperature", 0}, {"logprobs", 2},
                               {"ignore_eos", true}});
  const json& gen = generated["choices"][0]["logprobs"];
  ASSERT_EQ(gen["tokens"].size(), 4u);
  std::vector<int> whole = prompt;
  const json ids = test::curl(url("/tokenize") + " -d " +
                              test::shell_quote(json({{"prompt", generated["choices"][0]["text"]},
                                                      {"add_special_tokens", false}}).dump())).json()["tokens"];
  for (const json& id : ids) whole.push_back(id.get<int>());
  ASSERT_EQ(whole.size(), prompt.size() + 4) << "the answer's text encodes back to its 4 tokens";

  const json scored = post({{"prompt", whole}, {"max_tokens", 0}, {"echo", true}, {"logprobs", 2}});
  const json& choice = scored["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "length");
  EXPECT_EQ(scored["usage"]["completion_tokens"], 0);
  EXPECT_EQ(scored["usage"]["prompt_tokens"], int(whole.size()));
  const json& lp = choice["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), whole.size());
  EXPECT_EQ(lp["tokens"][0], "<bos>");
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  for (size_t i = 1; i < whole.size(); ++i) {
    EXPECT_LE(lp["token_logprobs"][i].get<double>(), 0.0) << i;
    EXPECT_LE(lp["top_logprobs"][i].size(), 3u) << "two alternatives, and the prompt token itself";
    EXPECT_EQ(lp["top_logprobs"][i][lp["tokens"][i].get<std::string>()], lp["token_logprobs"][i]) << i;
  }
  for (size_t k = 0; k < 4; ++k) {
    EXPECT_EQ(lp["tokens"][prompt.size() + k], gen["tokens"][k]);
    EXPECT_NEAR(lp["token_logprobs"][prompt.size() + k].get<double>(), gen["token_logprobs"][k].get<double>(), 1e-3)
        << "answer token " << k;
  }
  EXPECT_EQ(choice["text"].get<std::string>(), test::curl(url("/detokenize") + " -d " +
                                                               test::shell_quote(json({{"tokens", whole}}).dump()))
                                                    .json()["prompt"]
                                                    .get<std::string>());
  // Streamed, and going on to generate: the echo chunk comes first, with the prompt's logprobs.
  const auto streamed = test::curl(url("/v1/completions") + " -d " +
                                   test::shell_quote(json({{"prompt", prompt}, {"max_tokens", 2}, {"echo", true},
                                                           {"logprobs", 1}, {"stream", true}, {"temperature", 0}})
                                                         .dump()));
  ASSERT_EQ(streamed.status, 200);
  const size_t first = streamed.body.find("data: ");
  const json echo_chunk = json::parse(streamed.body.substr(first + 6, streamed.body.find("\n\n", first) - first - 6));
  EXPECT_EQ(echo_chunk["choices"][0]["logprobs"]["tokens"].size(), prompt.size());
  EXPECT_NEAR(echo_chunk["choices"][0]["logprobs"]["token_logprobs"][3].get<double>(),
              lp["token_logprobs"][3].get<double>(), 1e-3);
  // Without echo, max_tokens 0 is still refused.
  EXPECT_EQ(test::curl(url("/v1/completions") + " -d '{\"prompt\": \"Hi\", \"max_tokens\": 0}'").status, 400);
}

TEST_F(OpenAIServer, GenerateTokenizeAndDetokenizeOverCurl) {
  auto generated = test::curl(url("/generate") + " -d '{\"prompt\": \"The sea\", \"max_tokens\": 7, \"temperature\": 0}'");
  ASSERT_EQ(generated.status, 200) << generated.body;
  const json g = generated.json();
  EXPECT_EQ(g["tokens"], 7);
  EXPECT_EQ(g["finish_reason"], "length");
  EXPECT_TRUE(g["text"].is_string());
  auto again = test::curl(url("/generate") + " -d '{\"prompt\": \"The sea\", \"max_tokens\": 7, \"temperature\": 0}'");
  EXPECT_EQ(again.json()["text"], g["text"]) << "greedy generation must repeat";

  auto tokenized = test::curl(url("/tokenize") + " -d '{\"prompt\": \"Hello world\"}'");
  ASSERT_EQ(tokenized.status, 200) << tokenized.body;
  EXPECT_EQ(tokenized.json()["tokens"], json::parse("[2, 9259, 1902]"));  // <bos> Hello ▁world
  EXPECT_EQ(tokenized.json()["count"], 3);
  auto plain = test::curl(url("/tokenize") + " -d '{\"text\": \"Hello world\", \"add_special_tokens\": false}'");
  EXPECT_EQ(plain.json()["tokens"], json::parse("[9259, 1902]"));
  auto chat = test::curl(url("/tokenize") + " -d '{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}'");
  ASSERT_EQ(chat.status, 200) << chat.body;
  EXPECT_EQ(chat.json()["tokens"][0], 2);
  EXPECT_EQ(chat.json()["tokens"][1], 105);  // <|turn>

  // curl -d sends application/x-www-form-urlencoded; bodies past 8 KiB must still be read as JSON.
  test::TempDir tmp;
  std::string words;
  for (int i = 0; i < 3000; ++i) words += "word ";
  test::write_file(tmp.file("big.json"), "{\"prompt\": \"" + words + "\", \"max_tokens\": 2}");
  auto big = test::curl(url("/generate") + " --data-binary @" + tmp.file("big.json"));
  ASSERT_EQ(big.status, 200) << big.body;
  EXPECT_EQ(big.json()["prompt_tokens"], 3002);  // <bos>, 3000 words, the trailing space

  auto detokenized = test::curl(url("/detokenize") + " -d '{\"tokens\": [2, 9259, 1902]}'");
  ASSERT_EQ(detokenized.status, 200);
  EXPECT_EQ(detokenized.json()["prompt"], "<bos>Hello world");
}

// Usage without prompt_tokens_details: how many prompt tokens an earlier request left in the
// cache depends on what ran before, not on the request.
json token_counts(json usage) {
  usage.erase("prompt_tokens_details");
  return usage;
}

TEST_F(OpenAIServer, ChatStreamingReassemblesToTheSameAnswer) {
  const json r = check("chat");
  const json& full = r["full"];
  EXPECT_EQ(full["object"], "chat.completion");
  EXPECT_EQ(full["model"], kModel);
  EXPECT_THAT(full["id"].get<std::string>(), ::testing::StartsWith("chatcmpl-"));
  const json& choice = full["choices"][0];
  EXPECT_EQ(choice["message"]["role"], "assistant");
  EXPECT_EQ(choice["finish_reason"], "length");
  EXPECT_EQ(full["usage"]["completion_tokens"], 24);
  EXPECT_EQ(full["usage"]["total_tokens"],
            full["usage"]["prompt_tokens"].get<int>() + full["usage"]["completion_tokens"].get<int>());

  // Greedy: the stream carries exactly the non-streaming answer, in OpenAI's chunk format.
  EXPECT_EQ(r["streamed"]["content"], choice["message"]["content"]);
  EXPECT_EQ(r["streamed"]["finish_reason"], "length");
  EXPECT_EQ(token_counts(r["streamed"]["usage"]), token_counts(full["usage"]));
  // The same conversation again (after the full answer): all its prompt but the last token is reused.
  EXPECT_EQ(r["streamed"]["usage"]["prompt_tokens_details"]["cached_tokens"],
            full["usage"]["prompt_tokens"].get<int>() - 1);
  EXPECT_EQ(r["first_chunk"]["choices"][0]["delta"], json({{"role", "assistant"}, {"content", ""}}));
  EXPECT_EQ(r["chunk_ids"].size(), 1u);
  EXPECT_EQ(r["chunk_objects"], json::array({"chat.completion.chunk"}));
  const json& finish = r["last_chunks"][0];
  EXPECT_EQ(finish["choices"][0]["delta"], json::object());
  EXPECT_EQ(finish["choices"][0]["finish_reason"], "length");
  const json& usage = r["last_chunks"][1];
  EXPECT_EQ(usage["choices"], json::array());
  EXPECT_EQ(usage["usage"], r["streamed"]["usage"]);

  EXPECT_EQ(r["by_new_name"]["usage"]["completion_tokens"], 5);  // max_completion_tokens
  const json& lp = r["with_logprobs"]["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(lp.size(), 4u);
  EXPECT_EQ(lp[0]["top_logprobs"].size(), 3u);
  EXPECT_LE(lp[0]["logprob"].get<double>(), 0.0);
  EXPECT_EQ(lp[0]["token"], lp[0]["top_logprobs"][0]["token"]) << "greedy picks the most likely token";
  for (const json& u : r["without_usage"]["usage_fields"]) EXPECT_TRUE(u.is_null());
}

TEST_F(OpenAIServer, StopStringsCutTheOutputBeforeThem) {
  const json r = check("stop");
  for (const char* kind : {"chat", "text"}) {
    SCOPED_TRACE(kind);
    const std::string full = r[std::string(kind) + "_full"];
    const std::string stop = r[std::string(kind) + "_stop"];
    const size_t at = full.find(stop);
    ASSERT_NE(at, std::string::npos);
    const std::string expected = full.substr(0, at);
    if (std::string(kind) == "chat") {
      EXPECT_EQ(r["chat_stopped"]["message"]["content"], expected);
      EXPECT_EQ(r["chat_stopped"]["finish_reason"], "stop");
      EXPECT_EQ(r["chat_streamed"]["content"], expected);
      EXPECT_EQ(r["chat_streamed"]["finish_reason"], "stop");
    } else {
      EXPECT_EQ(r["text_stopped"]["text"], expected);
      EXPECT_EQ(r["text_stopped"]["finish_reason"], "stop");
      EXPECT_EQ(r["text_streamed"], expected);
      EXPECT_EQ(r["text_stream_finish"], "stop");
    }
  }
}

TEST_F(OpenAIServer, SameSeedSameText) {
  const json r = check("seed");
  EXPECT_EQ(r["a"], r["b"]);
  EXPECT_NE(r["a"], r["c"]) << "another seed should give another sample";
  EXPECT_EQ(r["defaults_a"], r["defaults_b"]);  // generation_config.json's sampling defaults, seeded
}

TEST_F(OpenAIServer, ToolsAreAcceptedAndFinishReasonsAgree) {
  const json r = check("tools");
  for (const char* name : {"plain", "auto", "none", "required", "named", "followup", "thinking"}) {
    SCOPED_TRACE(name);
    const json& c = r[name];
    const bool calls = c["message"].contains("tool_calls") && !c["message"]["tool_calls"].empty();
    EXPECT_EQ(c["finish_reason"], calls ? "tool_calls" : "length");
  }
  // The tool declaration is rendered into the prompt, except with tool_choice "none".
  EXPECT_GT(r["auto"]["usage"]["prompt_tokens"].get<int>(), r["plain"]["usage"]["prompt_tokens"].get<int>());
  EXPECT_EQ(r["none"]["usage"]["prompt_tokens"], r["plain"]["usage"]["prompt_tokens"]);
  EXPECT_EQ(r["named"]["usage"]["prompt_tokens"], r["auto"]["usage"]["prompt_tokens"]);
  EXPECT_EQ(r["streamed"]["content"], r["auto"]["message"]["content"].is_null() ? json("") : r["auto"]["message"]["content"]);
}

TEST_F(OpenAIServer, TextCompletions) {
  const json r = check("completions");
  const json& full = r["full"];
  EXPECT_EQ(full["object"], "text_completion");
  const std::string text = full["choices"][0]["text"];
  EXPECT_EQ(full["usage"]["completion_tokens"], 12);
  EXPECT_EQ(r["streamed"], text);
  EXPECT_EQ(r["stream_finish"], "length");
  EXPECT_EQ(token_counts(r["stream_usage"]), token_counts(full["usage"]));
  EXPECT_EQ(r["stream_objects"], json::array({"text_completion"}));
  EXPECT_EQ(r["by_ids"]["choices"][0]["text"], text) << "a prompt of token ids (with <bos>) is the same prompt";
  EXPECT_EQ(r["list_of_one"]["choices"][0]["text"], text);
  EXPECT_EQ(r["echoed"]["choices"][0]["text"], "The quick brown fox" + text);
  const json& lp = r["logprobs"]["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"].size(), 3u);
  EXPECT_EQ(lp["token_logprobs"].size(), 3u);
  EXPECT_EQ(lp["top_logprobs"][0].size(), 2u);
  EXPECT_EQ(lp["text_offset"][0], 0);
  // Sampled: top_logprobs always hold the sampled token too (up to logprobs + 1 entries), and
  // text_offset counts characters, as OpenAI's and vLLM's (the random model writes many scripts).
  const json& sampled = r["sampled_logprobs"]["choices"][0]["logprobs"];
  ASSERT_EQ(sampled["tokens"].size(), 12u);
  size_t offset = 0, sampled_below_the_top = 0;
  for (size_t i = 0; i < 12; ++i) {
    const std::string token = sampled["tokens"][i];
    EXPECT_TRUE(sampled["top_logprobs"][i].contains(token)) << i;
    EXPECT_LE(sampled["top_logprobs"][i].size(), 2u);
    if (sampled["top_logprobs"][i].size() == 2) ++sampled_below_the_top;
    EXPECT_EQ(sampled["text_offset"][i], offset) << i;
    offset += size_t(std::count_if(token.begin(), token.end(), [](char c) { return (c & 0xC0) != 0x80; }));
  }
  EXPECT_GT(sampled_below_the_top, 0u) << "temperature 1 on the random model samples below the top token";
  EXPECT_EQ(r["defaulted"]["usage"]["completion_tokens"], 16) << "completions default to 16 tokens, as OpenAI's";
}

// n choices are n requests: sampled ones differ from each other but repeat with the same seed,
// streamed or not; greedy ones equal the answer alone. A batch of prompts answers each prompt n
// times in OpenAI's order (prompt i's choices at i * n ...), and counts each prompt once in usage.
TEST_F(OpenAIServer, NChoicesAndPromptBatchesAnswerEveryChoice) {
  const json r = check("choices");
  const json& many = r["many"]["choices"];
  ASSERT_EQ(many.size(), 3u) << r["many"].dump();
  std::set<std::string> distinct;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(many[i]["index"], i);
    EXPECT_EQ(many[i]["message"], r["many_again"]["choices"][i]["message"]) << "same seed, same request, choice " << i;
    EXPECT_EQ(many[i]["message"]["content"], r["many_streamed"][i]["text"]) << "streamed choice " << i;
    EXPECT_EQ(many[i]["finish_reason"], r["many_streamed"][i]["finish_reason"]);
    distinct.insert(many[i]["message"]["content"].get<std::string>());
  }
  EXPECT_GT(distinct.size(), 1u) << "each choice draws from its own seed";
  EXPECT_EQ(r["many_streamed_roles"], json({0, 1, 2})) << "each choice opens with the assistant role";
  const json& usage = r["many"]["usage"];
  EXPECT_EQ(usage["prompt_tokens"], r["greedy_alone"]["usage"]["prompt_tokens"]) << "the prompt counts once";
  EXPECT_EQ(r["many_streamed_usage"]["completion_tokens"], usage["completion_tokens"]);
  EXPECT_GE(usage["completion_tokens"].get<int>(), 3);
  for (int i = 0; i < 2; ++i)
    EXPECT_EQ(r["greedy_chat"]["choices"][i]["message"], r["greedy_alone"]["choices"][0]["message"]) << i;
  EXPECT_EQ(r["greedy_chat"]["usage"]["completion_tokens"].get<int>(),
            2 * r["greedy_alone"]["usage"]["completion_tokens"].get<int>());

  const json& batch = r["batch"]["choices"];
  ASSERT_EQ(batch.size(), 4u) << r["batch"].dump();
  int prompt_tokens = 0, completion_tokens = 0;
  for (int p = 0; p < 2; ++p) {
    const json& alone = r["batch_alone"][p];
    prompt_tokens += alone["usage"]["prompt_tokens"].get<int>();
    for (int k = 0; k < 2; ++k) {
      const int i = 2 * p + k;
      SCOPED_TRACE(i);
      EXPECT_EQ(batch[i]["index"], i);
      EXPECT_EQ(batch[i]["text"], alone["choices"][0]["text"]) << "echoed prompt and greedy answer, as alone";
      EXPECT_EQ(batch[i]["finish_reason"], alone["choices"][0]["finish_reason"]);
      completion_tokens += alone["usage"]["completion_tokens"].get<int>();
      const std::string text = alone["choices"][0]["text"];
      EXPECT_TRUE(text.ends_with(r["batch_streamed"][i]["text"].get<std::string>())) << "streamed without echo";
      EXPECT_EQ(r["batch_streamed"][i]["finish_reason"], alone["choices"][0]["finish_reason"]);
    }
  }
  EXPECT_EQ(r["batch"]["usage"]["prompt_tokens"], prompt_tokens);
  EXPECT_EQ(r["batch"]["usage"]["completion_tokens"], completion_tokens);
  for (const char* field : {"prompt_tokens", "completion_tokens"})  // cached_tokens: the batch above left its prompts
    EXPECT_EQ(r["batch_streamed_usage"][field], r["batch"]["usage"][field]) << field;

  for (const char* refused : {"too_many", "best_of_above_n", "mixed_batch", "second_prompt_bad"}) {
    SCOPED_TRACE(refused);
    EXPECT_EQ(r[refused]["status"], 400) << r[refused].dump();
  }
  EXPECT_EQ(r["best_of_above_n"]["error"]["param"], "best_of");
  EXPECT_EQ(r["second_prompt_bad"]["error"]["param"], "prompt");
  EXPECT_EQ(r["after"]["choices"].size(), 1u) << "the server answers after a refused batch";
}

TEST_F(OpenAIServer, BadRequestsGetOpenAIErrorsAndTheServerStaysUp) {
  const json r = check("errors");
  struct Expected {
    const char* name;
    int status;
    const char* param;
    const char* code;
  };
  const Expected cases[] = {
      {"messages_not_list", 400, "messages", nullptr},
      {"messages_empty", 400, "messages", nullptr},
      {"unknown_role", 400, "messages[0]", nullptr},
      {"temperature_string", 400, "temperature", nullptr},
      {"temperature_negative", 400, "temperature", nullptr},
      {"temperature_too_high", 400, "temperature", nullptr},
      {"top_p_zero", 400, "top_p", nullptr},
      {"top_p_above_one", 400, "top_p", nullptr},
      {"max_tokens_negative", 400, "max_tokens", nullptr},
      {"max_tokens_huge", 400, "max_tokens", "context_length_exceeded"},
      {"n_zero", 400, "n", nullptr},
      {"too_many_stops", 400, "stop", nullptr},
      {"top_logprobs_without_logprobs", 400, "top_logprobs", nullptr},
      {"unknown_model", 404, "model", "model_not_found"},
      {"bad_tool_choice", 400, "tool_choice", nullptr},
      {"stream_error", 400, "temperature", nullptr},
      {"completion_no_prompt", 400, "prompt", nullptr},
      {"completion_bad_token", 400, "prompt", nullptr},
      {"completion_batch_empty_prompt", 400, "prompt", nullptr},
  };
  for (const Expected& e : cases) {
    SCOPED_TRACE(e.name);
    const json& got = r[e.name];
    EXPECT_EQ(got["status"], e.status) << got.dump();
    ASSERT_TRUE(got["error"].is_object()) << got.dump();
    EXPECT_EQ(got["error"]["type"], "invalid_request_error");
    EXPECT_EQ(got["error"]["param"], e.param);
    EXPECT_EQ(got["error"]["code"], e.code ? json(e.code) : json(nullptr));
    EXPECT_FALSE(got["error"]["message"].get<std::string>().empty());
  }
  EXPECT_EQ(r["still_works"]["status"], 200);

  // What the SDK cannot send: broken JSON, broken UTF-8, oversized bodies, unknown routes and methods.
  auto expect_error = [&](const std::string& args, int status, const std::string& code = {}) {
    SCOPED_TRACE(args);
    const auto reply = test::curl(args);
    EXPECT_EQ(reply.status, status) << reply.body;
    const json body = json::parse(reply.body, nullptr, false);
    ASSERT_TRUE(body.is_object() && body.contains("error")) << reply.body;
    for (const char* field : {"message", "type", "param", "code"}) EXPECT_TRUE(body["error"].contains(field)) << field;
    if (!code.empty()) {
      EXPECT_EQ(body["error"]["code"], code);
    }
  };
  test::TempDir tmp;
  test::write_file(tmp.file("bad-utf8.json"), "{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe\"}]}");
  test::write_file(tmp.file("huge.json"), std::string(17 << 20, ' '));
  test::write_file(tmp.file("deep.json"), std::string(100000, '[') + std::string(100000, ']'));
  expect_error(url("/v1/chat/completions") + " -d '{\"messages\": [}'", 400);
  expect_error(url("/v1/chat/completions") + " -d '[1, 2]'", 400);
  expect_error(url("/v1/chat/completions") + " --data-binary @" + tmp.file("bad-utf8.json"), 400);
  expect_error(url("/v1/chat/completions") + " --data-binary @" + tmp.file("deep.json"), 400);
  expect_error(url("/v1/chat/completions") + " --data-binary @" + tmp.file("huge.json"), 413, "request_too_large");
  expect_error(url("/v1/no-such-route"), 404, "not_found");
  expect_error("-X DELETE " + url("/v1/chat/completions"), 405, "method_not_allowed");
  expect_error(url("/v1/models") + " -d '{}'", 405, "method_not_allowed");
  expect_error(url("/generate") + " -d '{\"prompt\": \"x\", \"temperature\": -1}'", 400);
  expect_error(url("/detokenize") + " -d '{\"tokens\": [-4]}'", 400);
  expect_error(url("/v1/chat/completions") +
                   " -d '{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"temperature\": 1e400}'",
               400);
  EXPECT_EQ(test::curl(url("/health")).status, 200);
}

// Framing and limits: a chunked body past --max-body-bytes (which cpp-httplib does not hold to it)
// gets 413 and is not read on; a POST with no length at all (which it would read until the client
// hung up) gets 411 at once; a length that is not a number, two framings at once, or a declared
// length past the limit are refused from the headers. `-m 10`: a reply that waits on a body fails
// here instead of after cpp-httplib's 30 s read timeout.
TEST_F(OpenAIServer, RequestFramingAndBodyLimits) {
  test::TempDir tmp;
  test::write_file(tmp.file("huge.json"), std::string(17 << 20, ' '));
  const std::string completions = "-m 10 " + url("/v1/completions");
  auto expect_error = [&](const std::string& args, int status, const std::string& code, const std::string& says) {
    SCOPED_TRACE(args);
    const auto reply = test::curl(args);
    EXPECT_EQ(reply.status, status) << reply.body;
    const json body = json::parse(reply.body, nullptr, false);
    ASSERT_TRUE(body.is_object() && body.contains("error")) << reply.body;
    EXPECT_EQ(body["error"]["code"], code.empty() ? json(nullptr) : json(code));
    EXPECT_THAT(body["error"]["message"].get<std::string>(), HasSubstr(says));
  };
  expect_error(completions + " -H 'Transfer-Encoding: chunked' --data-binary @" + tmp.file("huge.json"), 413,
               "request_too_large", "--max-body-bytes");
  expect_error(completions + " -X POST", 411, "length_required", "Content-Length");
  expect_error(completions + " -H 'Content-Length: 99999999999' --data-binary '{}'", 413, "request_too_large",
               "--max-body-bytes");
  expect_error(completions + " -H 'Content-Length: -5' --data-binary '{}'", 400, "", "Content-Length '-5'");
  expect_error(completions + " -H 'Content-Length: 2' -H 'Content-Length: 3' --data-binary '{}'", 400, "",
               "two different Content-Length");
  expect_error(completions + " -H 'Content-Length: 2' -H 'Transfer-Encoding: chunked' --data-binary '{}'", 400, "",
               "both Content-Length and Transfer-Encoding");
  expect_error(completions + " -H 'Transfer-Encoding: gzip' --data-binary '{}'", 501, "unsupported_transfer_encoding",
               "gzip");
  expect_error("-m 10 -H 'Transfer-Encoding: chunked' --data-binary @" + tmp.file("huge.json") + " " + url("/nowhere"),
               404, "not_found", "/nowhere");
  expect_error("-m 10 -X GET -d '{}' " + url("/v1/models"), 400, "", "takes no body");

  // A chunked body within the limit is read as any other; after a refused body (unread, the
  // connection closed) the next request is answered from its own start.
  const std::string ok = test::shell_quote(R"({"prompt": "Hello", "max_tokens": 2})");
  const auto chunked = test::curl(completions + " -H 'Transfer-Encoding: chunked' -d " + ok);
  EXPECT_EQ(chunked.status, 200) << chunked.body;
  EXPECT_EQ(chunked.json()["usage"]["completion_tokens"], 2);
  const auto after = test::curl("-m 10 -X PUT -d " + ok + " " + url("/v1/completions") +
                                " --next -s -m 10 -w '\\n%{http_code}' -d " + ok + " " + url("/v1/completions"));
  EXPECT_EQ(after.status, 200) << after.body;  // the second reply's status (the first's is 405)
  EXPECT_THAT(after.body, HasSubstr("method_not_allowed"));
  EXPECT_EQ(test::curl(url("/health")).status, 200);
}

// logit_bias moves greedy output (a +100 bias makes one token every token); ids outside the
// vocabulary and biases outside [-100, 100] are refused, as are response formats other than text,
// json_object and json_schema, and schemas the output cannot be held to.
TEST_F(OpenAIServer, LogitBiasAppliesAndUnsupportedResponseFormatsAreRefused) {
  auto post = [&](const json& body) { return test::curl(url("/v1/completions") + " -d " + test::shell_quote(body.dump())); };
  const json base = {{"prompt", "Hello"}, {"max_tokens", 4}, {"temperature", 0}};
  const auto plain = post(base);
  ASSERT_EQ(plain.status, 200) << plain.body;
  const int32_t forced = 1000;
  json biased = base;
  biased["logit_bias"] = {{std::to_string(forced), 100}};
  const auto reply = post(biased);
  ASSERT_EQ(reply.status, 200) << reply.body;
  const auto forced_text = test::curl(url("/detokenize") + " -d " +
                                     test::shell_quote(json{{"tokens", {forced, forced, forced, forced}}}.dump()));
  ASSERT_EQ(forced_text.status, 200) << forced_text.body;
  EXPECT_EQ(reply.json()["choices"][0]["text"], forced_text.json()["prompt"]);
  EXPECT_NE(plain.json()["choices"][0]["text"], reply.json()["choices"][0]["text"]);

  auto expect_refused = [&](const char* field, const json& value) {
    SCOPED_TRACE(std::string(field) + ": " + value.dump());
    json body = base;
    body[field] = value;
    const auto refused = post(body);
    EXPECT_EQ(refused.status, 400) << refused.body;
    EXPECT_EQ(refused.json()["error"]["param"], field);
  };
  for (const json& bad : {json{{"1000", 101}}, json{{"x", 1}}, json{{"-3", 1}}, json{{"262144", 1}}, json::array({1})})
    expect_refused("logit_bias", bad);
  for (const json& format : {json{{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", {{"not", json::object()}}}}}},
                             json("json"), json{{"type", "yaml"}}})
    expect_refused("response_format", format);
  json neutral = base;
  neutral["logit_bias"] = json::object();
  neutral["response_format"] = {{"type", "text"}};
  const auto same = post(neutral);
  EXPECT_EQ(same.status, 200) << same.body;
  EXPECT_EQ(same.json()["choices"][0]["text"], plain.json()["choices"][0]["text"]);

  // min_tokens (vLLM's): a bias that makes the end of turn the best token ends the answer at once;
  // with min_tokens 3 the stop tokens wait three tokens, and no stop string cuts before then.
  const auto turn_end = test::curl(url("/tokenize") + " -d " + test::shell_quote(json{{"prompt", "<turn|>"}}.dump()));
  ASSERT_EQ(turn_end.status, 200) << turn_end.body;
  json ending = base;
  ending["max_tokens"] = 8;
  ending["logit_bias"] = {{std::to_string(turn_end.json()["tokens"].back().get<int>()), 100}};
  const auto at_once = post(ending);
  ASSERT_EQ(at_once.status, 200) << at_once.body;
  EXPECT_EQ(at_once.json()["usage"]["completion_tokens"], 1) << "the stop token, counted as vLLM counts it";
  EXPECT_EQ(at_once.json()["choices"][0]["text"], "");
  ending["min_tokens"] = 3;
  const auto after_three = post(ending);
  ASSERT_EQ(after_three.status, 200) << after_three.body;
  EXPECT_EQ(after_three.json()["usage"]["completion_tokens"], 4);
  EXPECT_EQ(after_three.json()["choices"][0]["finish_reason"], "stop");
  expect_refused("min_tokens", 9);
}

// 16 simultaneous streams, a third of them aborted mid-stream: the rest finish, each equal to the same
// request run alone (greedy), and afterwards nothing is running and the KV cache is empty.
TEST_F(OpenAIServer, ConcurrentStreamsWithCancellations) {
  const json r = check("concurrency");
  std::map<int, json> alone;
  for (const json& a : r["alone"]) alone[a["index"].get<int>()] = a;
  int cancelled = 0, finished = 0;
  for (const json& t : r["together"]) {
    const int index = t["index"];
    SCOPED_TRACE("request " + std::to_string(index));
    if (t["cancelled"].get<bool>()) {
      ++cancelled;
      EXPECT_TRUE(t["finish_reason"].is_null()) << "aborted after 3 chunks, before its end";
      continue;
    }
    ++finished;
    ASSERT_TRUE(alone.count(index));
    EXPECT_EQ(t["content"], alone[index]["content"]) << "batched greedy output differs from the request alone";
    EXPECT_EQ(t["finish_reason"], alone[index]["finish_reason"]);
    EXPECT_EQ(token_counts(t["usage"]), token_counts(alone[index]["usage"]));
  }
  EXPECT_EQ(cancelled, 6);
  EXPECT_EQ(finished, 10);
  EXPECT_GE(r["aborted"].get<double>(), 6.0);
  EXPECT_EQ(r["running"], 0);
  EXPECT_EQ(r["waiting"], 0);
  EXPECT_EQ(r["kv_usage"], 0) << "the KV blocks of finished and cancelled requests must all be free";
  EXPECT_THAT(server_.log(), HasSubstr("finish=client_disconnected"));
}

}  // namespace
}  // namespace tandem
