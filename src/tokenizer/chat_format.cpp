#include "tokenizer/chat_format.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <optional>
#include <vector>

#include "core/error.h"
#include "tokenizer/jinja_compat.h"
#include "tokenizer/tool_declaration.h"
#include "tokenizer/tool_syntax.h"

// The template's main loop, statement by statement. Names follow the template's variables
// (prev_message_type, prev_non_tool_role, continues_into_next, ...) so the two read side by side.
namespace tandem {

namespace {

using jinja::lookup;
using jinja::truthy;
using nlohmann::json;

constexpr std::array<std::string_view, 5> kRoles = {"system", "developer", "user", "assistant", "tool"};

enum class PartKind { kText, kImage, kAudio, kVideo };

PartKind part_kind(const json& part, const std::string& where) {
  if (!part.is_object()) fail("{}: a content part must be an object with a 'type'", where);
  const json* type = lookup(part, "type");
  if (type == nullptr || !type->is_string()) fail("{}: a content part needs a string 'type'", where);
  const std::string& name = type->get_ref<const std::string&>();
  if (name == "text") {
    const json* text = lookup(part, "text");
    if (text == nullptr || !text->is_string()) fail("{}: a text part needs a string 'text'", where);
    return PartKind::kText;
  }
  if (name == "image" || name == "image_url") return PartKind::kImage;
  if (name == "audio" || name == "input_audio") return PartKind::kAudio;
  if (name == "video") return PartKind::kVideo;
  fail("{}: unsupported content part type '{}' (expected text, image, image_url, audio, input_audio or video)", where,
       name);
}

const std::string& part_text(const json& part) { return part["text"].get_ref<const std::string&>(); }

// Images, audio and video stand as one placeholder each; the processor expands them.
std::string_view placeholder(PartKind kind) {
  switch (kind) {
    case PartKind::kImage: return "<|image|>";
    case PartKind::kAudio: return "<|audio|>";
    case PartKind::kVideo: return "<|video|>";
    default: return "";
  }
}

[[noreturn]] void fail_content_type(const std::string& where) {
  fail("{}: 'content' must be a string, a list of content parts or null", where);
}

// strip_thinking: drops every <|channel>...<channel|> block (and an unclosed one's tail), then trims.
std::string strip_thinking(std::string_view text) {
  constexpr std::string_view kOpen = "<|channel>", kClose = "<channel|>";
  std::string result;
  for (size_t start = 0;;) {
    const size_t end = text.find(kClose, start);
    const std::string_view part =
        text.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start);
    result += part.substr(0, part.find(kOpen));
    if (end == std::string_view::npos) break;
    start = end + kClose.size();
  }
  return jinja::trim(result);
}

// format_tool_response_block: <|tool_response>response:NAME{key:value,...}<tool_response|>, or
// {value:...} when the response is not an object.
void append_tool_response(std::string& out, const std::string& name, const json& response) {
  out += "<|tool_response>response:" + name + "{";
  if (response.is_object()) {
    bool first = true;
    for (const auto& [key, value] : jinja::dictsort(response)) {
      if (!first) out += ',';
      first = false;
      out += *key + ":";
      append_gemma_value(out, *value, false);
    }
  } else {
    out += "value:";
    append_gemma_value(out, response, false);
  }
  out += "}<tool_response|>";
}

// OpenAI clients send arguments as JSON text; the template wants an object (or null).
std::optional<json> tool_call_arguments(const json& function, const std::string& where) {
  const json* arguments = lookup(function, "arguments");
  if (arguments == nullptr) fail("{}: 'arguments' is missing (use {{}} for a call without arguments)", where);
  if (arguments->is_null()) return std::nullopt;
  if (arguments->is_object()) return *arguments;
  if (!arguments->is_string()) fail("{}.arguments: must be a JSON object or JSON text of an object", where);
  json parsed = json::parse(arguments->get_ref<const std::string&>(), nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_object())
    fail("{}.arguments: '{}' is not the JSON text of an object", where, arguments->get_ref<const std::string&>());
  return parsed;
}

const std::string& tool_call_name(const json& tool_call, const std::string& where) {
  const json* function = lookup(tool_call, "function");
  if (function == nullptr || !function->is_object()) fail("{}: a tool call needs a 'function' object", where);
  const json* name = lookup(function, "name");
  if (name == nullptr || !name->is_string() || name->get_ref<const std::string&>().empty())
    fail("{}.function: 'name' must be a non-empty string", where);
  return name->get_ref<const std::string&>();
}

// An optional string field: nullptr when absent or null.
const json* optional_string(const json& message, std::string_view key, const std::string& where) {
  const json* value = lookup(message, key);
  if (value == nullptr || value->is_null()) return nullptr;
  if (!value->is_string()) fail("{}: '{}' must be a string", where, key);
  return value;
}

class ChatRenderer {
 public:
  ChatRenderer(const json& messages, const ChatOptions& options) : messages_(messages), options_(options) {
    if (!messages.is_array()) fail("messages: must be an array of messages, got {}", messages.type_name());
    if (messages.empty()) fail("messages: must not be empty");
    if (!options.tools.is_null() && !options.tools.is_array())
      fail("tools: must be an array of tools or null, got {}", options.tools.type_name());
    for (size_t i = 0; i < messages.size(); ++i) {
      const std::string& role = role_of(i);
      if (role == "user") last_user_ = std::ptrdiff_t(i);
    }
    answered_tool_message_.assign(messages.size(), false);
  }

