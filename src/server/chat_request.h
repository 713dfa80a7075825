#pragma once
// POST /v1/chat/completions request -> the prompt text (Gemma 4's chat template) and the generation
// parameters. Tools: `tools` are rendered into the system turn unless tool_choice is "none";
// "required" and a named function also hold the answer to calls (server/json_schema's
// compile_tool_calls), "auto" leaves the choice to the model.
#include <nlohmann/json.hpp>

#include <string>

#include "server/generation_params.h"

namespace tandem::server {

struct ChatRequest {
  GenerationParams params;
  std::string prompt;                // rendered, starting with <bos>
  bool starts_in_reasoning = false;  // the prompt opened the thought channel
  bool thinking = false;             // chat_template_kwargs.enable_thinking
  bool logprobs = false;
  bool tools_offered = false;        // tools rendered into the prompt: only then are tool calls parsed
};

// `body_text`: as parse_generation_params.
ChatRequest parse_chat_request(const nlohmann::json& body, const SamplingParams& defaults,
                               std::string_view body_text = {});

// The chat template's rendering of `messages` (+ tools, chat_template_kwargs) from a request body,
// for /v1/chat/completions and /tokenize. Errors name the field (param "messages[2]", "tools").
// Refuses what a text-only model cannot honour: image, audio and video parts, audio output, and the
// legacy `functions` (send `tools`).
std::string render_chat_prompt(const nlohmann::json& body, bool* thinking = nullptr, bool* tools_offered = nullptr);

}  // namespace tandem::server
