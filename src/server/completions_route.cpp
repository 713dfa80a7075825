// POST /v1/completions (OpenAI's legacy text completions) and POST /generate (a plain form for
// scripts and curl): the prompt as given, no chat template.
#include <httplib.h>

#include <fmt/format.h>

#include <algorithm>

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

PromptInput read_one_prompt(const json& prompt, const Tokenizer& tokenizer) {
  PromptInput in;
  if (prompt.is_string()) {
    in.text = prompt.get<std::string>();
    if (in.text.empty()) throw invalid_request("prompt", "the prompt is empty");
    in.ids = tokenizer.encode(in.text, /*add_bos=*/true);
  } else if (prompt.is_array()) {
    if (prompt.empty()) throw invalid_request("prompt", "the prompt is empty");
    in.ids = token_id_list(prompt, tokenizer);
    in.text = tokenizer.decode(in.ids);
  } else {
    throw invalid_request("prompt", "'prompt' must be a string or a list of token ids, got " + json_kind(prompt));
  }
  return in;
}

// A string, a list of token ids, or a batch: a list of those (strings and id lists may mix).
std::vector<PromptInput> read_prompts(const json& body, const Tokenizer& tokenizer) {
  const json* prompt = optional_field(body, "prompt");
  if (!prompt) throw invalid_request("prompt", "'prompt' is required");
  const bool batch = prompt->is_array() && !prompt->empty() && (prompt->front().is_string() || prompt->front().is_array());
  if (!batch) return {read_one_prompt(*prompt, tokenizer)};
  std::vector<PromptInput> prompts;
  for (const json& p : *prompt) {
    if (!p.is_string() && !p.is_array())
      throw invalid_request("prompt", "a batch of prompts must hold strings or lists of token ids, got " + json_kind(p));
    prompts.push_back(read_one_prompt(p, tokenizer));
  }
  return prompts;
}

struct CompletionInfo {
  std::string id = random_id("cmpl-");
  int64_t created = unix_time_now();
  std::string model;
  bool logprobs = false;
  bool include_usage = false;
  int n = 1;  // choices per prompt: choice i answers prompt i / n
  struct Prompt {
    std::string echo_text;               // the prompt, when echo is on
    std::vector<int32_t> scored_prompt;  // echo with logprobs: the prompt, whose tokens get logprobs too
  };
  std::vector<Prompt> prompts;
};

// Usage over the choices: each prompt once (its n choices ran the same one; cached as far as any of
// them found it), every completion.
json completion_usage(const GenerationChoices& choices, int n) {
  int prompt = 0, completion = 0, cached = 0;
  for (int first = 0; first < choices.size(); first += n) {
    prompt += choices[first].prompt_tokens();
    int prompt_cached = 0;
    for (int i = first; i < first + n; ++i) {
      completion += choices[i].completion_tokens();
      prompt_cached = std::max(prompt_cached, choices[i].cached_prompt_tokens());
    }
    cached += prompt_cached;
  }
  return usage_json(prompt, completion, cached);
}

class CompletionStreamFormatter final : public GenerationFormatter {
 public:
  CompletionStreamFormatter(CompletionInfo info, const GenerationChoices& choices, const Tokenizer& tokenizer)
      : info_(std::move(info)), choices_(choices), tokenizer_(tokenizer), state_(size_t(choices.size())) {}

  std::string opening() override {
    std::string out;
    for (int i = 0; i < choices_.size(); ++i) {
      const CompletionInfo::Prompt& p = prompt(i);
      if (p.echo_text.empty() || !p.scored_prompt.empty()) continue;  // a scored echo waits for its scores
      state_[size_t(i)].offset = character_count(p.echo_text);
      out += sse_event(chunk(i, p.echo_text, {}, nullptr));
    }
    return out;
  }

  std::string format(int choice, const GenerationUpdate& u) override {
    ChoiceState& state = state_[size_t(choice)];
    std::string out;
    // The engine sends the prompt's scores with the first event after the prompt ran.
    // (Not when the request failed before its prompt was scored: the error event alone then.)
    if (!prompt(choice).scored_prompt.empty() && !state.echoed &&
        (!u.prompt_logprobs.empty() || !u.tokens.empty() || (u.finished && u.error.empty())))
      out += echo_with_logprobs(choice, u.prompt_logprobs);
    if (info_.logprobs) state.pending.insert(state.pending.end(), u.tokens.begin(), u.tokens.end());
    if (!u.delta.content.empty()) out += sse_event(chunk(choice, u.delta.content, take_pending(state), nullptr));
    if (!u.finished) return out;
    if (!u.error.empty())
      return out + sse_event(ApiError(500, "server_error", u.error, {}, "generation_failed").body()) + kSseDone;
    return out + sse_event(chunk(choice, "", take_pending(state), u.finish_reason));
  }