  std::string render() {
    out_ = options_.bos_token;
    render_system_turn();
    for (size_t i = first_message_; i < messages_.size(); ++i) render_message(i);
    if (options_.add_generation_prompt) {
      if (prev_message_type_ != MessageType::kToolResponse && prev_message_type_ != MessageType::kToolCall)
        out_ += "<|turn>model\n";
      else if (prev_message_type_ == MessageType::kToolResponse && options_.enable_thinking)
        out_ += "<|channel>thought\n";
    }
    return std::move(out_);
  }

 private:
  enum class MessageType { kNone, kThink, kTool, kToolCall, kToolResponse };

  static std::string where(size_t index) { return fmt::format("messages[{}]", index); }

  const std::string& role_of(size_t index) const {
    const json& message = messages_[index];
    if (!message.is_object()) fail("{}: a message must be an object, got {}", where(index), message.type_name());
    const json* role = lookup(message, "role");
    if (role == nullptr || !role->is_string()) fail("{}: a message needs a string 'role'", where(index));
    const std::string& name = role->get_ref<const std::string&>();
    if (std::find(kRoles.begin(), kRoles.end(), name) == kRoles.end())
      fail("{}: unknown role '{}' (expected system, developer, user, assistant or tool)", where(index), name);
    return name;
  }

  // <|turn>system\n[<|think|>\n][first system/developer message][tool declarations]<turn|>\n
  void render_system_turn() {
    const bool has_tools = truthy(&options_.tools);
    const std::string& first_role = role_of(0);
    const bool first_is_system = first_role == "system" || first_role == "developer";
    if (!options_.enable_thinking && !has_tools && !first_is_system) return;
    out_ += "<|turn>system\n";
    if (options_.enable_thinking) {
      out_ += "<|think|>\n";
      prev_message_type_ = MessageType::kThink;
    }
    if (first_is_system) {
      append_system_content(messages_[0], where(0));
      first_message_ = 1;
    }
    if (has_tools) {
      for (size_t i = 0; i < options_.tools.size(); ++i)
        out_ += "<|tool>" + format_tool_declaration(options_.tools[i], fmt::format("tools[{}]", i)) + "<tool|>";
      prev_message_type_ = MessageType::kTool;
    }
    out_ += "<turn|>\n";
  }

  // A string is trimmed; each text part is trimmed and followed by one space.
  void append_system_content(const json& message, const std::string& at) {
    const json* content = lookup(message, "content");
    if (content == nullptr || content->is_null()) return;
    if (content->is_string()) {
      out_ += jinja::trim(content->get_ref<const std::string&>());
    } else if (content->is_array()) {
      for (size_t p = 0; p < content->size(); ++p) {
        const std::string part_where = fmt::format("{}.content[{}]", at, p);
        if (part_kind((*content)[p], part_where) != PartKind::kText)
          fail("{}: the system turn takes text parts only", part_where);
        out_ += jinja::trim(part_text((*content)[p])) + " ";
      }
    } else {
      fail_content_type(at);
    }
  }

