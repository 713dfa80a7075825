#pragma once
// Pieces of OpenAI's response format shared by the routes: ids, usage, logprobs, tool calls, and
// Server-Sent Events framing (`data: {json}\n\n`, ending with `data: [DONE]\n\n`).
#include <nlohmann/json.hpp>

#include <string>
#include <string_view>
#include <vector>

#include "server/generation_stream.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tool_syntax.h"

namespace tandem::server {

// "chatcmpl-" + 24 random hex digits, etc.
std::string random_id(const std::string& prefix, int hex_digits = 24);
int64_t unix_time_now();

// With prompt_tokens_details.cached_tokens: the prompt tokens whose K/V an earlier request left (prefix reuse).
nlohmann::json usage_json(int prompt_tokens, int completion_tokens, int cached_prompt_tokens);

// JSON text for the wire. Invalid UTF-8 cannot come from the decoders, but a response must never
// fail half-written, so any would be replaced by U+FFFD.
std::string json_text(const nlohmann::json& value);
std::string sse_event(const nlohmann::json& value);
inline constexpr const char* kSseDone = "data: [DONE]\n\n";

// Chat: logprobs.content entries {token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}.
nlohmann::json chat_logprobs_content(const std::vector<GeneratedToken>& tokens, const Tokenizer& tokenizer);

// Unicode characters (code points) in UTF-8 text: the unit of the legacy API's text_offset.
size_t character_count(std::string_view utf8_text);

// Completions (legacy format): appends to {tokens, token_logprobs, top_logprobs, text_offset};
// `text_offset` is where the first token's text starts in the choice's text, in characters. Each
// top_logprobs entry includes the sampled token.
void append_completion_logprobs(nlohmann::json& logprobs, const std::vector<GeneratedToken>& tokens,
                                const Tokenizer& tokenizer, size_t text_offset);
nlohmann::json empty_completion_logprobs();
// The same for an echoed prompt (echo with logprobs): its first token has nothing before it (null
// logprob and top_logprobs), the others get the engine's prompt scores. Offsets start at 0; returns
// the offset after the prompt's tokens.
size_t append_prompt_logprobs(nlohmann::json& logprobs, const std::vector<int32_t>& prompt,
                              const std::vector<PromptTokenLogprob>& scores, const Tokenizer& tokenizer);

// OpenAI tool calls: [{index?, id, type: "function", function: {name, arguments: JSON text}}].
nlohmann::json tool_calls_json(const std::vector<ToolCall>& calls, int first_index, bool with_index);

}  // namespace tandem::server
