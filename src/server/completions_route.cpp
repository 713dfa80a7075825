// POST /v1/completions (OpenAI's legacy text completions) and POST /generate (a plain form for
// scripts and curl): the prompt as given, no chat template.
#include <httplib.h>

#include <fmt/format.h>

#include "server/api_error.h"
#include "server/generation_response.h"
#include "server/json_fields.h"
#include "server/openai_format.h"
#include "server/routes.h"

namespace tandem::server {

using nlohmann::json;

namespace {

// OpenAI's default for completions (chat defaults to the rest of the context).
constexpr int kDefaultCompletionTokens = 16;
constexpr int kMaxLegacyLogprobs = 5;

struct PromptInput {
  std::vector<int32_t> ids;
  std::string text;  // for echo
};

std::vector<int32_t> token_id_list(const json& list, const Tokenizer& tokenizer) {
  std::vector<int32_t> ids;
  for (const json& v : list) {
    if (!v.is_number_integer() && !v.is_number_unsigned())
      throw invalid_request("prompt", "a token-id prompt must hold integers only, got " + json_kind(v));
    const int64_t id = v.get<int64_t>();
    if (id < 0 || id >= tokenizer.vocab_size())
      throw invalid_request("prompt", fmt::format("token id {} is outside the vocabulary (0..{})", id,
                                                  tokenizer.vocab_size() - 1));
    ids.push_back(int32_t(id));
  }
  return ids;
}

// A string, a list of token ids, or a list holding exactly one of those.
PromptInput read_prompt(const json& body, const Tokenizer& tokenizer) {
  const json* prompt = optional_field(body, "prompt");
  if (!prompt) throw invalid_request("prompt", "'prompt' is required");
  const json* single = prompt;
  if (prompt->is_array() && !prompt->empty() && (prompt->front().is_string() || prompt->front().is_array())) {
    if (prompt->size() != 1)
      throw invalid_request("prompt", fmt::format("one prompt per request is supported, got a batch of {}", prompt->size()));
    single = &prompt->front();
  }
  PromptInput in;
  if (single->is_string()) {
    in.text = single->get<std::string>();
    if (in.text.empty()) throw invalid_request("prompt", "the prompt is empty");
    in.ids = tokenizer.encode(in.text, /*add_bos=*/true);
  } else if (single->is_array()) {
    if (single->empty()) throw invalid_request("prompt", "the prompt is empty");
    in.ids = token_id_list(*single, tokenizer);
    in.text = tokenizer.decode(in.ids);
  } else {
    throw invalid_request("prompt", "'prompt' must be a string or a list of token ids, got " + json_kind(*single));
  }
  return in;
}

struct CompletionInfo {
  std::string id = random_id("cmpl-");
  int64_t created = unix_time_now();
  std::string model;
  bool logprobs = false;
  bool include_usage = false;
  std::string echo_text;  // the prompt, when echo is on
  std::vector<int32_t> scored_prompt;  // echo with logprobs: the prompt, whose tokens get logprobs too
};

class CompletionStreamFormatter final : public GenerationFormatter {
 public:
  CompletionStreamFormatter(CompletionInfo info, const GenerationStream& stream, const Tokenizer& tokenizer)
      : info_(std::move(info)), stream_(stream), tokenizer_(tokenizer) {}

  std::string opening() override {
    if (info_.echo_text.empty() || !info_.scored_prompt.empty()) return {};  // a scored echo waits for its scores
    offset_ = character_count(info_.echo_text);
    return sse_event(chunk(info_.echo_text, {}, nullptr));
  }

  std::string format(const GenerationUpdate& u) override {
    std::string out;
    // The engine sends the prompt's scores with the first event after the prompt ran.
    // (Not when the request failed before its prompt was scored: the error event alone then.)
    if (!info_.scored_prompt.empty() && !echoed_ &&
        (!u.prompt_logprobs.empty() || !u.tokens.empty() || (u.finished && u.error.empty())))
      out += echo_with_logprobs(u.prompt_logprobs);
    if (info_.logprobs) pending_.insert(pending_.end(), u.tokens.begin(), u.tokens.end());
    if (!u.delta.content.empty()) out += sse_event(chunk(u.delta.content, take_pending(), nullptr));
    if (!u.finished) return out;
    if (!u.error.empty())
      return out + sse_event(ApiError(500, "server_error", u.error, {}, "generation_failed").body()) + kSseDone;
    out += sse_event(chunk("", take_pending(), u.finish_reason));
    if (info_.include_usage) {
      json last = base();
      last["choices"] = json::array();
      last["usage"] = usage_json(stream_.prompt_tokens(), stream_.completion_tokens(), stream_.cached_prompt_tokens());
      out += sse_event(last);
    }
    return out + kSseDone;
  }