  std::string closing() override {
    if (!info_.include_usage) return kSseDone;
    json last = base();
    last["choices"] = json::array();
    last["usage"] = completion_usage(choices_, info_.n);
    return sse_event(last) + kSseDone;
  }

 private:
  struct ChoiceState {
    std::vector<GeneratedToken> pending;  // for logprobs: decoded since the choice's last chunk
    size_t offset = 0;                    // characters of the choice's text sent so far
    bool echoed = false;
  };

  const CompletionInfo::Prompt& prompt(int choice) const { return info_.prompts[size_t(choice / info_.n)]; }

  static std::vector<GeneratedToken> take_pending(ChoiceState& state) {
    std::vector<GeneratedToken> out;
    out.swap(state.pending);
    return out;
  }

  json base() const {
    return {{"id", info_.id}, {"object", "text_completion"}, {"created", info_.created}, {"model", info_.model}};
  }

  std::string echo_with_logprobs(int choice, const std::vector<PromptTokenLogprob>& scores) {
    ChoiceState& state = state_[size_t(choice)];
    state.echoed = true;
    json logprobs = empty_completion_logprobs();
    state.offset = append_prompt_logprobs(logprobs, prompt(choice).scored_prompt, scores, tokenizer_);
    json c = base();
    c["choices"] = json::array(
        {{{"index", choice}, {"text", prompt(choice).echo_text}, {"logprobs", logprobs}, {"finish_reason", nullptr}}});
    if (info_.include_usage) c["usage"] = nullptr;
    return sse_event(c);
  }

  json chunk(int choice, const std::string& text, const std::vector<GeneratedToken>& tokens, json finish_reason) {
    ChoiceState& state = state_[size_t(choice)];
    json logprobs = nullptr;
    if (info_.logprobs) {
      logprobs = empty_completion_logprobs();
      append_completion_logprobs(logprobs, tokens, tokenizer_, state.offset);
    }
    state.offset += character_count(text);
    json c = base();
    c["choices"] = json::array(
        {{{"index", choice}, {"text", text}, {"logprobs", logprobs}, {"finish_reason", std::move(finish_reason)}}});
    if (info_.include_usage) c["usage"] = nullptr;
    return c;
  }

  CompletionInfo info_;
  const GenerationChoices& choices_;
  const Tokenizer& tokenizer_;
  std::vector<ChoiceState> state_;
};

class CompletionFormatter final : public GenerationFormatter {
 public:
  CompletionFormatter(CompletionInfo info, const GenerationChoices& choices, const Tokenizer& tokenizer)
      : info_(std::move(info)), choices_(choices), tokenizer_(tokenizer), state_(size_t(choices.size())) {}

  std::string format(int choice, const GenerationUpdate& u) override {
    ChoiceState& state = state_[size_t(choice)];
    state.text += u.delta.content;
    if (info_.logprobs) state.tokens.insert(state.tokens.end(), u.tokens.begin(), u.tokens.end());
    if (!u.prompt_logprobs.empty()) state.prompt_scores = u.prompt_logprobs;
    if (u.finished) state.finish_reason = u.finish_reason;
    if (u.finished && !u.error.empty())
      return json_text(ApiError(500, "server_error", u.error, {}, "generation_failed").body());
    return {};
  }

  std::string closing() override {
    json choices = json::array();
    for (size_t i = 0; i < state_.size(); ++i) {
      const ChoiceState& state = state_[i];
      const CompletionInfo::Prompt& p = info_.prompts[i / size_t(info_.n)];
      json logprobs = nullptr;
      if (info_.logprobs) {
        logprobs = empty_completion_logprobs();
        size_t offset = character_count(p.echo_text);
        if (!p.scored_prompt.empty()) offset = append_prompt_logprobs(logprobs, p.scored_prompt, state.prompt_scores, tokenizer_);
        append_completion_logprobs(logprobs, state.tokens, tokenizer_, offset);
      }
      choices.push_back({{"index", i},
                         {"text", p.echo_text + state.text},
                         {"logprobs", std::move(logprobs)},
                         {"finish_reason", state.finish_reason}});
    }
    const json response = {{"id", info_.id},
                           {"object", "text_completion"},
                           {"created", info_.created},
                           {"model", info_.model},
                           {"choices", std::move(choices)},
                           {"usage", completion_usage(choices_, info_.n)}};
    return json_text(response);
  }

