// POST /v1/chat/completions: the chat template, then generation with reasoning, content and tool
// calls separated by the output parser; streamed as chat.completion.chunk events or returned as one
// chat.completion.
#include <httplib.h>

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

class ChatStreamFormatter final : public GenerationFormatter {
 public:
  ChatStreamFormatter(ChatResponseInfo info, const GenerationStream& stream, const Tokenizer& tokenizer)
      : info_(std::move(info)), stream_(stream), tokenizer_(tokenizer) {}

  std::string opening() override { return sse_event(chunk({{"role", "assistant"}, {"content", ""}}, nullptr)); }

  std::string format(const GenerationUpdate& u) override {
    if (info_.logprobs) pending_tokens_.insert(pending_tokens_.end(), u.tokens.begin(), u.tokens.end());
    std::string out;
    json delta = json::object();
    if (!u.delta.reasoning.empty()) delta["reasoning_content"] = u.delta.reasoning;
    if (!u.delta.content.empty()) delta["content"] = u.delta.content;
    if (!u.delta.tool_calls.empty()) {
      delta["tool_calls"] = tool_calls_json(u.delta.tool_calls, tool_calls_sent_, true);
      tool_calls_sent_ += int(u.delta.tool_calls.size());
    }
    if (!delta.empty()) out += sse_event(chunk(std::move(delta), nullptr));
    if (!u.finished) return out;
    if (!u.error.empty()) return out + sse_event(error_event(u.error)) + kSseDone;
    out += sse_event(chunk(json::object(), chat_finish_reason(u.finish_reason, tool_calls_sent_ > 0)));
    if (info_.include_usage) {
      json last = base();
      last["choices"] = json::array();
      last["usage"] = usage_json(stream_.prompt_tokens(), stream_.completion_tokens(), stream_.cached_prompt_tokens());
      out += sse_event(last);
    }
    return out + kSseDone;
  }

 private:
  json base() const {
    return {{"id", info_.id}, {"object", "chat.completion.chunk"}, {"created", info_.created}, {"model", info_.model}};
  }

  // One choice with `delta`; logprobs of the tokens decoded since the last chunk ride along.
  json chunk(json delta, json finish_reason) {
    json choice = {{"index", 0}, {"delta", std::move(delta)}, {"logprobs", nullptr}, {"finish_reason", finish_reason}};
    if (info_.logprobs && !pending_tokens_.empty()) {
      choice["logprobs"] = {{"content", chat_logprobs_content(pending_tokens_, tokenizer_)}};
      pending_tokens_.clear();
    }
    json c = base();
    c["choices"] = json::array({std::move(choice)});
    if (info_.include_usage) c["usage"] = nullptr;
    return c;
  }

  ChatResponseInfo info_;
  const GenerationStream& stream_;
  const Tokenizer& tokenizer_;
  std::vector<GeneratedToken> pending_tokens_;
  int tool_calls_sent_ = 0;
};

class ChatCompletionFormatter final : public GenerationFormatter {
 public:
  ChatCompletionFormatter(ChatResponseInfo info, const GenerationStream& stream, const Tokenizer& tokenizer)
      : info_(std::move(info)), stream_(stream), tokenizer_(tokenizer) {}

  std::string format(const GenerationUpdate& u) override {
    output_.append(ParsedOutput(u.delta));
    if (info_.logprobs) tokens_.insert(tokens_.end(), u.tokens.begin(), u.tokens.end());
    if (!u.finished) return {};
    // The status line went out when generation began, so a late failure can only be told in the body.
    if (!u.error.empty()) return json_text(error_event(u.error));
    json message = {{"role", "assistant"}};
    const bool calls = !output_.tool_calls.empty();
    message["content"] = calls && output_.content.empty() ? json(nullptr) : json(output_.content);
    if (!output_.reasoning.empty()) message["reasoning_content"] = output_.reasoning;
    if (calls) message["tool_calls"] = tool_calls_json(output_.tool_calls, 0, false);
    json choice = {{"index", 0},
                   {"message", std::move(message)},
                   {"logprobs", nullptr},
                   {"finish_reason", chat_finish_reason(u.finish_reason, calls)}};
    if (info_.logprobs) choice["logprobs"] = {{"content", chat_logprobs_content(tokens_, tokenizer_)}};
    const json response = {{"id", info_.id},
                           {"object", "chat.completion"},
                           {"created", info_.created},
                           {"model", info_.model},
                           {"choices", json::array({std::move(choice)})},
                           {"usage", usage_json(stream_.prompt_tokens(), stream_.completion_tokens(), stream_.cached_prompt_tokens())}};
    return json_text(response);
  }

 private:
  ChatResponseInfo info_;
  const GenerationStream& stream_;
  const Tokenizer& tokenizer_;
  ParsedOutput output_;
  std::vector<GeneratedToken> tokens_;
};

}  // namespace

void handle_chat_completions(const RouteContext& context, const std::string& request_body,
                             const httplib::Request& req, httplib::Response& res) {
  const auto arrival = std::chrono::steady_clock::now();
  const json body = parse_json_object_body(request_body);
  check_model_name(body, context.model.name);
  ChatRequest chat = parse_chat_request(body, context.model.default_sampling);

  GenerationJob job;
  job.arrival = arrival;
  // The rendered prompt starts with <bos> itself, so the tokenizer adds nothing.
  job.prompt = context.model.tokenizer.encode(chat.prompt, /*add_bos=*/false);
  job.prompt_param = "messages";
  job.params = chat.params;
  job.mode = OutputMode::Chat;
  job.starts_in_reasoning = chat.starts_in_reasoning;
  job.parse_tool_calls = chat.tools_offered;
  auto stream = std::make_unique<GenerationStream>(context, std::move(job));

  ChatResponseInfo info;
  info.model = context.model.name;
  info.logprobs = chat.logprobs;
  info.include_usage = chat.params.include_usage;
  const GenerationStream& s = *stream;
  if (chat.params.stream) {
    respond_with_generation(res, "text/event-stream", std::move(stream),
                            std::make_unique<ChatStreamFormatter>(std::move(info), s, context.model.tokenizer));
  } else {
    respond_with_generation(res, "application/json", std::move(stream),
                            std::make_unique<ChatCompletionFormatter>(std::move(info), s, context.model.tokenizer));
  }
}

}  // namespace tandem::server
