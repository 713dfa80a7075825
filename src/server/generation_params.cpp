#include "server/generation_params.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>

#include "server/api_error.h"
#include "server/json_fields.h"
#include "server/json_schema.h"

namespace tandem::server {

using nlohmann::json;

namespace {

constexpr int kMaxStopStrings = 4;

float number_in(const json& body, const char* name, double low, double high, bool low_open, float fallback) {
  const auto v = optional_number(body, name);
  if (!v) return fallback;
  if ((low_open ? *v <= low : *v < low) || *v > high)
    throw invalid_request(name, fmt::format("'{}' must be in {}{}, {}], got {}", name, low_open ? "(" : "[", low,
                                            high, *v));
  return float(*v);
}

std::vector<std::string> parse_stop(const json& body) {
  const json* v = optional_field(body, "stop");
  if (!v) return {};
  std::vector<std::string> stops;
  if (v->is_string()) {
    stops.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    if (v->size() > size_t(kMaxStopStrings))
      throw invalid_request("stop", fmt::format("'stop' takes at most {} strings, got {}", kMaxStopStrings, v->size()));
    for (const json& s : *v) {
      if (!s.is_string()) throw invalid_request("stop", "'stop' must be a string or a list of strings, got a list with " + json_kind(s));
      stops.push_back(s.get<std::string>());
    }
  } else {
    throw invalid_request("stop", "'stop' must be a string or a list of strings, got " + json_kind(*v));
  }
  for (const std::string& s : stops)
    if (s.empty()) throw invalid_request("stop", "stop strings must not be empty");
  return stops;
}

// response_format {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": ...}}:
// the schema compiled, read from the body as received so that its properties keep their order.
std::shared_ptr<const JsonGrammar> parse_json_schema_format(const json& body, std::string_view body_text) {
  const json& format = body["response_format"];
  const auto spec = format.find("json_schema");
  if (spec == format.end() || !spec->is_object())
    throw invalid_request("response_format", "response_format 'json_schema' needs a 'json_schema' object");
  if (const auto name = spec->find("name"); name != spec->end() && !name->is_string())
    throw invalid_request("response_format", "'response_format.json_schema.name' must be a string");
  if (const auto strict = spec->find("strict"); strict != spec->end() && !strict->is_boolean() && !strict->is_null())
    throw invalid_request("response_format", "'response_format.json_schema.strict' must be a boolean");
  const auto schema = spec->find("schema");
  if (schema == spec->end() || schema->is_null())  // no schema: any JSON value
    return compile_json_schema(nlohmann::ordered_json::object(), "response_format.json_schema.schema");
  nlohmann::ordered_json ordered;
  try {
    ordered = body_text.empty() ? nlohmann::ordered_json(body)
                                : nlohmann::ordered_json::parse(body_text.begin(), body_text.end());
  } catch (const nlohmann::json::exception&) {
    ordered = nlohmann::ordered_json(body);
  }
  return compile_json_schema(ordered["response_format"]["json_schema"]["schema"], "response_format.json_schema.schema");
}

}  // namespace

GenerationParams parse_generation_params(const json& body, const SamplingParams& defaults,
                                         const std::vector<const char*>& max_tokens_fields, int default_max_tokens,
                                         std::string_view body_text) {
  GenerationParams p;
  SamplingParams& s = p.sampling;
  s = defaults;
  s.logprobs = false;
  s.top_logprobs = 0;
  s.seed.reset();

  if (const auto n = optional_integer(body, "n")) {
    if (*n < 1 || *n > kMaxChoices)
      throw invalid_request("n", fmt::format("'n' must be in [1, {}], got {}", kMaxChoices, *n));
    p.n = int(*n);
  }
  // best_of > n would rank candidates by their log-probability server-side, which is not done.
  if (const auto best_of = optional_integer(body, "best_of"); best_of && *best_of != p.n)
    throw invalid_request("best_of", fmt::format("'best_of' must equal n ({}): candidates are not ranked on the "
                                                 "server, got {}",
                                                 p.n, *best_of));

  // OpenAI's logit_bias: {"token id": bias in [-100, 100]}; ids are checked against the vocabulary
  // with the prompt's (GenerationStream).
  if (const auto bias = body.find("logit_bias"); bias != body.end() && !bias->is_null()) {
    if (!bias->is_object())
      throw invalid_request("logit_bias",
                            "'logit_bias' must be an object of token ids to biases, got " + json_kind(*bias));
    for (const auto& [key, value] : bias->items()) {
      int32_t id = -1;
      const auto [end, error] = std::from_chars(key.data(), key.data() + key.size(), id);
      const bool canonical = !key.empty() && key[0] >= '0' && key[0] <= '9' && (key.size() == 1 || key[0] != '0');
      if (!canonical || error != std::errc() || end != key.data() + key.size())
        throw invalid_request("logit_bias", fmt::format("logit_bias key '{}' is not a token id", key));
      if (!value.is_number() || !(value.get<double>() >= -100.0 && value.get<double>() <= 100.0))
        throw invalid_request("logit_bias", fmt::format("the bias of token {} must be a number in [-100, 100]", id));
      s.logit_bias.emplace_back(id, value.get<float>());
    }
    std::sort(s.logit_bias.begin(), s.logit_bias.end());  // by id (JSON keys come in text order)
  }
  // A format the output is not held to would look right and be wrong: refused rather than dropped.
  if (const auto format = body.find("response_format"); format != body.end() && !format->is_null()) {
    const auto type = format->is_object() ? format->find("type") : format->end();
    if (!format->is_object() || type == format->end() || !type->is_string())
      throw invalid_request("response_format", "'response_format' must be an object with a string 'type'");
    if (*type == "json_object") {
      p.json_format = "json_object";
    } else if (*type == "json_schema") {
      p.json_format = "json_schema";
      p.json_grammar = parse_json_schema_format(body, body_text);
    } else if (*type != "text") {
      throw invalid_request("response_format",
                            fmt::format("response_format type '{}' is not supported (only 'text', 'json_object' and "
                                        "'json_schema')",
                                        type->get<std::string>()));
    }
  }

  s.temperature = number_in(body, "temperature", 0.0, 2.0, false, s.temperature);
  s.top_p = number_in(body, "top_p", 0.0, 1.0, true, s.top_p);
  s.min_p = number_in(body, "min_p", 0.0, 1.0, false, s.min_p);
  s.presence_penalty = number_in(body, "presence_penalty", -2.0, 2.0, false, s.presence_penalty);
  s.frequency_penalty = number_in(body, "frequency_penalty", -2.0, 2.0, false, s.frequency_penalty);
  s.repetition_penalty = number_in(body, "repetition_penalty", 0.0, 1e6, true, s.repetition_penalty);
  if (const auto k = optional_integer(body, "top_k")) {
    if (*k < -1) throw invalid_request("top_k", fmt::format("'top_k' must be -1 or 0 (off) or positive, got {}", *k));
    s.top_k = *k <= 0 ? 0 : int(std::min<int64_t>(*k, INT32_MAX));
  }
  if (const auto seed = optional_integer(body, "seed")) s.seed = uint64_t(*seed);

  p.max_tokens = default_max_tokens;
  p.max_tokens_param = max_tokens_fields.empty() ? "max_tokens" : max_tokens_fields.front();
  for (const char* field : max_tokens_fields) {
    const auto v = optional_integer(body, field);
    if (!v) continue;
    if (*v < 1) throw invalid_request(field, fmt::format("'{}' must be at least 1, got {}", field, *v));
    p.max_tokens = int(std::min<int64_t>(*v, INT32_MAX));
    p.max_tokens_param = field;
    break;
  }

  p.stop = parse_stop(body);
  p.ignore_eos = optional_bool(body, "ignore_eos").value_or(false);
  // vLLM's min_tokens: the stop tokens are not sampled, nor stop strings matched, before that many.
  if (const auto min = optional_integer(body, "min_tokens")) {
    if (*min < 0 || (p.max_tokens > 0 && *min > p.max_tokens))
      throw invalid_request("min_tokens", fmt::format("'min_tokens' must be in [0, {}] ('{}'), got {}", p.max_tokens,
                                                      p.max_tokens_param, *min));
    p.min_tokens = int(*min);
  }
  p.skip_special_tokens = optional_bool(body, "skip_special_tokens").value_or(true);
  p.stream = optional_bool(body, "stream").value_or(false);
  if (const json* options = optional_object(body, "stream_options", "stream_options")) {
    if (!p.stream) throw invalid_request("stream_options", "'stream_options' is only allowed when 'stream' is true");
    p.include_usage = optional_bool(*options, "include_usage").value_or(false);
  }
  if (!p.json_format.empty() && p.ignore_eos)
    throw invalid_request("ignore_eos", fmt::format("'ignore_eos' cannot be used with response_format '{}': the "
                                                    "answer ends when its JSON value does",
                                                    p.json_format));
  return p;
}

void check_model_name(const json& body, const std::string& served_name) {
  const auto model = optional_string(body, "model");
  if (model && *model != served_name)
    throw ApiError(404, "invalid_request_error",
                   fmt::format("the model '{}' does not exist; this server serves '{}'", *model, served_name), "model",
                   "model_not_found");
}

SamplingParams choice_sampling(const SamplingParams& sampling, int index) {
  SamplingParams s = sampling;
  if (s.seed) s.seed = *s.seed + uint64_t(index);
  return s;
}

}  // namespace tandem::server
