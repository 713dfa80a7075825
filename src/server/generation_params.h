#pragma once
// The parameters every generation route shares (/v1/chat/completions, /v1/completions, /generate):
// sampling, length, stop strings and streaming, read from the request body and validated against
// OpenAI's ranges. Omitted sampling fields take the model's defaults (generation_config.json).
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "runtime/sampler.h"

namespace tandem::server {

struct GenerationParams {
  SamplingParams sampling;
  int max_tokens = 0;                  // 0: up to the context limit
  std::string max_tokens_param;        // the field it came from, for context-length errors
  std::vector<std::string> stop;       // stop strings
  bool ignore_eos = false;             // extension (vLLM): run to max_tokens through stop tokens
  int min_tokens = 0;                  // extension (vLLM): no stop token or stop string before this many
  bool skip_special_tokens = true;     // extension (vLLM): leave <eos>-like tokens out of the text
  bool stream = false;
  bool include_usage = false;          // stream_options.include_usage
};

// `max_tokens_fields` lists the accepted names of the length limit, preferred first
// (chat: max_completion_tokens, max_tokens). `default_max_tokens` applies when none is given.
GenerationParams parse_generation_params(const nlohmann::json& body, const SamplingParams& defaults,
                                         const std::vector<const char*>& max_tokens_fields,
                                         int default_max_tokens);

// Refuses `model` values other than the served model's name (404 model_not_found, as OpenAI does).
void check_model_name(const nlohmann::json& body, const std::string& served_name);

}  // namespace tandem::server
