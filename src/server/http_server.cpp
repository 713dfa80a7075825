#include "server/http_server.h"

#include <httplib.h>

#include <fmt/format.h>

#include <atomic>
#include <optional>
#include <thread>

#include "core/error.h"
#include "server/api_error.h"
#include "server/metrics.h"
#include "server/openai_format.h"
#include "server/request_log.h"
#include "server/route_context.h"
#include "server/routes.h"

namespace tandem::server {

using nlohmann::json;

namespace {

using RouteHandler = void (*)(const RouteContext&, const std::string&, const httplib::Request&, httplib::Response&);

struct Route {
  const char* pattern;   // a regular expression over the path
  const char* method;    // GET or POST
  RouteHandler handler;  // null: served by the server itself (health, metrics)
};

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(json_text(e.body()), "application/json");
}

// Compares without an early exit, so response timing does not reveal how much of a key matched.
bool same_secret(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i % std::max<size_t>(1, b.size())]);
  return diff == 0;
}

}  // namespace

struct HttpServer::Impl {
  HttpServerOptions options;
  httplib::Server http;
  std::thread listener;
  std::atomic<bool> ready{false};
  std::unique_ptr<ServedModel> model;
  std::unique_ptr<ServerMetrics> metrics;
  ActiveGenerations active;
  std::optional<RouteContext> context;  // set with the model

  explicit Impl(HttpServerOptions o) : options(std::move(o)) {}

  void check_api_key(const httplib::Request& req) const {
    if (options.api_key.empty()) return;
    if (same_secret(req.get_header_value("Authorization"), "Bearer " + options.api_key)) return;
    throw ApiError(401, "invalid_request_error",
                   req.has_header("Authorization") ? "incorrect API key provided"
                                                   : "missing API key: send 'Authorization: Bearer KEY'",
                   {}, "invalid_api_key");
  }

  const RouteContext& ready_context() const {
    if (!ready.load(std::memory_order_acquire))
      throw ApiError(503, "server_error", "the model is still loading; retry when GET /health answers 200", {},
                     "model_loading");
    return *context;
  }

  void health(httplib::Response& res) const {
    const char* status = !ready.load(std::memory_order_acquire) ? "loading"
                         : active.draining()                     ? "shutting_down"
                                                                 : "ok";
    res.status = std::string(status) == "ok" ? 200 : 503;
    res.set_content(json_text({{"status", status}}), "application/json");
  }

  void serve_metrics(httplib::Response& res) const {
    const RouteContext& c = ready_context();
    res.set_content(c.metrics.render(c.model.engine.stats()), "text/plain; version=0.0.4; charset=utf-8");
  }

  // Every route runs through here: authentication, readiness, and errors turned into OpenAI bodies.
  void serve(const Route& route, const std::string& body, const httplib::Request& req, httplib::Response& res) {
    try {
      const std::string path = route.pattern;
      if (path != "/health") check_api_key(req);
      if (path == "/health") return health(res);
      if (path == "/metrics") return serve_metrics(res);
      route.handler(ready_context(), body, req, res);
    } catch (const ApiError& e) {
      send_error(res, e);
    } catch (const Error& e) {
      // Errors of lower layers on request input (a tokenizer or template refusal).
      send_error(res, invalid_request({}, e.what()));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tandem: %s %s failed: %s\n", req.method.c_str(), req.path.c_str(), e.what());
      send_error(res, ApiError(500, "server_error", std::string("internal error: ") + e.what()));
    }
  }

  httplib::Server::Handler get_handler(const Route& route) {
    return [this, route](const httplib::Request& req, httplib::Response& res) { serve(route, {}, req, res); };
  }

  // POST bodies are read here rather than by cpp-httplib, which would refuse bodies over 8 KiB sent
  // as application/x-www-form-urlencoded (what `curl -d` sends) and parse them as forms.
  httplib::Server::HandlerWithContentReader post_handler(const Route& route) {
    return [this, route](const httplib::Request& req, httplib::Response& res,
                         const httplib::ContentReader& content_reader) {
      if (req.is_multipart_form_data()) {
        content_reader([](const httplib::MultipartFormData&) { return true; },
                       [](const char*, size_t) { return true; });
        return send_error(res, invalid_request({}, "the request body must be JSON, not multipart/form-data"));
      }
      std::string body;
      // On failure (too large: 413, or a broken upload: 400) cpp-httplib has set the status.
      if (!content_reader([&](const char* data, size_t size) {
            body.append(data, size);
            return true;
          }))
        return;
      serve(route, body, req, res);
    };
  }

