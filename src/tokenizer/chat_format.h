#pragma once
// Gemma 4's chat format: OpenAI-style messages -> the prompt text, byte for byte what the official
// chat template (shared/data/gemma4_chat_template.jinja) renders. docs/chat-format.md maps each rule
// to the template and lists the few choices where Jinja engines disagree.
#include <nlohmann/json.hpp>
#include <string>

namespace tandem {

struct ChatOptions {
  bool add_generation_prompt = true;
  bool enable_thinking = false;    // <|think|> at the top of the system turn
  bool preserve_thinking = false;  // keep reasoning of earlier tool-calling answers
  nlohmann::json tools;            // the OpenAI `tools` array, or null
  std::string bos_token = "<bos>";
};

// `messages` is the OpenAI `messages` array (roles system, developer, user, assistant, tool).
// Tool-call arguments may be objects or JSON text (as OpenAI clients send them). Throws Error,
// naming the offending field, for input the template cannot render.
std::string render_chat(const nlohmann::json& messages, const ChatOptions& options);

}  // namespace tandem
