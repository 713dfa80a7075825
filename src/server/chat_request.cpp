#include "server/chat_request.h"

#include <fmt/format.h>

#include "core/error.h"
#include "server/api_error.h"
#include "server/json_fields.h"
#include "server/json_schema.h"
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
  if (const auto type = optional_string(*choice, "type"); type && *type != "function")
    throw invalid_request("tool_choice", fmt::format("a named tool_choice has type \"function\", got '{}'", *type));
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

// tool_choice "required" ("") or a named function (its name): the calls the answer must make;
// nothing for "auto" and "none" (render_chat_prompt checked the value).
std::optional<std::string> forced_tool(const json& body) {
  const json* choice = optional_field(body, "tool_choice");
  if (!choice) return std::nullopt;
  if (choice->is_string()) return *choice == "required" ? std::optional<std::string>("") : std::nullopt;
  return (*choice)["function"]["name"].get<std::string>();
}

// render_chat's messages start with the field path ("messages[2]: unknown role ..."); that path is
// the most useful `param`.
std::string param_from_message(const std::string& message) {
  const size_t colon = message.find(':');
  if (colon == std::string::npos || colon > 80) return "messages";
  return message.substr(0, colon);
}

// The chat template renders an image, audio or video part as a bare placeholder token, and this
// server runs the text model only (no vision or audio tower): answering would describe media the
// model never saw, so such parts are refused, as vLLM refuses them for a text-only model.
void refuse_media_parts(const json& messages) {
  for (size_t m = 0; m < messages.size(); ++m) {
    const json& message = messages[m];
    if (!message.is_object() || !message.contains("content") || !message["content"].is_array()) continue;
    const json& parts = message["content"];
    for (size_t p = 0; p < parts.size(); ++p) {
      if (!parts[p].is_object() || !parts[p].contains("type") || !parts[p]["type"].is_string()) continue;
      const std::string type = parts[p]["type"].get<std::string>();
      if (type == "text") continue;
      const std::string where = fmt::format("messages[{}].content[{}]", m, p);
      throw invalid_request(where, fmt::format("{}: content parts of type '{}' are not supported: this server runs "
                                               "the text model only (text parts are)",
                                               where, type));
    }
  }
}

// Fields that ask for what a text-only server without the legacy function API cannot do; silently
// ignoring them would answer a different question than the one asked.
void refuse_unsupported_chat_fields(const json& body) {
  if (optional_field(body, "functions") || optional_field(body, "function_call"))
    throw invalid_request(optional_field(body, "functions") ? "functions" : "function_call",
                          "'functions' and 'function_call' are the deprecated form of tools: send 'tools' and "
                          "'tool_choice'");
  if (optional_field(body, "audio")) throw invalid_request("audio", "audio output is not supported: text only");
  if (const json* modalities = optional_field(body, "modalities")) {
    if (!modalities->is_array())
      throw invalid_request("modalities", "'modalities' must be a list, got " + json_kind(*modalities));
    for (const json& m : *modalities)
      if (!m.is_string() || m.get<std::string>() != "text")
        throw invalid_request("modalities", "only the \"text\" modality is supported, got " + m.dump());
  }
}

// The text of the final message, for continue_final_message: its string content, or its last text part.
std::string final_message_text(const json& messages) {
  const json& content = messages.back().is_object() ? messages.back().value("content", json()) : json();
  if (content.is_string()) return content.get<std::string>();
  if (content.is_array())
    for (auto part = content.rbegin(); part != content.rend(); ++part)
      if (part->is_object() && part->contains("text") && (*part)["text"].is_string()) return (*part)["text"];
  throw invalid_request("continue_final_message", "continue_final_message needs a final message with text to continue");
}

// vLLM's continue_final_message (Hugging Face's rule): the prompt ends where the final message's text
// ends, its turn left open, so the model continues it ("Sure, here is" -> the rest). The template
// trims the message, so trailing spaces are cut as it cut them.
std::string cut_after_final_message(const std::string& rendered, const std::string& final_text) {
  const auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; };
  size_t begin = 0, end = final_text.size();
  while (begin < end && is_space(final_text[begin])) ++begin;
  while (end > begin && is_space(final_text[end - 1])) --end;
  const std::string stripped = final_text.substr(begin, end - begin), left_stripped = final_text.substr(begin);
  const size_t at = stripped.empty() ? std::string::npos : rendered.rfind(stripped);
  if (at == std::string::npos)
    throw invalid_request("continue_final_message",
                          "continue_final_message: the final message's text does not appear in the rendered prompt");
  const bool kept_as_sent = rendered.compare(at, left_stripped.size(), left_stripped) == 0;
  return rendered.substr(0, at + (kept_as_sent ? left_stripped.size() : stripped.size()));
}

}  // namespace

