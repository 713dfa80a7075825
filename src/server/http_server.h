#pragma once
// Tandem's HTTP server: OpenAI-compatible routes over cpp-httplib. It listens before the model is
// loaded (GET /health answers 503 "loading" until set_model), serves each connection on a pool
// thread, and shuts down gracefully: drain() refuses new generations and waits for open ones,
// stop() closes the listener and waits for the connection threads. docs/server.md describes the API.
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "server/served_model.h"

namespace tandem::server {

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                       // 0: any free port (start() returns it)
  std::string api_key;                   // when set, every route but /health wants "Bearer KEY"
  size_t max_body_bytes = size_t(16) << 20;
  int connection_threads = 64;           // concurrent connections served (each stream holds one)
  bool log_requests = true;              // one line per request on stderr
  // Browser origins allowed to call the API (CORS), e.g. "https://chat.example.com", or "*" for any.
  // Empty: no CORS headers, so pages on other origins cannot read the answers.
  std::vector<std::string> allowed_origins;
};

class HttpServer {
 public:
  explicit HttpServer(HttpServerOptions options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and serves on a background thread; returns the port. Throws Error when it cannot bind.
  int start();
  // The model is loaded: generation routes open and /health turns 200. Call once.
  void set_model(std::unique_ptr<ServedModel> model);
  // Refuses new generations (503) and waits for the open ones until `grace` passes or
  // interrupt_drain() is called. Returns the number still open.
  int drain(std::chrono::milliseconds grace);
  void interrupt_drain();
  // Closes the listener and waits for every connection thread. Idempotent.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::server