  httplib::Server::Handler method_not_allowed(const char* allowed) {
    return [this, allowed](const httplib::Request& req, httplib::Response& res) {
      if (req.path != "/health") {
        try {
          check_api_key(req);  // strangers learn nothing about the routes
        } catch (const ApiError& e) {
          return send_error(res, e);
        }
      }
      res.set_header("Allow", allowed);
      send_error(res, ApiError(405, "invalid_request_error",
                               fmt::format("{} does not take {} (use {})", req.path, req.method, allowed), {},
                               "method_not_allowed"));
    };
  }

  void install_routes() {
    static const Route routes[] = {
        {"/v1/chat/completions", "POST", handle_chat_completions},
        {"/v1/completions", "POST", handle_completions},
        {"/generate", "POST", handle_generate},
        {"/tokenize", "POST", handle_tokenize},
        {"/detokenize", "POST", handle_detokenize},
        {"/v1/models", "GET", handle_models},
        {"/v1/models/(.+)", "GET", handle_models},
        {"/health", "GET", nullptr},
        {"/metrics", "GET", nullptr},
    };
    for (const Route& route : routes) {
      const bool get = std::string(route.method) == "GET";
      if (get) http.Get(route.pattern, get_handler(route));
      else http.Post(route.pattern, post_handler(route));
      // Other methods on a known path get 405, after cpp-httplib has read their body (so that a
      // keep-alive connection stays in step).
      auto refuse = method_not_allowed(get ? "GET, HEAD" : "POST");
      if (get) http.Post(route.pattern, refuse);
      else http.Get(route.pattern, refuse);
      http.Put(route.pattern, refuse);
      http.Patch(route.pattern, refuse);
      http.Delete(route.pattern, refuse);
      http.Options(route.pattern, refuse);
    }

    http.set_pre_routing_handler([](const httplib::Request&, httplib::Response&) {
      request_log_begin();
      return httplib::Server::HandlerResponse::Unhandled;
    });
    // Statuses cpp-httplib sets itself (no route, body too large, malformed request) get an OpenAI body.
    http.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req,
                                                                       httplib::Response& res) {
      if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
      std::string message = fmt::format("HTTP {}", res.status);
      std::string code;
      if (res.status == 404) {
        message = fmt::format("no route {} {} (see docs/server.md for the routes)", req.method, req.path);
        code = "not_found";
      } else if (res.status == 413) {
        message = fmt::format("the request body is larger than the server's limit of {} bytes (--max-body-bytes)",
                              options.max_body_bytes);
        code = "request_too_large";
      } else if (res.status == 400) {
        message = "malformed HTTP request";
      }
      res.set_content(json_text(error_body(res.status, message, code)), "application/json");
      return httplib::Server::HandlerResponse::Handled;
    }));
    http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
      send_error(res, ApiError(500, "server_error", "internal error"));
    });
    http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
      request_log_end(req.method, req.path, res.status, options.log_requests);
    });
  }
};

HttpServer::HttpServer(HttpServerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {
  Impl& s = *impl_;
  const int threads = std::max(4, s.options.connection_threads);
  s.http.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  s.http.set_payload_max_length(s.options.max_body_bytes);
  s.http.set_tcp_nodelay(true);  // stream tokens as they come, not when Nagle's algorithm says so
  s.http.set_keep_alive_max_count(1000);
  s.http.set_read_timeout(30);
  s.http.set_write_timeout(15);  // a client that stops reading for this long is treated as gone
  s.install_routes();
}

HttpServer::~HttpServer() { stop(); }

int HttpServer::start() {
  Impl& s = *impl_;
  int port = s.options.port;
  if (port == 0) {
    port = s.http.bind_to_any_port(s.options.host);
    if (port <= 0) fail("cannot listen on {} (any port)", s.options.host);
  } else if (!s.http.bind_to_port(s.options.host, port)) {
    fail("cannot listen on {}:{} (is the port in use, or the address not on this machine?)", s.options.host, port);
  }
  s.listener = std::thread([&s] { s.http.listen_after_bind(); });
  return port;
}

void HttpServer::set_model(std::unique_ptr<ServedModel> model) {
  Impl& s = *impl_;
  s.model = std::move(model);
  s.metrics = std::make_unique<ServerMetrics>(s.model->name);
  s.context.emplace(RouteContext{*s.model, *s.metrics, s.active});
  s.ready.store(true, std::memory_order_release);
}

int HttpServer::drain(std::chrono::milliseconds grace) {
  impl_->active.start_draining();
  impl_->active.wait_idle(std::chrono::steady_clock::now() + grace);
  return impl_->active.count();
}

void HttpServer::interrupt_drain() { impl_->active.wake(); }

void HttpServer::stop() {
  Impl& s = *impl_;
  if (!s.listener.joinable()) return;
  // stop() only acts on a running server; the listener thread may not have got that far yet.
  for (int i = 0; i < 2000 && !s.http.is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  s.http.stop();
  s.listener.join();
}

}  // namespace tandem::server
