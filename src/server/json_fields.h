#pragma once
// Reading a JSON request body field by field. Every getter names the field in the ApiError it
// throws, so "temperature must be a number, got a string" reaches the client with param
// "temperature". JSON null counts as absent, as in the OpenAI API.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace tandem::server {

// The body as a JSON object. Refuses (400) bodies that are not UTF-8, not JSON, nested deeper than
// `max_depth`, or not an object.
nlohmann::json parse_json_object_body(std::string_view body, int max_depth = 64);

// True when `text` is well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF);
// otherwise `bad_offset` gets the offset of the first bad byte.
bool is_valid_utf8(std::string_view text, size_t* bad_offset = nullptr);

// "a string", "an array", ... for messages.
std::string json_kind(const nlohmann::json& value);

std::optional<double> optional_number(const nlohmann::json& object, const char* name);
std::optional<int64_t> optional_integer(const nlohmann::json& object, const char* name);
std::optional<bool> optional_bool(const nlohmann::json& object, const char* name);
std::optional<std::string> optional_string(const nlohmann::json& object, const char* name);
// The field when it is present and not null (any type).
const nlohmann::json* optional_field(const nlohmann::json& object, const char* name);
// A field that must be an object when present; `param` is its full name for messages.
const nlohmann::json* optional_object(const nlohmann::json& object, const char* name, const std::string& param);

}  // namespace tandem::server
