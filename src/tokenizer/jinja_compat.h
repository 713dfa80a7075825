#pragma once
// The few Python/Jinja2 behaviours whose effect shows in what the Gemma 4 chat template renders:
// truthiness, `x['key']` on anything, `| trim`, `| upper`, `| dictsort`, and how `{{ value }}` prints
// a number or a container. Where Python Jinja2 and @huggingface/jinja disagree we follow Python,
// the engine transformers and vLLM render with (docs/chat-format.md, "Choices").
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tandem::jinja {

// `value[key]`: the member when `value` is an object that has it, else nullptr (Jinja's Undefined).
const nlohmann::json* lookup(const nlohmann::json* value, std::string_view key);
const nlohmann::json* lookup(const nlohmann::json& value, std::string_view key);

// Python truthiness; nullptr (Undefined) is false.
bool truthy(const nlohmann::json* value);

// str.strip(): removes the characters for which str.isspace() holds, from both ends.
std::string trim(std::string_view text);

// `value | upper`: str(value).upper(), "" for Undefined (ASCII letters only are upper-cased).
std::string upper(const nlohmann::json* value);

// str(value) as Python prints the value json.loads gives: strings as they are, True/False/None,
// floats as repr() does (1e-05, 1e+16, 2.0), lists and dicts as Python's repr of them.
std::string python_str(const nlohmann::json& value);
std::string python_float_repr(double value);

// `object | dictsort`: members ordered by key lower-cased, comparing code points.
std::vector<std::pair<const std::string*, const nlohmann::json*>> dictsort(const nlohmann::json& object);

}  // namespace tandem::jinja
