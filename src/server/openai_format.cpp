#include "server/openai_format.h"

#include "server/served_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <random>

namespace tandem::server {

using nlohmann::json;

std::string random_id(const std::string& prefix, int hex_digits) {
  static std::mutex mutex;
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard lock(mutex);
  std::string id = prefix;
  while (int(id.size() - prefix.size()) < hex_digits) id += fmt::format("{:016x}", rng());
  id.resize(prefix.size() + size_t(hex_digits));
  return id;
}

int64_t unix_time_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

json usage_json(int prompt_tokens, int completion_tokens, int cached_prompt_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", cached_prompt_tokens}}}};
}

std::string json_text(const json& value) { return value.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string sse_event(const json& value) { return "data: " + json_text(value) + "\n\n"; }

namespace {

// The bytes a token stands for: a byte-fallback token (<0x0A>) is that one byte, which may be part
// of a character; any other token is its decoded text.
std::vector<int> token_bytes(const Tokenizer& tokenizer, int32_t id, const std::string& text) {
  if (const auto byte = byte_fallback_value(tokenizer.id_to_token(id))) return {int(*byte)};
  std::vector<int> bytes;
  for (unsigned char c : text) bytes.push_back(c);
  return bytes;
}

std::string token_text(const Tokenizer& tokenizer, int32_t id) {
  const int32_t ids[1] = {id};
  return tokenizer.decode(ids);
}

json logprob_entry(const Tokenizer& tokenizer, int32_t id, float logprob) {
  const std::string text = token_text(tokenizer, id);
  return {{"token", text}, {"logprob", logprob}, {"bytes", token_bytes(tokenizer, id, text)}};
}

}  // namespace

json chat_logprobs_content(const std::vector<GeneratedToken>& tokens, const Tokenizer& tokenizer) {
  json content = json::array();
  for (const GeneratedToken& t : tokens) {
    json entry = logprob_entry(tokenizer, t.token, t.logprob);
    json top = json::array();
    for (const TokenLogprob& alt : t.top) top.push_back(logprob_entry(tokenizer, alt.token, alt.logprob));
    entry["top_logprobs"] = std::move(top);
    content.push_back(std::move(entry));
  }
  return content;
}

json empty_completion_logprobs() {
  return {{"tokens", json::array()},
          {"token_logprobs", json::array()},
          {"top_logprobs", json::array()},
          {"text_offset", json::array()}};
}

size_t character_count(std::string_view utf8_text) {
  return size_t(std::count_if(utf8_text.begin(), utf8_text.end(), [](char c) { return (c & 0xC0) != 0x80; }));
}

void append_completion_logprobs(json& logprobs, const std::vector<GeneratedToken>& tokens, const Tokenizer& tokenizer,
                                size_t text_offset) {
  for (const GeneratedToken& t : tokens) {
    const std::string text = token_text(tokenizer, t.token);
    logprobs["tokens"].push_back(text);
    logprobs["token_logprobs"].push_back(t.logprob);
    json top = json::object();
    for (const TokenLogprob& alt : t.top) top[token_text(tokenizer, alt.token)] = alt.logprob;
    // The legacy API always lists the sampled token too (up to logprobs + 1 entries), so that
    // top_logprobs[i][tokens[i]] is there to look up.
    if (!top.contains(text)) top[text] = t.logprob;
    logprobs["top_logprobs"].push_back(std::move(top));
    logprobs["text_offset"].push_back(text_offset);
    text_offset += character_count(text);
  }
}

size_t append_prompt_logprobs(json& logprobs, const std::vector<int32_t>& prompt,
                              const std::vector<PromptTokenLogprob>& scores, const Tokenizer& tokenizer) {
  if (prompt.empty()) return 0;
  const std::string first = token_text(tokenizer, prompt[0]);
  logprobs["tokens"].push_back(first);
  logprobs["token_logprobs"].push_back(nullptr);
  logprobs["top_logprobs"].push_back(nullptr);
  logprobs["text_offset"].push_back(0);
  size_t offset = character_count(first);
  std::vector<GeneratedToken> rest;
  for (size_t i = 1; i < prompt.size() && i - 1 < scores.size(); ++i)
    rest.push_back({prompt[i], scores[i - 1].logprob, scores[i - 1].top});
  append_completion_logprobs(logprobs, rest, tokenizer, offset);
  for (const GeneratedToken& t : rest) offset += character_count(token_text(tokenizer, t.token));
  return offset;
}

json tool_calls_json(const std::vector<ToolCall>& calls, int first_index, bool with_index) {
  json out = json::array();
  int index = first_index;
  for (const ToolCall& call : calls) {
    json entry = {{"id", random_id("call_", 24)},
                  {"type", "function"},
                  {"function", {{"name", call.name}, {"arguments", json_text(call.arguments)}}}};
    if (with_index) entry["index"] = index;
    ++index;
    out.push_back(std::move(entry));
  }
  return out;
}

}  // namespace tandem::server