 private:
  struct ChoiceState {
    std::string text;
    std::vector<GeneratedToken> tokens;
    std::vector<PromptTokenLogprob> prompt_scores;
    std::string finish_reason;
  };

  CompletionInfo info_;
  const GenerationChoices& choices_;
  const Tokenizer& tokenizer_;
  std::vector<ChoiceState> state_;
};

class GenerateFormatter final : public GenerationFormatter {
 public:
  explicit GenerateFormatter(const GenerationChoices& choices) : choices_(choices) {}

  std::string format(int, const GenerationUpdate& u) override {
    text_ += u.delta.content;
    if (u.finished) finish_reason_ = u.finish_reason;
    if (u.finished && !u.error.empty())
      return json_text(ApiError(500, "server_error", u.error, {}, "generation_failed").body());
    return {};
  }

  std::string closing() override {
    return json_text({{"text", text_},
                      {"tokens", choices_[0].completion_tokens()},
                      {"prompt_tokens", choices_[0].prompt_tokens()},
                      {"finish_reason", finish_reason_}});
  }

 private:
  const GenerationChoices& choices_;
  std::string text_;
  std::string finish_reason_;
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
    job.params = parse_generation_params(rest, context.model.default_sampling, {"max_tokens"}, 1, request_body);
  } else {
    job.params = parse_generation_params(body, context.model.default_sampling, {"max_tokens"}, kDefaultCompletionTokens,
                                         request_body);
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

  std::vector<PromptInput> prompts = read_prompts(body, context.model.tokenizer);
  if (prompts.size() * size_t(job.params.n) > size_t(kMaxChoices))
    throw invalid_request("prompt", fmt::format("a request may ask for at most {} choices, got {} prompts x n={}",
                                                kMaxChoices, prompts.size(), job.params.n));
  info.n = job.params.n;
  if (echo && info.logprobs) job.prompt_logprobs = job.params.sampling.top_logprobs;
  job.prompt_param = "prompt";
  job.mode = OutputMode::Text;
  const bool streaming = job.params.stream;
  auto choices = std::make_unique<GenerationChoices>();
  for (PromptInput& prompt : prompts) {
    CompletionInfo::Prompt& echoed = info.prompts.emplace_back();
    if (echo) echoed.echo_text = prompt.text;
    if (echo && info.logprobs) echoed.scored_prompt = prompt.ids;
    for (int i = 0; i < job.params.n; ++i) {
      GenerationJob choice = job;
      choice.prompt = prompt.ids;
      choice.params.sampling = choice_sampling(job.params.sampling, i);
      choices->add(context, std::move(choice));
    }
  }
  choices->submit(context);
  const GenerationChoices& c = *choices;
  if (streaming) {
    respond_with_generation(res, "text/event-stream", std::move(choices),
                            std::make_unique<CompletionStreamFormatter>(std::move(info), c, context.model.tokenizer));
  } else {
    respond_with_generation(res, "application/json", std::move(choices),
                            std::make_unique<CompletionFormatter>(std::move(info), c, context.model.tokenizer));
  }
}

void handle_generate(const RouteContext& context, const std::string& request_body,
                             const httplib::Request& req, httplib::Response& res) {
  const auto arrival = std::chrono::steady_clock::now();
  const json body = parse_json_object_body(request_body);
  GenerationJob job;
  job.arrival = arrival;
  job.params = parse_generation_params(body, context.model.default_sampling, {"max_tokens"}, kDefaultCompletionTokens,
                                         request_body);
  if (job.params.stream) throw invalid_request("stream", "/generate does not stream; use /v1/completions");
  const auto prompt = optional_string(body, "prompt");
  if (!prompt) throw invalid_request("prompt", "'prompt' (a string) is required");
  if (prompt->empty()) throw invalid_request("prompt", "the prompt is empty");
  job.prompt = context.model.tokenizer.encode(*prompt, /*add_bos=*/true);
  job.prompt_param = "prompt";
  job.mode = OutputMode::Text;
  if (job.params.n != 1) throw invalid_request("n", "/generate answers with one choice; use /v1/completions for n");
  auto choices = std::make_unique<GenerationChoices>();
  choices->add(context, std::move(job));
  choices->submit(context);
  const GenerationChoices& c = *choices;
  respond_with_generation(res, "application/json", std::move(choices), std::make_unique<GenerateFormatter>(c));
}

}  // namespace tandem::server
