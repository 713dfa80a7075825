#include "server/generation_stream.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>

#include "server/api_error.h"
#include "server/request_log.h"

namespace tandem::server {

using Clock = std::chrono::steady_clock;

struct GenerationStream::EventQueue {
  std::mutex mutex;
  std::condition_variable ready;
  std::vector<TokenEvent> events;
  ServerMetrics* metrics = nullptr;
  std::shared_ptr<StreamSignal> signal;
  Clock::time_point arrival, last_token;
  bool first_token_seen = false;

  // On the engine thread: note the latency, queue the event, wake the HTTP thread.
  void push(const TokenEvent& event) {
    if (event.token >= 0) {
      const Clock::time_point now = Clock::now();
      if (!first_token_seen) metrics->observe_time_to_first_token(std::chrono::duration<double>(now - arrival).count());
      else metrics->observe_inter_token_latency(std::chrono::duration<double>(now - last_token).count());
      first_token_seen = true;
      last_token = now;
    }
    {
      std::lock_guard lock(mutex);
      events.push_back(event);
    }
    ready.notify_one();
    if (signal) signal->notify();
  }
};

uint64_t StreamSignal::events() const {
  std::lock_guard lock(mutex_);
  return events_;
}

void StreamSignal::notify() {
  {
    std::lock_guard lock(mutex_);
    ++events_;
  }
  changed_.notify_all();
}

void StreamSignal::wait_past(uint64_t seen, std::chrono::milliseconds wait) const {
  std::unique_lock lock(mutex_);
  changed_.wait_for(lock, wait, [&] { return events_ != seen; });
}

namespace {

ApiError rejected_to_api_error(const RequestRejected& e, const std::string& prompt_param,
                               const std::string& max_tokens_param) {
  switch (e.kind) {
    case RequestRejected::Kind::QueueFull: return ApiError(429, "rate_limit_error", e.what(), {}, "queue_full");
    case RequestRejected::Kind::ContextLength: return context_length_exceeded(max_tokens_param, e.what());
    case RequestRejected::Kind::ShuttingDown: return ApiError(503, "server_error", e.what(), {}, "shutting_down");
    case RequestRejected::Kind::Invalid: break;
  }
  return invalid_request(prompt_param, e.what());
}

void check_lengths(const GenerationJob& job, int context_limit) {
  const int prompt = int(job.prompt.size());
  if (prompt == 0) throw invalid_request(job.prompt_param, "the prompt is empty");
  if (job.prompt_only) {  // nothing is generated: the prompt may take the whole context
    if (prompt > context_limit)
      throw context_length_exceeded(job.prompt_param,
                                    fmt::format("this model's maximum context length is {} tokens, but the prompt has "
                                                "{} tokens; shorten the {}",
                                                context_limit, prompt, job.prompt_param));
    return;
  }
  if (prompt >= context_limit)
    throw context_length_exceeded(
        job.prompt_param, fmt::format("this model's maximum context length is {} tokens, but the prompt has {} tokens "
                                      "(and at least one must be generated); shorten the {}",
                                      context_limit, prompt, job.prompt_param));
  if (job.params.max_tokens > 0 && int64_t(prompt) + job.params.max_tokens > context_limit)
    throw context_length_exceeded(
        job.params.max_tokens_param,
        fmt::format("this model's maximum context length is {} tokens, but {} were requested ({} in the prompt, "
                    "{} to generate); lower '{}' to at most {}",
                    context_limit, int64_t(prompt) + job.params.max_tokens, prompt, job.params.max_tokens,
                    job.params.max_tokens_param, context_limit - prompt));
}

// A chat answer held to JSON is all content: no control token can occur in it, and text in its strings
// that spells a marker ("<turn|>") must not be read as one, so it is not parsed.
OutputMode assembled_as(const GenerationJob& job) {
  const bool json = job.params.json_format == "json_object" || job.params.json_format == "json_schema";
  return json ? OutputMode::Text : job.mode;
}

}  // namespace

GenerationStream::GenerationStream(const RouteContext& context, GenerationJob job, std::shared_ptr<StreamSignal> signal)
    : context_(context),
      queue_(std::make_shared<EventQueue>()),
      assembler_(context.model.tokenizer, assembled_as(job), job.params.stop, job.params.skip_special_tokens,
                 job.starts_in_reasoning, job.parse_tool_calls, job.params.min_tokens),
      arrival_(job.arrival),
      prompt_tokens_(int(job.prompt.size())) {
  Engine& engine = context.model.engine;
  check_lengths(job, engine.context_limit());
  for (int32_t t : job.prompt)
    if (t < 0 || t >= context.model.tokenizer.vocab_size())
      throw invalid_request(job.prompt_param, fmt::format("token id {} is outside the vocabulary (0..{})", t,
                                                          context.model.tokenizer.vocab_size() - 1));
  for (const auto& [t, bias] : job.params.sampling.logit_bias)
    if (t >= context.model.tokenizer.vocab_size())
      throw invalid_request("logit_bias", fmt::format("logit_bias token id {} is outside the vocabulary (0..{})", t,
                                                      context.model.tokenizer.vocab_size() - 1));
  queue_->metrics = &context.metrics;
  queue_->signal = std::move(signal);
  queue_->arrival = job.arrival;

  GenerationRequest& request = request_;
  request.prompt = std::move(job.prompt);
  request.max_tokens = job.params.max_tokens;
  request.sampling = job.params.sampling;
  request.prompt_logprobs = job.prompt_logprobs;
  request.prompt_only = job.prompt_only;
  if (!job.params.ignore_eos)
    request.stop_tokens.assign(context.model.stop_token_ids.begin(), context.model.stop_token_ids.end());
  if (job.params.min_tokens > 0) {
    request.sampling.min_tokens = job.params.min_tokens;
    request.sampling.min_tokens_blocked = request.stop_tokens;
  }
  if (!job.params.json_format.empty()) {
    request.sampling.json_vocabulary = context.model.token_bytes;
    request.sampling.json_grammar = job.params.json_grammar;
    request.sampling.json_end_tokens = request.stop_tokens;
  }
  // The engine may outlive this stream's interest in the request (a cancelled request still gets its
  // finish event), so the callback holds the queue, never the stream.
  request.on_event = [queue = queue_](const TokenEvent& event) { queue->push(event); };
  prompt_param_ = job.prompt_param;
  max_tokens_param_ = job.params.max_tokens_param;
  context.active.enter();
}

GenerationStream::~GenerationStream() {
  if (submitted_ && !finished_) abandon();
  context_.active.leave();
}

void GenerationStream::complete(const std::string& metrics_reason, const std::string& log_reason) {
  finished_ = true;
  const double e2e = std::chrono::duration<double>(Clock::now() - arrival_).count();
  context_.metrics.observe_request_end(e2e, metrics_reason, prompt_tokens_, completion_tokens_);
  log_reason_ = log_reason;
  if (log_note_)
    request_log_note(fmt::format("prompt_tokens={} completion_tokens={} finish={} e2e={:.3f}s", prompt_tokens_,
                                 completion_tokens_, log_reason, e2e));
}

void GenerationStream::abandon(const char* log_reason) {
  if (finished_ || !submitted_) return;
  if (!engine_done_) context_.model.engine.cancel(request_id_);
  engine_done_ = true;
  complete("abort", log_reason);
}

GenerationUpdate GenerationStream::next(std::chrono::milliseconds wait) {
  GenerationUpdate update;
  if (finished_) {
    update.finished = true;
    return update;
  }
  events_.clear();
  {
    std::unique_lock lock(queue_->mutex);
    queue_->ready.wait_for(lock, wait, [&] { return !queue_->events.empty(); });
    events_.swap(queue_->events);
  }
  for (TokenEvent& e : events_) {
    if (finished_) break;  // events after a stop string belong to a request already cancelled
    cached_prompt_tokens_ = std::max(cached_prompt_tokens_, e.cached_prompt_tokens);
    if (!e.prompt_logprobs.empty()) update.prompt_logprobs = std::move(e.prompt_logprobs);
    if (e.token >= 0) {
      ++completion_tokens_;
      update.tokens.push_back({e.token, e.logprob, e.top_logprobs});
      update.delta.append(assembler_.push(e.token));
      if (assembler_.stopped_by_string()) {
        context_.model.engine.cancel(request_id_);
        engine_done_ = true;
        update.finish_reason = "stop";
        complete("stop", "stop_string");
      }
    }
    if (e.finish == FinishReason::None || finished_) continue;
    engine_done_ = true;
    // The engine's count includes a stop token, which sends no token event.
    completion_tokens_ = std::max(completion_tokens_, e.completion_tokens);
    update.delta.append(assembler_.finish());
    switch (e.finish) {
      case FinishReason::Stop:
        update.finish_reason = "stop";
        complete("stop", "stop");
        break;
      case FinishReason::Length:
        update.finish_reason = "length";
        complete("length", "length");
        break;
      case FinishReason::Cancelled:
        update.error = "the request was cancelled: the server is shutting down";
        complete("abort", "cancelled");
        break;
      default:
        update.error = "generation failed: " + (e.error.empty() ? std::string("engine error") : e.error);
        complete("abort", "error");
        break;
    }
  }
  update.finished = finished_;
  return update;
}

void GenerationChoices::add(const RouteContext& context, GenerationJob job) {
  if (streams_.empty()) arrival_ = job.arrival;
  streams_.push_back(std::make_unique<GenerationStream>(context, std::move(job), signal_));
  if (streams_.size() == 2) streams_.front()->log_note_ = false;
  if (streams_.size() >= 2) streams_.back()->log_note_ = false;
}

void GenerationChoices::note_when_finished() {
  if (noted_ || streams_.size() < 2 || !finished()) return;
  noted_ = true;
  int completion = 0;
  std::vector<std::string> reasons;
  for (const auto& s : streams_) {
    completion += s->completion_tokens();
    if (std::find(reasons.begin(), reasons.end(), s->log_reason_) == reasons.end()) reasons.push_back(s->log_reason_);
  }
  request_log_note(fmt::format("choices={} completion_tokens={} finish={} e2e={:.3f}s", streams_.size(), completion,
                               fmt::join(reasons, ","),
                               std::chrono::duration<double>(Clock::now() - arrival_).count()));
}

void GenerationChoices::submit(const RouteContext& context) {
  if (const int capacity = context.model.engine.request_capacity(); size() > capacity)
    throw invalid_request("n", fmt::format("the request asks for {} choices, more than this server runs and queues at "
                                           "once ({}: --parallel and --max-queue)",
                                           size(), capacity));
  std::vector<GenerationRequest> requests;
  for (auto& s : streams_) requests.push_back(std::move(s->request_));
  std::vector<uint64_t> ids;
  try {
    ids = context.model.engine.submit_all(std::move(requests));
  } catch (const RequestRejected& e) {
    throw rejected_to_api_error(e, streams_.front()->prompt_param_, streams_.front()->max_tokens_param_);
  }
  for (size_t i = 0; i < streams_.size(); ++i) {
    streams_[i]->request_id_ = ids[i];
    streams_[i]->submitted_ = true;
  }
}

std::vector<std::pair<int, GenerationUpdate>> GenerationChoices::next(std::chrono::milliseconds wait) {
  std::vector<std::pair<int, GenerationUpdate>> updates;
  // The count is read before the queues: an event pushed after it always ends the wait.
  const uint64_t seen = signal_->events();
  const auto collect = [&] {
    for (int i = 0; i < size(); ++i) {
      if (streams_[size_t(i)]->finished()) continue;
      GenerationUpdate u = streams_[size_t(i)]->next(std::chrono::milliseconds(0));
      if (u.finished || !u.tokens.empty() || !u.prompt_logprobs.empty() || !u.delta.empty())
        updates.emplace_back(i, std::move(u));
    }
  };
  collect();
  if (updates.empty() && !finished()) {
    signal_->wait_past(seen, wait);
    collect();
  }
  note_when_finished();
  return updates;
}

void GenerationChoices::abandon(const char* log_reason) {
  for (auto& s : streams_) s->abandon(log_reason);
  note_when_finished();
}

bool GenerationChoices::finished() const {
  return std::all_of(streams_.begin(), streams_.end(), [](const auto& s) { return s->finished(); });
}

}  // namespace tandem::server
