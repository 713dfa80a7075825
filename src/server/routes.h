#pragma once
// The HTTP routes that need the model. Each reads the request body (already read whole by the HTTP
// layer), throws ApiError for bad input, and fills the response (for generations, a body written as
// tokens arrive).
#include <string>

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace tandem::server {

struct RouteContext;

// Arguments: the context, the request body, the request (path matches, headers), the response.
void handle_chat_completions(const RouteContext&, const std::string&, const httplib::Request&, httplib::Response&);
void handle_completions(const RouteContext&, const std::string&, const httplib::Request&, httplib::Response&);
void handle_generate(const RouteContext&, const std::string&, const httplib::Request&, httplib::Response&);
void handle_tokenize(const RouteContext&, const std::string&, const httplib::Request&, httplib::Response&);
void handle_detokenize(const RouteContext&, const std::string&, const httplib::Request&, httplib::Response&);
void handle_models(const RouteContext&, const std::string&, const httplib::Request&, httplib::Response&);

}  // namespace tandem::server