 private:
  std::vector<GeneratedToken> take_pending() {
    std::vector<GeneratedToken> out;
    out.swap(pending_);
    return out;
  }

  json base() const {
    return {{"id", info_.id}, {"object", "text_completion"}, {"created", info_.created}, {"model", info_.model}};
  }

  std::string echo_with_logprobs(const std::vector<PromptTokenLogprob>& scores) {
    echoed_ = true;
    json logprobs = empty_completion_logprobs();
    offset_ = append_prompt_logprobs(logprobs, info_.scored_prompt, scores, tokenizer_);
    json c = base();
    c["choices"] =
        json::array({{{"index", 0}, {"text", info_.echo_text}, {"logprobs", logprobs}, {"finish_reason", nullptr}}});
    if (info_.include_usage) c["usage"] = nullptr;
    return sse_event(c);
  }

  json chunk(const std::string& text, const std::vector<GeneratedToken>& tokens, json finish_reason) {
    json logprobs = nullptr;
    if (info_.logprobs) {
      logprobs = empty_completion_logprobs();
      append_completion_logprobs(logprobs, tokens, tokenizer_, offset_);
    }
    offset_ += character_count(text);
    json c = base();
    c["choices"] = json::array(
        {{{"index", 0}, {"text", text}, {"logprobs", logprobs}, {"finish_reason", std::move(finish_reason)}}});
    if (info_.include_usage) c["usage"] = nullptr;
    return c;
  }

  CompletionInfo info_;
  const GenerationStream& stream_;
  const Tokenizer& tokenizer_;
  std::vector<GeneratedToken> pending_;
  size_t offset_ = 0;
  bool echoed_ = false;
};

class CompletionFormatter final : public GenerationFormatter {
 public:
  CompletionFormatter(CompletionInfo info, const GenerationStream& stream, const Tokenizer& tokenizer)
      : info_(std::move(info)), stream_(stream), tokenizer_(tokenizer) {}

  std::string format(const GenerationUpdate& u) override {
    text_ += u.delta.content;
    if (info_.logprobs) tokens_.insert(tokens_.end(), u.tokens.begin(), u.tokens.end());
    if (!u.prompt_logprobs.empty()) prompt_scores_ = u.prompt_logprobs;
    if (!u.finished) return {};
    if (!u.error.empty()) return json_text(ApiError(500, "server_error", u.error, {}, "generation_failed").body());
    json logprobs = nullptr;
    if (info_.logprobs) {
      logprobs = empty_completion_logprobs();
      size_t offset = character_count(info_.echo_text);
      if (!info_.scored_prompt.empty())
        offset = append_prompt_logprobs(logprobs, info_.scored_prompt, prompt_scores_, tokenizer_);
      append_completion_logprobs(logprobs, tokens_, tokenizer_, offset);
    }
    const json response = {
        {"id", info_.id},
        {"object", "text_completion"},
        {"created", info_.created},
        {"model", info_.model},
        {"choices", json::array({{{"index", 0},
                                  {"text", info_.echo_text + text_},
                                  {"logprobs", logprobs},
                                  {"finish_reason", u.finish_reason}}})},
        {"usage", usage_json(stream_.prompt_tokens(), stream_.completion_tokens(), stream_.cached_prompt_tokens())}};
    return json_text(response);
  }

 private:
  CompletionInfo info_;
  const GenerationStream& stream_;
  const Tokenizer& tokenizer_;
  std::string text_;
  std::vector<GeneratedToken> tokens_;
  std::vector<PromptTokenLogprob> prompt_scores_;
};

class GenerateFormatter final : public GenerationFormatter {
 public:
  explicit GenerateFormatter(const GenerationStream& stream) : stream_(stream) {}

