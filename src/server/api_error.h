#pragma once
// The errors the HTTP API reports, in OpenAI's shape:
//   {"error": {"message": "...", "type": "invalid_request_error", "param": "temperature", "code": null}}
// Request handling throws ApiError; the HTTP layer turns it into the status and body. `param` names
// the offending request field so that a client can tell what to fix.
#include <nlohmann/json.hpp>

#include <stdexcept>
#include <string>

namespace tandem::server {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string type, std::string message, std::string param = {}, std::string code = {})
      : std::runtime_error(message), status(status), type(std::move(type)), param(std::move(param)),
        code(std::move(code)) {}

  int status;
  std::string type;
  std::string param;  // empty: none
  std::string code;   // empty: none

  nlohmann::json body() const;
};

// 400 invalid_request_error naming `param`.
ApiError invalid_request(const std::string& param, const std::string& message, const std::string& code = {});
// 400 context_length_exceeded naming `param`.
ApiError context_length_exceeded(const std::string& param, const std::string& message);

// The OpenAI error body for a status the HTTP layer produces itself (404, 405, 413, ...).
nlohmann::json error_body(int status, const std::string& message, const std::string& code = {});
const char* error_type_for_status(int status);

}  // namespace tandem::server
