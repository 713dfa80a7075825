// POST /v1/chat/completions: the chat template, then generation with reasoning, content and tool
// calls separated by the output parser; streamed as chat.completion.chunk events or returned as one
// chat.completion.
#include <httplib.h>

#include <algorithm>

#include "server/api_error.h"
#include "server/chat_request.h"
#include "server/generation_response.h"
#include "server/json_fields.h"
#include "server/openai_format.h"
#include "server/routes.h"

namespace tandem::server {

using nlohmann::json;

namespace {

struct ChatResponseInfo {
  std::string id = random_id("chatcmpl-");
  int64_t created = unix_time_now();
  std::string model;
  bool logprobs = false;
  bool include_usage = false;
};

// "stop" becomes "tool_calls" when the answer ended after calling tools, as OpenAI reports it.
std::string chat_finish_reason(const std::string& reason, bool made_tool_calls) {
  return reason == "stop" && made_tool_calls ? "tool_calls" : reason;
}

json error_event(const std::string& message) {
  return ApiError(500, "server_error", message, {}, "generation_failed").body();
}

// Usage over the choices: the prompt once (every choice ran the same one; cached as far as any choice
// found it: the later ones copy the first one's), the completions of all.
json chat_usage(const GenerationChoices& choices) {
  int completion = 0, cached = 0;
  for (int i = 0; i < choices.size(); ++i) {
    completion += choices[i].completion_tokens();
    cached = std::max(cached, choices[i].cached_prompt_tokens());
  }
  return usage_json(choices[0].prompt_tokens(), completion, cached);
}

class ChatStreamFormatter final : public GenerationFormatter {
 public:
  ChatStreamFormatter(ChatResponseInfo info, const GenerationChoices& choices, const Tokenizer& tokenizer)
      : info_(std::move(info)), choices_(choices), tokenizer_(tokenizer), state_(size_t(choices.size())) {}

  std::string opening() override {
    std::string out;
    for (int i = 0; i < choices_.size(); ++i) out += sse_event(chunk(i, {{"role", "assistant"}, {"content", ""}}, nullptr));
    return out;
  }

  std::string format(int choice, const GenerationUpdate& u) override {
    ChoiceState& state = state_[size_t(choice)];
    if (info_.logprobs) state.pending_tokens.insert(state.pending_tokens.end(), u.tokens.begin(), u.tokens.end());
    std::string out;
    json delta = json::object();
    if (!u.delta.reasoning.empty()) delta["reasoning_content"] = u.delta.reasoning;
    if (!u.delta.content.empty()) delta["content"] = u.delta.content;
    if (!u.delta.tool_calls.empty()) {
      delta["tool_calls"] = tool_calls_json(u.delta.tool_calls, state.tool_calls_sent, true);
      state.tool_calls_sent += int(u.delta.tool_calls.size());
    }
    if (!delta.empty()) out += sse_event(chunk(choice, std::move(delta), nullptr));
    if (!u.finished) return out;
    if (!u.error.empty()) return out + sse_event(error_event(u.error)) + kSseDone;
    return out + sse_event(chunk(choice, json::object(), chat_finish_reason(u.finish_reason, state.tool_calls_sent > 0)));
  }

  std::string closing() override {
    if (!info_.include_usage) return kSseDone;
    json last = base();
    last["choices"] = json::array();
    last["usage"] = chat_usage(choices_);
    return sse_event(last) + kSseDone;
  }

 private:
  struct ChoiceState {
    std::vector<GeneratedToken> pending_tokens;  // for logprobs: decoded since the choice's last chunk
    int tool_calls_sent = 0;
  };

  json base() const {
    return {{"id", info_.id}, {"object", "chat.completion.chunk"}, {"created", info_.created}, {"model", info_.model}};
  }

  // One choice with `delta`; logprobs of the tokens decoded since the last chunk ride along.
  json chunk(int index, json delta, json finish_reason) {
    json choice = {{"index", index}, {"delta", std::move(delta)}, {"logprobs", nullptr}, {"finish_reason", finish_reason}};
    std::vector<GeneratedToken>& pending = state_[size_t(index)].pending_tokens;
    if (info_.logprobs && !pending.empty()) {
      choice["logprobs"] = {{"content", chat_logprobs_content(pending, tokenizer_)}};
      pending.clear();
    }
    json c = base();
    c["choices"] = json::array({std::move(choice)});
    if (info_.include_usage) c["usage"] = nullptr;
    return c;
  }