  std::string format(const GenerationUpdate& u) override {
    text_ += u.delta.content;
    if (!u.finished) return {};
    if (!u.error.empty()) return json_text(ApiError(500, "server_error", u.error, {}, "generation_failed").body());
    return json_text({{"text", text_},
                      {"tokens", stream_.completion_tokens()},
                      {"prompt_tokens", stream_.prompt_tokens()},
                      {"finish_reason", u.finish_reason}});
  }

 private:
  const GenerationStream& stream_;
  std::string text_;
};

}  // namespace

void handle_completions(const RouteContext& context, const std::string& request_body,
                             const httplib::Request& req, httplib::Response& res) {
  const auto arrival = std::chrono::steady_clock::now();
  const json body = parse_json_object_body(request_body);
  check_model_name(body, context.model.name);
  GenerationJob job;
  job.arrival = arrival;
  const bool echo = optional_bool(body, "echo").value_or(false);
  // With echo, max_tokens 0 asks for the prompt alone (scored, with logprobs): what lm-eval and
  // other scoring clients send for log-likelihoods.
  const auto asked = optional_integer(body, "max_tokens");
  job.prompt_only = echo && asked && *asked == 0;
  if (job.prompt_only) {
    if (optional_integer(body, "min_tokens").value_or(0) > 0)
      throw invalid_request("min_tokens", "'min_tokens' must be 0 when 'max_tokens' is 0 (the prompt alone is scored)");
    json rest = body;
    rest.erase("max_tokens");
    job.params = parse_generation_params(rest, context.model.default_sampling, {"max_tokens"}, 1);
  } else {
    job.params = parse_generation_params(body, context.model.default_sampling, {"max_tokens"}, kDefaultCompletionTokens);
  }
  CompletionInfo info;
  info.model = context.model.name;
  info.include_usage = job.params.include_usage;
  if (const auto n = optional_integer(body, "logprobs")) {
    if (*n < 0 || *n > kMaxLegacyLogprobs)
      throw invalid_request("logprobs", fmt::format("'logprobs' must be in [0, {}], got {}", kMaxLegacyLogprobs, *n));
    info.logprobs = true;
    job.params.sampling.logprobs = true;
    job.params.sampling.top_logprobs = int(*n);
  }
  if (const auto suffix = optional_string(body, "suffix"); suffix && !suffix->empty())
    throw invalid_request("suffix", "'suffix' (insertion) is not supported");

  PromptInput prompt = read_prompt(body, context.model.tokenizer);
  if (echo) info.echo_text = prompt.text;
  if (echo && info.logprobs) {
    info.scored_prompt = prompt.ids;
    job.prompt_logprobs = job.params.sampling.top_logprobs;
  }
  job.prompt = std::move(prompt.ids);
  job.prompt_param = "prompt";
  job.mode = OutputMode::Text;
  const bool streaming = job.params.stream;
  auto stream = std::make_unique<GenerationStream>(context, std::move(job));
  const GenerationStream& s = *stream;
  if (streaming) {
    respond_with_generation(res, "text/event-stream", std::move(stream),
                            std::make_unique<CompletionStreamFormatter>(std::move(info), s, context.model.tokenizer));
  } else {
    respond_with_generation(res, "application/json", std::move(stream),
                            std::make_unique<CompletionFormatter>(std::move(info), s, context.model.tokenizer));
  }
}

void handle_generate(const RouteContext& context, const std::string& request_body,
                             const httplib::Request& req, httplib::Response& res) {
  const auto arrival = std::chrono::steady_clock::now();
  const json body = parse_json_object_body(request_body);
  GenerationJob job;
  job.arrival = arrival;
  job.params = parse_generation_params(body, context.model.default_sampling, {"max_tokens"}, kDefaultCompletionTokens);
  if (job.params.stream) throw invalid_request("stream", "/generate does not stream; use /v1/completions");
  const auto prompt = optional_string(body, "prompt");
  if (!prompt) throw invalid_request("prompt", "'prompt' (a string) is required");
  if (prompt->empty()) throw invalid_request("prompt", "the prompt is empty");
  job.prompt = context.model.tokenizer.encode(*prompt, /*add_bos=*/true);
  job.prompt_param = "prompt";
  job.mode = OutputMode::Text;
  auto stream = std::make_unique<GenerationStream>(context, std::move(job));
  const GenerationStream& s = *stream;
  respond_with_generation(res, "application/json", std::move(stream), std::make_unique<GenerateFormatter>(s));
}

}  // namespace tandem::server
