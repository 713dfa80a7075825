#pragma once
// The parameters every generation route shares (/v1/chat/completions, /v1/completions, /generate):
// sampling, length, stop strings and streaming, read from the request body and validated against
// OpenAI's ranges. Omitted sampling fields take the model's defaults (generation_config.json).
#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/sampler.h"

namespace tandem::server {

// The most choices one response may ask for (n, times the prompts of a completions batch), as OpenAI.
constexpr int kMaxChoices = 128;

struct GenerationParams {
  SamplingParams sampling;
  int n = 1;                           // choices per prompt, each its own engine request
  int max_tokens = 0;                  // 0: up to the context limit
  std::string max_tokens_param;        // the field it came from, for context-length errors
  std::vector<std::string> stop;       // stop strings
  bool ignore_eos = false;             // extension (vLLM): run to max_tokens through stop tokens
  int min_tokens = 0;                  // extension (vLLM): no stop token or stop string before this many
  bool skip_special_tokens = true;     // extension (vLLM): leave <eos>-like tokens out of the text
  bool stream = false;
  bool include_usage = false;          // stream_options.include_usage
  // response_format json_object or json_schema: the output is held to JSON (`json_format` names
  // which), a value of `json_grammar` (null: any object).
  std::string json_format;
  std::shared_ptr<const JsonGrammar> json_grammar;
};

// The sampling of choice `index` of a prompt's n: with a seed, choice i draws from seed + i, so the
// choices differ, the response repeats as a whole, and the first choice is the one n=1 gives.
SamplingParams choice_sampling(const SamplingParams& sampling, int index);

// `max_tokens_fields` lists the accepted names of the length limit, preferred first
// (chat: max_completion_tokens, max_tokens). `default_max_tokens` applies when none is given.
// `body_text` is the body as received: a json_schema's properties are written in its order (which
// `body` has lost); without it, in `body`'s.
GenerationParams parse_generation_params(const nlohmann::json& body, const SamplingParams& defaults,
                                         const std::vector<const char*>& max_tokens_fields,
                                         int default_max_tokens, std::string_view body_text = {});

// Refuses `model` values other than the served model's name (404 model_not_found, as OpenAI does).
void check_model_name(const nlohmann::json& body, const std::string& served_name);

}  // namespace tandem::server