  ChatResponseInfo info_;
  const GenerationChoices& choices_;
  const Tokenizer& tokenizer_;
  std::vector<ChoiceState> state_;
};

class ChatCompletionFormatter final : public GenerationFormatter {
 public:
  ChatCompletionFormatter(ChatResponseInfo info, const GenerationChoices& choices, const Tokenizer& tokenizer)
      : info_(std::move(info)), choices_(choices), tokenizer_(tokenizer), state_(size_t(choices.size())) {}

  std::string format(int choice, const GenerationUpdate& u) override {
    ChoiceState& state = state_[size_t(choice)];
    state.output.append(ParsedOutput(u.delta));
    if (info_.logprobs) state.tokens.insert(state.tokens.end(), u.tokens.begin(), u.tokens.end());
    if (u.finished) state.finish_reason = u.finish_reason;
    // The status line went out when generation began, so a late failure can only be told in the body.
    if (u.finished && !u.error.empty()) return json_text(error_event(u.error));
    return {};
  }

  std::string closing() override {
    json choices = json::array();
    for (size_t i = 0; i < state_.size(); ++i) {
      const ChoiceState& state = state_[i];
      json message = {{"role", "assistant"}};
      const bool calls = !state.output.tool_calls.empty();
      message["content"] = calls && state.output.content.empty() ? json(nullptr) : json(state.output.content);
      if (!state.output.reasoning.empty()) message["reasoning_content"] = state.output.reasoning;
      if (calls) message["tool_calls"] = tool_calls_json(state.output.tool_calls, 0, false);
      json choice = {{"index", i},
                     {"message", std::move(message)},
                     {"logprobs", nullptr},
                     {"finish_reason", chat_finish_reason(state.finish_reason, calls)}};
      if (info_.logprobs) choice["logprobs"] = {{"content", chat_logprobs_content(state.tokens, tokenizer_)}};
      choices.push_back(std::move(choice));
    }
    const json response = {{"id", info_.id},
                           {"object", "chat.completion"},
                           {"created", info_.created},
                           {"model", info_.model},
                           {"choices", std::move(choices)},
                           {"usage", chat_usage(choices_)}};
    return json_text(response);
  }

 private:
  struct ChoiceState {
    ParsedOutput output;
    std::vector<GeneratedToken> tokens;
    std::string finish_reason;
  };

  ChatResponseInfo info_;
  const GenerationChoices& choices_;
  const Tokenizer& tokenizer_;
  std::vector<ChoiceState> state_;
};

}  // namespace

void handle_chat_completions(const RouteContext& context, const std::string& request_body,
                             const httplib::Request& req, httplib::Response& res) {
  const auto arrival = std::chrono::steady_clock::now();
  const json body = parse_json_object_body(request_body);
  check_model_name(body, context.model.name);
  ChatRequest chat = parse_chat_request(body, context.model.default_sampling, request_body);

  GenerationJob job;
  job.arrival = arrival;
  // The rendered prompt starts with <bos> itself, so the tokenizer adds nothing.
  job.prompt = context.model.tokenizer.encode(chat.prompt, /*add_bos=*/false);
  job.prompt_param = "messages";
  job.params = chat.params;
  job.mode = OutputMode::Chat;
  job.starts_in_reasoning = chat.starts_in_reasoning;
  job.parse_tool_calls = chat.tools_offered;
  auto choices = std::make_unique<GenerationChoices>();
  for (int i = 0; i < chat.params.n; ++i) {
    GenerationJob choice = job;
    choice.params.sampling = choice_sampling(job.params.sampling, i);
    choices->add(context, std::move(choice));
  }

  ChatResponseInfo info;
  info.model = context.model.name;
  info.logprobs = chat.logprobs;
  info.include_usage = chat.params.include_usage;
  choices->submit(context);
  const GenerationChoices& c = *choices;
  if (chat.params.stream) {
    respond_with_generation(res, "text/event-stream", std::move(choices),
                            std::make_unique<ChatStreamFormatter>(std::move(info), c, context.model.tokenizer));
  } else {
    respond_with_generation(res, "application/json", std::move(choices),
                            std::make_unique<ChatCompletionFormatter>(std::move(info), c, context.model.tokenizer));
  }
}

}  // namespace tandem::server
