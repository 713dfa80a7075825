#include "server/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <memory>
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

bool equal_ignoring_case(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

// A Content-Length value: decimal digits only (no sign, no spaces), at most 18 of them.
std::optional<uint64_t> parse_content_length(const std::string& value) {
  if (value.empty() || value.size() > 18) return std::nullopt;
  uint64_t n = 0;
  for (const char c : value) {
    if (c < '0' || c > '9') return std::nullopt;
    n = n * 10 + uint64_t(c - '0');
  }
  return n;
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
  int listen_socket = -1;               // the socket bind_to_port bound, until the listener owns it

  explicit Impl(HttpServerOptions o) : options(std::move(o)) {}

  void check_api_key(const httplib::Request& req) const {
    if (options.api_key.empty()) return;
    // "Bearer KEY", the scheme in any case (RFC 9110 11.1).
    const std::string auth = req.get_header_value("Authorization");
    const size_t space = auth.find(' ');
    const bool bearer = space == 6 && equal_ignoring_case(std::string_view(auth).substr(0, 6), "bearer");
    const size_t token = bearer ? auth.find_first_not_of(' ', space) : std::string::npos;
    if (token != std::string::npos && same_secret(auth.substr(token), options.api_key)) return;
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

  // Every route runs through here: readiness, and errors turned into OpenAI bodies.
  void serve(const Route& route, const std::string& body, const httplib::Request& req, httplib::Response& res) {
    try {
      const std::string path = route.pattern;  // the API key was checked before the body was read
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

  // A refusal after which the connection closes: the body (or what is left of it) is never read,
  // so it can never be taken for the next request (request smuggling, behind a proxy), and a client
  // that sends an endless body holds no thread. cpp-httplib 0.11 keeps a connection while its writes
  // succeed; a body provider that writes the whole answer and then returns false ends it.
  // `with_length`: cpp-httplib's answer to `Expect: 100-continue` goes out without one otherwise.
  static void refuse_and_close(httplib::Response& res, const ApiError& e, bool with_length = false) {
    res.status = e.status;
    auto text = std::make_shared<const std::string>(json_text(e.body()));
    if (with_length) res.set_header("Content-Length", std::to_string(text->size()));
    res.set_header("Connection", "close");
    res.set_content_provider(text->size(), "application/json",
                             [text](size_t offset, size_t, httplib::DataSink& sink) {
                               sink.write(text->data() + offset, text->size() - offset);
                               return false;  // all of it is out: end the connection
                             });
  }

  // Every request with a body comes through here. A POST to a route reads it, at most
  // --max-body-bytes (cpp-httplib holds a chunked body to no limit: a 1 GB upload grew a server
  // from 0.5 to 4.5 GB). A refused body (a wrong key, no route, a wrong method, past the limit) is
  // read on and dropped up to linger_bytes() before the answer, and the connection closes: closing
  // on unread bytes makes the kernel reset the connection, which can reach a client still sending
  // before it has read the answer (nginx's "lingering close" for the same reason).
  // POST bodies are read here rather than by cpp-httplib, which would refuse bodies over 8 KiB sent
  // as application/x-www-form-urlencoded (what `curl -d` sends) and parse them as forms.
  httplib::Server::HandlerWithContentReader body_handler(std::optional<Route> route, const char* allowed) {
    return [this, route, allowed](const httplib::Request& req, httplib::Response& res,
                                  const httplib::ContentReader& content_reader) {
      std::optional<ApiError> refusal = refusal_from_headers(req);  // the key; framing was settled before
      if (!refusal && !route) refusal = no_route(req);
      if (!refusal && allowed) {
        res.set_header("Allow", allowed);
        refusal = method_not_allowed(req, allowed);
      }
      if (!refusal && req.is_multipart_form_data())
        return refuse_and_close(res, invalid_request({}, "the request body must be JSON, not multipart/form-data"));
      std::string body;
      size_t received = 0;
      const bool read = content_reader([&](const char* data, size_t size) {
        received += size;
        if (!refusal && received <= options.max_body_bytes) body.append(data, size);
        return received <= (refusal || received > options.max_body_bytes ? linger_bytes() : options.max_body_bytes);
      });
      if (refusal) return refuse_and_close(res, *refusal);
      if (received > options.max_body_bytes) return refuse_and_close(res, body_too_large());
      if (!read)  // a broken chunked or compressed body, or the client gone
        return refuse_and_close(res, invalid_request({}, "the request body could not be read to its end"));
      serve(*route, body, req, res);
    };
  }

  // How much of a refused body is read and dropped before the connection closes.
  size_t linger_bytes() const { return std::max<size_t>(4 * options.max_body_bytes, size_t(64) << 20); }

  ApiError body_too_large() const {
    return ApiError(413, "invalid_request_error",
                    fmt::format("the request body is larger than the server's limit of {} bytes (--max-body-bytes)",
                                options.max_body_bytes),
                    {}, "request_too_large");
  }

  static ApiError no_route(const httplib::Request& req) {
    return ApiError(404, "invalid_request_error",
                    fmt::format("no route {} {} (see docs/server.md for the routes)", req.method, req.path), {},
                    "not_found");
  }

  static ApiError method_not_allowed(const httplib::Request& req, const char* allowed) {
    return ApiError(405, "invalid_request_error",
                    fmt::format("{} does not take {} (use {})", req.path, req.method, allowed), {},
                    "method_not_allowed");
  }

  // What the request line and headers settle, whatever a body holds: framing that RFC 9112 6.1-6.3
  // tells a server to refuse, a declared length over the limit, and a missing or wrong API key.
  std::optional<ApiError> refusal_from_headers(const httplib::Request& req) const {
    if (req.method == "PRI") return invalid_request({}, "HTTP/2 is not served (use HTTP/1.1)");
    const size_t encodings = req.get_header_value_count("Transfer-Encoding");
    const size_t length_headers = req.get_header_value_count("Content-Length");
    const std::string te = req.get_header_value("Transfer-Encoding");
    if (encodings > 1 || (encodings == 1 && !equal_ignoring_case(te, "chunked")))
      return ApiError(501, "invalid_request_error",
                      fmt::format("Transfer-Encoding '{}' is not supported (only chunked)", te), {},
                      "unsupported_transfer_encoding");
    if (encodings > 0 && length_headers > 0)
      return invalid_request({}, "a request may not have both Content-Length and Transfer-Encoding");
    for (size_t i = 1; i < length_headers; ++i)
      if (req.get_header_value("Content-Length", i) != req.get_header_value("Content-Length", 0))
        return invalid_request({}, "the request has two different Content-Length headers");
    if (length_headers > 0) {
      const std::string length = req.get_header_value("Content-Length");
      const std::optional<uint64_t> n = parse_content_length(length);
      if (!n) return invalid_request({}, fmt::format("Content-Length '{}' is not a length", length));
      if (*n > options.max_body_bytes) return body_too_large();
    }
    if (req.path != "/health") {
      try {
        check_api_key(req);  // strangers learn nothing about the routes
      } catch (const ApiError& e) {
        return e;
      }
    }
    return std::nullopt;
  }

  // CORS (--allowed-origins): the origin to name in Access-Control-Allow-Origin, if this request's
  // Origin may read the answer.
  std::optional<std::string> allowed_origin(const httplib::Request& req) const {
    if (!req.has_header("Origin")) return std::nullopt;
    const std::string origin = req.get_header_value("Origin");
    for (const std::string& allowed : options.allowed_origins)
      if (allowed == "*" || allowed == origin) return allowed == "*" ? std::string("*") : origin;
    return std::nullopt;
  }

  // A browser's preflight (OPTIONS with Access-Control-Request-Method) from an allowed origin is
  // answered before the API key is checked: browsers send it without credentials. Every answer to an
  // allowed origin carries Access-Control-Allow-Origin. Returns true when the request is answered.
  bool answered_cors(const httplib::Request& req, httplib::Response& res) const {
    const std::optional<std::string> origin = allowed_origin(req);
    if (!origin) return false;
    res.set_header("Access-Control-Allow-Origin", *origin);
    if (*origin != "*") res.set_header("Vary", "Origin");
    if (req.method != "OPTIONS" || !req.has_header("Access-Control-Request-Method")) return false;
    res.status = 204;
    res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    const std::string asked = req.get_header_value("Access-Control-Request-Headers");
    res.set_header("Access-Control-Allow-Headers", asked.empty() ? "Authorization, Content-Type" : asked);
    res.set_header("Access-Control-Max-Age", "600");
    return true;
  }

  // The pre-routing handler: what the headers settle is answered before any body is read (with the
  // connection closed where a body follows). cpp-httplib would otherwise read a POST with neither
  // length header until the client hung up (a bare `curl -X POST` waited 30 s), skip a declared
  // length over the limit to its end, and leave the body of a GET unread on the connection.
  bool answered_from_headers(const httplib::Request& req, httplib::Response& res) const {
    const bool chunked = req.has_header("Transfer-Encoding");
    const std::string length = req.get_header_value("Content-Length");
    const bool body_follows = chunked || (req.has_header("Content-Length") && length != "0");
    if (const std::optional<ApiError> refusal = refusal_from_headers(req)) {
      // A wrong key on a body cpp-httplib can read: body_handler reads it on before answering.
      const bool readable = req.method == "POST" || req.method == "PUT" || req.method == "PATCH" ||
                            (req.method == "DELETE" && req.has_header("Content-Length"));
      if (body_follows && readable && refusal->status == 401) return false;
      if (body_follows) refuse_and_close(res, *refusal);
      else send_error(res, *refusal);
      return true;
    }
    const bool takes_body = req.method == "POST" || req.method == "PUT" || req.method == "PATCH";
    if (takes_body && !body_follows && !req.has_header("Content-Length")) {
      send_error(res, ApiError(411, "invalid_request_error",
                               fmt::format("a {} request needs a body with Content-Length (or Transfer-Encoding: "
                                           "chunked)",
                                           req.method),
                               {}, "length_required"));
      return true;
    }
    if (body_follows && !takes_body && req.method != "DELETE") {  // cpp-httplib would not read it
      refuse_and_close(res, invalid_request({}, fmt::format("a {} request takes no body", req.method)));
      return true;
    }
    return false;
  }

  // `Expect: 100-continue`: a refusal the headers settle goes out instead of 100, so the client
  // need not send the body (curl asks for bodies over 1 MB and chunked ones).
  int expect_continue(const httplib::Request& req, httplib::Response& res) const {
    const std::optional<ApiError> refusal = refusal_from_headers(req);
    if (!refusal) return 100;
    refuse_and_close(res, *refusal, /*with_length=*/true);
    return refusal->status;
  }

  httplib::Server::Handler refuse_method(const char* allowed) {
    return [allowed](const httplib::Request& req, httplib::Response& res) {
      res.set_header("Allow", allowed);
      send_error(res, method_not_allowed(req, allowed));
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
      const char* allowed = get ? "GET, HEAD" : "POST";
      if (get) http.Get(route.pattern, get_handler(route));
      else http.Post(route.pattern, body_handler(route, nullptr));
      // Other methods on a known path get 405 (with a body: unread, the connection closed).
      if (get) http.Post(route.pattern, body_handler(route, allowed));
      else http.Get(route.pattern, refuse_method(allowed));
      http.Put(route.pattern, body_handler(route, allowed));
      http.Patch(route.pattern, body_handler(route, allowed));
      http.Delete(route.pattern, body_handler(route, allowed));
      http.Options(route.pattern, refuse_method(allowed));
    }
    // Bodies sent to no route are refused unread too, not read into memory by cpp-httplib.
    // ([\s\S]: a decoded path may hold a line break, which `.` would not match.)
    http.Post(R"([\s\S]*)", body_handler(std::nullopt, nullptr));
    http.Put(R"([\s\S]*)", body_handler(std::nullopt, nullptr));
    http.Patch(R"([\s\S]*)", body_handler(std::nullopt, nullptr));
    http.Delete(R"([\s\S]*)", body_handler(std::nullopt, nullptr));

    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      request_log_begin();
      return answered_cors(req, res) || answered_from_headers(req, res) ? httplib::Server::HandlerResponse::Handled
                                                                        : httplib::Server::HandlerResponse::Unhandled;
    });
    http.set_expect_100_continue_handler(
        [this](const httplib::Request& req, httplib::Response& res) { return expect_continue(req, res); });
    // Statuses cpp-httplib sets itself (no route, body too large, malformed request) get an OpenAI body.
    http.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req,
                                                                       httplib::Response& res) {
      if (!res.body.empty() || res.content_provider_) return httplib::Server::HandlerResponse::Unhandled;
      std::string message = fmt::format("HTTP {}", res.status);
      std::string code;
      if (res.status == 404) {
        const ApiError e = no_route(req);
        message = e.what();
        code = e.code;
      } else if (res.status == 413) {
        const ApiError e = body_too_large();
        message = e.what();
        code = e.code;
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
  // cpp-httplib's own options set SO_REUSEPORT, with which a second server binds a port this one
  // serves and the kernel hands it part of the connections: a server started twice, or an old
  // version beside a new one, would answer at random. SO_REUSEADDR alone still lets a restarted
  // server bind at once over the last one's closing connections.
  s.http.set_socket_options([&s](int socket) {
    const int yes = 1;
    setsockopt(socket, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    s.listen_socket = socket;
  });
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
  // cpp-httplib 0.11 listens with a backlog of 5, and a burst of new connections beyond what its
  // accept loop takes at once would wait on TCP's SYN retries (a second and more). Listening again
  // only sets the queue's length, up to net.core.somaxconn.
  if (::listen(s.listen_socket, SOMAXCONN) != 0) fail("cannot listen on {}:{}", s.options.host, port);
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
