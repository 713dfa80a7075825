#include "server/api_error.h"

namespace tandem::server {

namespace {
nlohmann::json string_or_null(const std::string& s) { return s.empty() ? nlohmann::json(nullptr) : nlohmann::json(s); }
}  // namespace

nlohmann::json ApiError::body() const {
  return {{"error",
           {{"message", what()}, {"type", type}, {"param", string_or_null(param)}, {"code", string_or_null(code)}}}};
}

ApiError invalid_request(const std::string& param, const std::string& message, const std::string& code) {
  return ApiError(400, "invalid_request_error", message, param, code);
}

ApiError context_length_exceeded(const std::string& param, const std::string& message) {
  return ApiError(400, "invalid_request_error", message, param, "context_length_exceeded");
}

// OpenAI itself answers 401 and 404 with invalid_request_error (and a code saying which).
const char* error_type_for_status(int status) {
  if (status == 429) return "rate_limit_error";
  return status >= 500 ? "server_error" : "invalid_request_error";
}

nlohmann::json error_body(int status, const std::string& message, const std::string& code) {
  return ApiError(status, error_type_for_status(status), message, {}, code).body();
}

}  // namespace tandem::server