  void render_message(size_t index) {
    const json& message = messages_[index];
    const std::string& role = role_of(index);
    const std::string at = where(index);
    if (role == "tool") {
      // Rendered already by the forward scan of the assistant message it answers.
      if (!answered_tool_message_[index])
        fail(
            "{}: a 'tool' message must follow an assistant message with 'tool_calls' (or another tool message "
            "answering it)",
            at);
      return;
    }
    prev_message_type_ = MessageType::kNone;
    const bool is_model = role == "assistant";
    const bool continue_same_model_turn = is_model && prev_non_tool_role_ == "assistant";
    if (!continue_same_model_turn) out_ += "<|turn>" + (is_model ? std::string("model") : role) + "\n";

    const json* tool_calls = lookup(message, "tool_calls");
    if (tool_calls != nullptr && !tool_calls->is_null() && !tool_calls->is_array())
      fail("{}: 'tool_calls' must be an array", at);
    const bool has_tool_calls = truthy(tool_calls);

    // Reasoning shows only for answers after the last user message (or tool-calling ones, when preserved).
    const json* reasoning = optional_string(message, "reasoning", at);
    const json* reasoning_content = optional_string(message, "reasoning_content", at);
    const json* thinking = truthy(reasoning) ? reasoning : reasoning_content;
    const bool thinking_gate = std::ptrdiff_t(index) > last_user_ || (options_.preserve_thinking && has_tool_calls);
    if (truthy(thinking) && thinking_gate)
      out_ += "<|channel>thought\n" + thinking->get<std::string>() + "\n<channel|>";

    if (has_tool_calls) {
      for (size_t c = 0; c < tool_calls->size(); ++c)
        append_tool_call((*tool_calls)[c], fmt::format("{}.tool_calls[{}]", at, c));
      prev_message_type_ = MessageType::kToolCall;
    }

    bool rendered_tool_responses = false;
    if (const json* tool_responses = lookup(message, "tool_responses"); truthy(tool_responses)) {
      append_legacy_tool_responses(*tool_responses, at + ".tool_responses");
      rendered_tool_responses = true;
      prev_message_type_ = MessageType::kToolResponse;
    } else if (has_tool_calls) {
      rendered_tool_responses = append_following_tool_messages(index, *tool_calls);
      if (rendered_tool_responses) prev_message_type_ = MessageType::kToolResponse;
    }

    const std::string captured_content = render_content(message, is_model, at);
    out_ += captured_content;
    const bool has_content = !jinja::trim(captured_content).empty();

    const std::string* next_non_tool_role = nullptr;
    for (size_t j = index + 1; j < messages_.size() && next_non_tool_role == nullptr; ++j)
      if (role_of(j) != "tool") next_non_tool_role = &role_of(j);
    const bool continues_into_next = is_model && next_non_tool_role != nullptr && *next_non_tool_role == "assistant" &&
                                     (!has_tool_calls || rendered_tool_responses);

    if (prev_message_type_ == MessageType::kToolCall && !rendered_tool_responses) {
      out_ += "<|tool_response>";  // the model's cue to stop and wait for the results
    } else if (continues_into_next) {
      // the next assistant message continues this model turn
    } else if (!(rendered_tool_responses && !has_content && next_non_tool_role == nullptr)) {
      out_ += "<turn|>\n";
    }
    prev_non_tool_role_ = role;
  }

  // <|tool_call>call:NAME{key:value,...}<tool_call|>
  void append_tool_call(const json& tool_call, const std::string& at) {
    if (!tool_call.is_object()) fail("{}: a tool call must be an object", at);
    const std::string& name = tool_call_name(tool_call, at);
    const std::optional<json> arguments = tool_call_arguments(tool_call["function"], at + ".function");
    out_ += "<|tool_call>call:" + name + "{";
    if (arguments) {
      bool first = true;
      for (const auto& [key, value] : jinja::dictsort(*arguments)) {
        if (!first) out_ += ',';
        first = false;
        out_ += *key + ":";
        append_gemma_value(out_, *value, false);
      }
    }
    out_ += "}<tool_call|>";
  }

