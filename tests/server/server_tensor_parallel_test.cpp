// `tandem serve` under mpirun: rank 0 serves HTTP and runs the engine, rank 1 follows its step
// plans. Greedy answers and log-probabilities equal the single-rank server's, concurrent requests
// work, and a signal to rank 0 shuts every rank down cleanly.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <future>
#include <sstream>

#include "server/server_fixture.h"

namespace tandem::test {
namespace {

using nlohmann::json;

std::string chat_body(const std::string& text, int max_tokens) {
  return json{{"messages", {{{"role", "user"}, {"content", text}}}}, {"max_tokens", max_tokens}, {"temperature", 0}}.dump();
}

std::string answer(const ServerProcess& server, const std::string& text, int max_tokens) {
  const HttpReply r = curl("-X POST " + server.base_url() + "/v1/chat/completions -H 'content-type: application/json' -d " +
                           shell_quote(chat_body(text, max_tokens)));
  EXPECT_EQ(r.status, 200) << r.body;
  return r.status == 200 ? r.json()["choices"][0]["message"]["content"].get<std::string>() : std::string();
}

// Greedy answers whose rows a bias or a penalty changes: under TP the ranks then send whole rows (any
// token may come first once they apply), so these match one rank's. A +100 bias on token 1000 makes it
// every answer token on one rank; with each rank's best logit alone it would never be seen.
std::vector<std::string> adjusted_answers(const ServerProcess& server, const std::string& text) {
  std::vector<std::string> out;
  for (const json& extra : {json{{"logit_bias", {{"1000", 100}}}}, json{{"repetition_penalty", 3.0}},
                            json{{"frequency_penalty", 1.5}, {"logit_bias", {{"1000", -100}}}}}) {
    json body = json::parse(chat_body(text, 6));
    body.update(extra);
    const HttpReply r = curl("-X POST " + server.base_url() +
                             "/v1/chat/completions -H 'content-type: application/json' -d " + shell_quote(body.dump()));
    EXPECT_EQ(r.status, 200) << r.body;
    out.push_back(r.status == 200 ? r.json()["choices"][0]["message"]["content"].get<std::string>() : std::string());
  }
  return out;
}

// The top_logprobs lists of a short greedy answer: under TP each rank sends its best candidates
// and the log-sum-exp of its slice, which rank 0 merges.
// n greedy choices of one prompt: the choices after the first start from a copy of its cache
// (KvOp::Copy, which every rank replays on its own shard).
std::vector<std::string> choices(const ServerProcess& server, const std::string& text, int n) {
  json body = json::parse(chat_body(text, 8));
  body["n"] = n;
  const HttpReply r = curl("-X POST " + server.base_url() + "/v1/chat/completions -H 'content-type: application/json' -d " +
                           shell_quote(body.dump()));
  EXPECT_EQ(r.status, 200) << r.body;
  std::vector<std::string> out;
  const json reply = r.status == 200 ? r.json() : json::object();
  for (const json& c : reply.value("choices", json::array())) out.push_back(c["message"]["content"].get<std::string>());
  EXPECT_EQ(out.size(), size_t(n)) << r.body;
  return out;
}

double prefix_cache_hits(const ServerProcess& server) {
  const std::string metrics = curl(server.base_url() + "/metrics").body;
  const size_t at = metrics.find("\nvllm:prefix_cache_hits_total{");
  if (at == std::string::npos) return -1;
  return std::stod(metrics.substr(metrics.find("} ", at) + 2));
}

json top_logprobs(const ServerProcess& server, const std::string& text) {
  json body = json::parse(chat_body(text, 4));
  body["logprobs"] = true;
  body["top_logprobs"] = 3;
  const HttpReply r = curl("-X POST " + server.base_url() + "/v1/chat/completions -H 'content-type: application/json' -d " +
                           shell_quote(body.dump()));
  EXPECT_EQ(r.status, 200) << r.body;
  return r.status == 200 ? r.json()["choices"][0]["logprobs"]["content"] : json::array();
}

// The echoed prompt's logprobs (completions, echo with logprobs and max_tokens 0).
json prompt_logprobs(const ServerProcess& server, const std::string& text) {
  const json body = {{"prompt", text}, {"echo", true}, {"logprobs", 2}, {"max_tokens", 0}};
  const HttpReply r = curl("-X POST " + server.base_url() + "/v1/completions -H 'content-type: application/json' -d " +
                           shell_quote(body.dump()));
  EXPECT_EQ(r.status, 200) << r.body;
  return r.status == 200 ? r.json()["choices"][0]["logprobs"] : json::object();
}

void expect_same_prompt_logprobs(const json& single, const json& tp) {
  EXPECT_EQ(single["tokens"], tp["tokens"]);
  ASSERT_EQ(single["token_logprobs"].size(), tp["token_logprobs"].size());
  ASSERT_GT(single["token_logprobs"].size(), 1u);
  for (size_t i = 1; i < single["token_logprobs"].size(); ++i)
    EXPECT_NEAR(single["token_logprobs"][i].get<double>(), tp["token_logprobs"][i].get<double>(), 1e-3) << i;
}

void expect_same_logprobs(const json& single, const json& tp) {
  ASSERT_EQ(single.size(), tp.size());
  for (size_t i = 0; i < single.size(); ++i) {
    EXPECT_EQ(single[i]["token"], tp[i]["token"]);
    EXPECT_NEAR(single[i]["logprob"].get<double>(), tp[i]["logprob"].get<double>(), 1e-3);
    ASSERT_EQ(single[i]["top_logprobs"].size(), 3u);
    ASSERT_EQ(tp[i]["top_logprobs"].size(), 3u);
    for (size_t k = 0; k < 3; ++k) {
      EXPECT_EQ(single[i]["top_logprobs"][k]["token"], tp[i]["top_logprobs"][k]["token"]) << i << " " << k;
      EXPECT_NEAR(single[i]["top_logprobs"][k]["logprob"].get<double>(),
                  tp[i]["top_logprobs"][k]["logprob"].get<double>(), 1e-3);
    }
  }
}

// The child of mpirun whose environment says OMPI_COMM_WORLD_RANK=0.
int rank_zero_pid(int mpirun_pid) {
  const CommandResult r = run("pgrep -P " + std::to_string(mpirun_pid));
  std::istringstream pids(r.out);
  for (int pid; pids >> pid;) {
    std::string env;
    try {
      env = read_file("/proc/" + std::to_string(pid) + "/environ");
    } catch (...) {
      continue;
    }
    if (env.find(std::string("OMPI_COMM_WORLD_RANK=0") + '\0') != std::string::npos) return pid;
  }
  return -1;
}

TEST(ServerTensorParallel, TwoRanksAnswerLikeOne) {
  if (run("command -v mpirun").exit_code != 0) GTEST_SKIP() << "mpirun not found (apt-get install openmpi-bin)";
  const std::string model = demo_model_with_tokenizer();
  if (model.empty()) GTEST_SKIP() << "the Gemma tokenizer is not available (npm unreachable)";
  const std::vector<std::string> prompts = {"Hello there", "Tell me about the sea, the sky and the mountains.", "1 2 3"};
  const std::string long_prompt =
      "Describe, in order, the rivers, lakes, mountains, forests, deserts and coasts of every continent you know, "
      "and say which of them you would visit first, and why.";

  std::vector<std::string> single;
  json single_logprobs;
  json single_prompt_logprobs;
  std::vector<std::string> single_adjusted;
  std::string single_long;
  {
    ServerProcess server;
    server.start(model, {"--threads", "1", "--kv-memory", "512MiB"});
    for (const auto& p : prompts) single.push_back(answer(server, p, 12));
    single_logprobs = top_logprobs(server, prompts[1]);
    single_prompt_logprobs = prompt_logprobs(server, prompts[1]);
    single_adjusted = adjusted_answers(server, prompts[0]);
    single_long = answer(server, long_prompt, 8);
    EXPECT_EQ(server.stop(SIGTERM), 0);
  }
  std::vector<std::string> launcher = {"mpirun", "--oversubscribe", "-np", "2"};
  if (::geteuid() == 0) launcher.push_back("--allow-run-as-root");
  ServerProcess server;
  server.start(model, {"--threads", "1", "--kv-memory", "512MiB"}, 180, launcher);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(answer(server, prompts[i], 12), single[i]) << prompts[i];
  expect_same_logprobs(single_logprobs, top_logprobs(server, prompts[1]));
  expect_same_prompt_logprobs(single_prompt_logprobs, prompt_logprobs(server, prompts[1]));
  EXPECT_EQ(adjusted_answers(server, prompts[0]), single_adjusted);
  const double hits_before = prefix_cache_hits(server);
  EXPECT_EQ(choices(server, long_prompt, 3), std::vector<std::string>(3, single_long));
  EXPECT_GE(prefix_cache_hits(server) - hits_before, 2 * 32) << "two choices copied the first one's prompt";
  // Concurrent requests are batched into the same steps on both ranks.
  std::vector<std::future<std::string>> together;
  for (const auto& p : prompts) together.push_back(std::async(std::launch::async, [&, p] { return answer(server, p, 12); }));
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(together[i].get(), single[i]) << prompts[i];
  // SIGTERM to rank 0 alone: it stops serving, tells the follower to shut down, and the whole job
  // (mpirun included) exits cleanly.
  const int rank0 = rank_zero_pid(server.pid());
  ASSERT_GT(rank0, 0);
  ::kill(rank0, SIGTERM);
  EXPECT_EQ(server.stop(0, 60), 0) << server.log();
  EXPECT_NE(server.log().find("tandem: stopped"), std::string::npos) << server.log();
}

}  // namespace
}  // namespace tandem::test
