#pragma once
// Helpers for the server tests: the demo-preset model with the real (Gemma 4) tokenizer, a
// `tandem serve` process on a free loopback port, and clients (curl, the OpenAI Node SDK).
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "support/test_support.h"

namespace tandem::test {

// (The models and tokenizers the tests use come from support/test_support.h.)

// `tandem serve` in a child process, on a free port chosen by the server (--port 0).
class ServerProcess {
 public:
  ServerProcess() = default;
  ~ServerProcess();
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  // Starts the server and waits (up to `timeout_s`) until GET /health answers 200. Throws with the
  // server's stderr on failure.
  // `launcher` (e.g. {"mpirun", "-np", "2"}) goes before the tandem command line.
  void start(const std::string& model_dir, const std::vector<std::string>& extra_args, double timeout_s = 120,
             const std::vector<std::string>& launcher = {});
  // Sends `signal` and waits for the exit; returns the exit status (128 + signal when killed).
  int stop(int signal, double timeout_s = 60);
  bool running() const { return pid_ > 0; }

  int port() const { return port_; }
  std::string base_url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::string log() const;  // the server's stderr so far
  int pid() const { return pid_; }

 private:
  TempDir dir_;
  int pid_ = -1;
  int port_ = 0;
};

// curl with `args` (URL included); returns {status code, body}.
struct HttpReply {
  int status = 0;
  std::string body;
  nlohmann::json json() const;
};
HttpReply curl(const std::string& args);

// Runs `node tests/js/server_client.mjs CHECK BASE_URL MODEL [EXTRA...]` and parses the JSON it
// prints. Throws with the script's output when it fails.
nlohmann::json run_client_check(const std::string& check, const ServerProcess& server, const std::string& model,
                                const std::string& extra = "");

}  // namespace tandem::test