  // Legacy (Gemma-native) results carried on the assistant message itself.
  void append_legacy_tool_responses(const json& tool_responses, const std::string& at) {
    if (!tool_responses.is_array()) fail("{}: must be an array", at);
    for (size_t r = 0; r < tool_responses.size(); ++r) {
      const std::string item_where = fmt::format("{}[{}]", at, r);
      const json& item = tool_responses[r];
      if (!item.is_object()) fail("{}: must be an object with 'name' and 'response'", item_where);
      const json* name = lookup(item, "name");
      if (truthy(name) && !name->is_string()) fail("{}: 'name' must be a string", item_where);
      const json* response = lookup(item, "response");
      if (response == nullptr) fail("{}: 'response' is missing", item_where);
      append_tool_response(out_, truthy(name) ? name->get<std::string>() : "unknown", *response);
    }
  }

  // OpenAI style: the role "tool" messages right after the call, each named by its tool_call_id.
  bool append_following_tool_messages(size_t index, const json& tool_calls) {
    bool rendered = false;
    for (size_t k = index + 1; k < messages_.size() && role_of(k) == "tool"; ++k) {
      const json& follow = messages_[k];
      const std::string at = where(k);
      const json* own_name = optional_string(follow, "name", at);
      std::string name = truthy(own_name) ? own_name->get<std::string>() : "unknown";
      const json* id = lookup(follow, "tool_call_id");
      const json wanted_id = id ? *id : json(nullptr);
      for (const json& tool_call : tool_calls) {
        const json* call_id = lookup(tool_call, "id");
        if ((call_id ? *call_id : json(nullptr)) == wanted_id) name = tool_call["function"]["name"].get<std::string>();
      }
      append_tool_message_content(follow, name, at);
      answered_tool_message_[k] = true;
      rendered = true;
    }
    return rendered;
  }

  // Text parts join into one string response; media parts follow the block as placeholders.
  void append_tool_message_content(const json& message, const std::string& name, const std::string& at) {
    const json* body = lookup(message, "content");
    if (body == nullptr || body->is_null()) {
      append_tool_response(out_, name, nullptr);
    } else if (body->is_string()) {
      append_tool_response(out_, name, *body);
    } else if (body->is_array()) {
      std::string text;
      std::string placeholders;
      for (size_t p = 0; p < body->size(); ++p) {
        const PartKind kind = part_kind((*body)[p], fmt::format("{}.content[{}]", at, p));
        if (kind == PartKind::kText)
          text += part_text((*body)[p]);
        else
          placeholders += placeholder(kind);
      }
      append_tool_response(out_, name, text);
      out_ += placeholders;
    } else {
      fail_content_type(at);
    }
  }

  // Model answers lose their thinking; everything is trimmed, part by part.
  static std::string render_content(const json& message, bool is_model, const std::string& at) {
    const json* content = lookup(message, "content");
    if (content == nullptr || content->is_null()) return "";
    auto clean = [is_model](const std::string& text) { return is_model ? strip_thinking(text) : jinja::trim(text); };
    if (content->is_string()) return clean(content->get_ref<const std::string&>());
    if (!content->is_array()) fail_content_type(at);
    std::string out;
    for (size_t p = 0; p < content->size(); ++p) {
      const PartKind kind = part_kind((*content)[p], fmt::format("{}.content[{}]", at, p));
      out += kind == PartKind::kText ? clean(part_text((*content)[p])) : std::string(placeholder(kind));
    }
    return out;
  }

  const json& messages_;
  const ChatOptions& options_;
  size_t first_message_ = 0;       // 1 when messages[0] went into the system turn
  std::ptrdiff_t last_user_ = -1;  // index of the last user message
  std::vector<bool> answered_tool_message_;
  MessageType prev_message_type_ = MessageType::kNone;
  std::string prev_non_tool_role_;  // "" before the first message
  std::string out_;
};

}  // namespace

std::string render_chat(const json& messages, const ChatOptions& options) {
  return ChatRenderer(messages, options).render();
}

}  // namespace tandem