std::string render_chat_prompt(const json& body, bool* thinking, bool* tools_offered) {
  const json* messages = optional_field(body, "messages");
  if (!messages) throw invalid_request("messages", "'messages' is required");
  if (!messages->is_array())
    throw invalid_request("messages", "'messages' must be a list of messages, got " + json_kind(*messages));
  if (messages->empty()) throw invalid_request("messages", "'messages' must not be empty");
  refuse_media_parts(*messages);
  refuse_unsupported_chat_fields(body);

  ChatOptions options;
  const json* tools = optional_field(body, "tools");
  if (tools && !tools->is_array()) throw invalid_request("tools", "'tools' must be a list, got " + json_kind(*tools));
  if (tools && tools_enabled(body, tools)) options.tools = *tools;
  if (!tools) tools_enabled(body, nullptr);
  if (const json* kwargs = optional_object(body, "chat_template_kwargs", "chat_template_kwargs")) {
    options.enable_thinking = optional_bool(*kwargs, "enable_thinking").value_or(false);
    options.preserve_thinking = optional_bool(*kwargs, "preserve_thinking").value_or(false);
  }
  const auto add_generation_prompt = optional_bool(body, "add_generation_prompt");
  const bool continue_final = optional_bool(body, "continue_final_message").value_or(false);
  if (continue_final && add_generation_prompt.value_or(false))
    throw invalid_request("continue_final_message",
                          "continue_final_message and add_generation_prompt cannot both be true");
  options.add_generation_prompt = continue_final ? false : add_generation_prompt.value_or(true);
  if (thinking) *thinking = options.enable_thinking;
  if (tools_offered) *tools_offered = options.tools.is_array() && !options.tools.empty();
  std::string rendered;
  try {
    rendered = render_chat(*messages, options);
  } catch (const Error& e) {
    throw invalid_request(param_from_message(e.what()), e.what());
  }
  return continue_final ? cut_after_final_message(rendered, final_message_text(*messages)) : rendered;
}

ChatRequest parse_chat_request(const json& body, const SamplingParams& defaults, std::string_view body_text) {
  ChatRequest r;
  r.params = parse_generation_params(body, defaults, {"max_completion_tokens", "max_tokens"}, 0, body_text);
  r.logprobs = optional_bool(body, "logprobs").value_or(false);
  if (const auto top = optional_integer(body, "top_logprobs")) {
    if (*top < 0 || *top > kMaxTopLogprobs)
      throw invalid_request("top_logprobs", fmt::format("'top_logprobs' must be in [0, {}], got {}", kMaxTopLogprobs, *top));
    if (!r.logprobs && *top > 0) throw invalid_request("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    r.params.sampling.top_logprobs = int(*top);
  }
  r.params.sampling.logprobs = r.logprobs;
  r.prompt = render_chat_prompt(body, &r.thinking, &r.tools_offered);
  r.starts_in_reasoning = prompt_opens_reasoning(r.prompt);
  const std::optional<std::string> forced = forced_tool(body);
  optional_bool(body, "parallel_tool_calls");  // (checked here; it holds only forced calls, below)
  // tool_choice "required" or a named function: the answer is held to calls of the tools.
  if (forced && r.tools_offered) {
    if (r.params.ignore_eos)
      throw invalid_request("ignore_eos", "'ignore_eos' cannot be used with tool_choice 'required' or a named "
                                          "function: the answer ends after its calls");
    if (!r.params.json_format.empty())
      throw invalid_request("response_format", fmt::format("'{}' output cannot be combined with tool_choice "
                                                           "'required' or a named function: the answer is tool calls",
                                                           r.params.json_format));
    const auto thought = r.starts_in_reasoning ? ToolCallGrammar::Thought::Open
                         : r.thinking          ? ToolCallGrammar::Thought::Optional
                                               : ToolCallGrammar::Thought::None;
    const bool parallel = optional_bool(body, "parallel_tool_calls").value_or(true);
    r.params.json_grammar =
        compile_tool_calls(body["tools"], forced->empty() ? nullptr : &*forced, thought, parallel ? 0 : 1);
    r.params.json_format = "tool_choice";
    return r;
  }
  // A JSON answer has no tool-call markers: the model could not call the tools it is offered.
  if (!r.params.json_format.empty() && r.tools_offered)
    throw invalid_request("response_format", fmt::format("'{}' output cannot call tools: leave out 'tools' (or set "
                                                         "'tool_choice' to \"none\") or 'response_format'",
                                                         r.params.json_format));
  // A JSON answer leaves out the thought channel, which this prompt has already opened.
  if (!r.params.json_format.empty() && r.starts_in_reasoning)
    throw invalid_request("response_format", fmt::format("'{}' output cannot follow a prompt that opens the thought "
                                                         "channel (thinking after a tool response): turn thinking off",
                                                         r.params.json_format));
  return r;
}

}  // namespace tandem::server
