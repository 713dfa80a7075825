#include "server/chat_request.h"

#include <fmt/format.h>

#include "core/error.h"
#include "server/api_error.h"
#include "server/json_fields.h"
#include "tokenizer/chat_format.h"
#include "tokenizer/output_parser.h"

namespace tandem::server {

using nlohmann::json;

namespace {

constexpr int kMaxTopLogprobs = 20;

// The tool_choice value, checked against the tools offered. Returns false when tools are not to be
// rendered ("none").
bool tools_enabled(const json& body, const json* tools) {
  const json* choice = optional_field(body, "tool_choice");
  if (!choice) return true;
  if (choice->is_string()) {
    const std::string value = choice->get<std::string>();
    if (value == "none") return false;
    if (value == "auto") return true;
    if (value == "required") {
      if (!tools || tools->empty()) throw invalid_request("tool_choice", "tool_choice 'required' needs 'tools'");
      return true;
    }
    throw invalid_request("tool_choice",
                          fmt::format("tool_choice must be \"none\", \"auto\", \"required\" or a named function, got "
                                      "'{}'",
                                      value));
  }
  if (!choice->is_object())
    throw invalid_request("tool_choice", "tool_choice must be a string or an object, got " + json_kind(*choice));
  const json* function = optional_object(*choice, "function", "tool_choice.function");
  const auto name = function ? optional_string(*function, "name") : std::nullopt;
  if (!name) throw invalid_request("tool_choice", "a named tool_choice needs {\"type\": \"function\", \"function\": {\"name\": ...}}");
  bool found = false;
  if (tools && tools->is_array())
    for (const json& tool : *tools)
      if (tool.is_object() && tool.contains("function") && tool["function"].is_object() &&
          tool["function"].value("name", "") == *name)
        found = true;
  if (!found) throw invalid_request("tool_choice", fmt::format("tool_choice names '{}', which is not in 'tools'", *name));
  return true;
}

// render_chat's messages start with the field path ("messages[2]: unknown role ..."); that path is
// the most useful `param`.
std::string param_from_message(const std::string& message) {
  const size_t colon = message.find(':');
  if (colon == std::string::npos || colon > 80) return "messages";
  return message.substr(0, colon);
}

}  // namespace

std::string render_chat_prompt(const json& body, bool* thinking) {
  const json* messages = optional_field(body, "messages");
  if (!messages) throw invalid_request("messages", "'messages' is required");
  if (!messages->is_array())
    throw invalid_request("messages", "'messages' must be a list of messages, got " + json_kind(*messages));
  if (messages->empty()) throw invalid_request("messages", "'messages' must not be empty");

  ChatOptions options;
  const json* tools = optional_field(body, "tools");
  if (tools && !tools->is_array()) throw invalid_request("tools", "'tools' must be a list, got " + json_kind(*tools));
  if (tools && tools_enabled(body, tools)) options.tools = *tools;
  if (!tools) tools_enabled(body, nullptr);
  if (const json* kwargs = optional_object(body, "chat_template_kwargs", "chat_template_kwargs")) {
    options.enable_thinking = optional_bool(*kwargs, "enable_thinking").value_or(false);
    options.preserve_thinking = optional_bool(*kwargs, "preserve_thinking").value_or(false);
  }
  if (const auto add = optional_bool(body, "add_generation_prompt")) options.add_generation_prompt = *add;
  if (thinking) *thinking = options.enable_thinking;
  try {
    return render_chat(*messages, options);
  } catch (const Error& e) {
    throw invalid_request(param_from_message(e.what()), e.what());
  }
}

ChatRequest parse_chat_request(const json& body, const SamplingParams& defaults) {
  ChatRequest r;
  r.params = parse_generation_params(body, defaults, {"max_completion_tokens", "max_tokens"}, 0);
  r.logprobs = optional_bool(body, "logprobs").value_or(false);
  if (const auto top = optional_integer(body, "top_logprobs")) {
    if (*top < 0 || *top > kMaxTopLogprobs)
      throw invalid_request("top_logprobs", fmt::format("'top_logprobs' must be in [0, {}], got {}", kMaxTopLogprobs, *top));
    if (!r.logprobs && *top > 0) throw invalid_request("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    r.params.sampling.top_logprobs = int(*top);
  }
  r.params.sampling.logprobs = r.logprobs;
  r.prompt = render_chat_prompt(body, &r.thinking);
  r.starts_in_reasoning = prompt_opens_reasoning(r.prompt);
  return r;
}

}  // namespace tandem::server
