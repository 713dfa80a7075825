#pragma once
// One generation request from the HTTP side: checks the lengths against the context, makes the
// engine request (GenerationChoices submits the requests of one response together), and turns the
// engine's token events into client-ready output updates.
//
// The engine calls back on its own thread; the callback only queues the event (and observes token
// latencies) and returns. The HTTP thread that serves the request pulls updates with next(), which
// is where detokenizing, stop strings and output parsing run. Whoever holds the stream owns the
// engine request: abandon() or the destructor cancels an unfinished request, which frees its KV
// blocks at the engine's next step.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "server/generation_params.h"
#include "server/output_assembler.h"
#include "server/route_context.h"

namespace tandem::server {

// Wakes whoever reads several streams at once (GenerationChoices): every event pushed to a stream
// that shares it counts.
class StreamSignal {
 public:
  uint64_t events() const;
  void notify();
  // Returns once the count of events differs from `seen`, or after `wait`.
  void wait_past(uint64_t seen, std::chrono::milliseconds wait) const;

 private:
  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  uint64_t events_ = 0;
};

struct GenerationJob {
  std::vector<int32_t> prompt;
  std::string prompt_param;  // the request field the prompt came from ("messages", "prompt")
  GenerationParams params;
  OutputMode mode = OutputMode::Text;
  bool starts_in_reasoning = false;
  bool parse_tool_calls = true;  // chat: the request offered tools (OutputParserOptions)
  int prompt_logprobs = -1;      // GenerationRequest::prompt_logprobs
  bool prompt_only = false;      // GenerationRequest::prompt_only
  std::chrono::steady_clock::time_point arrival = std::chrono::steady_clock::now();
};

struct GeneratedToken {
  int32_t token;
  float logprob;
  std::vector<TokenLogprob> top;
};

struct GenerationUpdate {
  ParsedOutput delta;                   // output that became certain since the last update
  std::vector<GeneratedToken> tokens;   // tokens consumed since the last update (for logprobs)
  std::vector<PromptTokenLogprob> prompt_logprobs;  // once, when the job asked for them (prompt tokens 1..n-1)
  bool finished = false;
  std::string finish_reason;            // when finished without error: "stop" or "length"
  std::string error;                    // when finished by an engine error or a server shutdown
};

class GenerationStream {
 public:
  // Throws ApiError: 400 (context_length_exceeded, bad token ids), 503 shutting down. `signal`, when
  // given, is notified of every event besides the stream's own queue.
  GenerationStream(const RouteContext& context, GenerationJob job, std::shared_ptr<StreamSignal> signal = nullptr);
  ~GenerationStream();
  GenerationStream(const GenerationStream&) = delete;
  GenerationStream& operator=(const GenerationStream&) = delete;

  // Waits up to `wait` for events and returns what they produced (possibly nothing).
  GenerationUpdate next(std::chrono::milliseconds wait);
  // The client went away (or another choice of the response failed): cancel the engine request now.
  void abandon(const char* log_reason = "client_disconnected");

  bool finished() const { return finished_; }
  int prompt_tokens() const { return prompt_tokens_; }
  int completion_tokens() const { return completion_tokens_; }
  int cached_prompt_tokens() const { return cached_prompt_tokens_; }

 private:
  struct EventQueue;
  void complete(const std::string& metrics_reason, const std::string& log_reason);

  friend class GenerationChoices;
  GenerationRequest request_;  // until submitted
  bool log_note_ = true;       // false: GenerationChoices writes one note for all its choices
  std::string log_reason_;     // how it finished, for that note
  bool submitted_ = false;
  std::string prompt_param_, max_tokens_param_;  // for the submission's errors
  const RouteContext& context_;
  std::shared_ptr<EventQueue> queue_;
  OutputAssembler assembler_;
  uint64_t request_id_ = 0;
  std::chrono::steady_clock::time_point arrival_;
  int prompt_tokens_ = 0;
  int completion_tokens_ = 0;
  int cached_prompt_tokens_ = 0;
  bool finished_ = false;
  bool engine_done_ = false;
  std::vector<TokenEvent> events_;  // scratch
};

// The choices of one response, each its own engine request: n samples of a prompt, or a batch of
// prompts (completions), read together. Destroying it cancels every unfinished choice.
class GenerationChoices {
 public:
  GenerationChoices() = default;
  // Adds one more choice (throws as GenerationStream does); submit() sends them all to the engine,
  // which takes all or none: 429 when they do not fit its queue now, 400 when they never would.
  void add(const RouteContext& context, GenerationJob job);
  void submit(const RouteContext& context);

  // Waits up to `wait` for any choice's events, then returns the updates that hold something
  // (tokens, prompt scores, or the end), with their choice's index, in index order.
  std::vector<std::pair<int, GenerationUpdate>> next(std::chrono::milliseconds wait);
  // The client went away, or one choice failed: cancel the unfinished ones.
  void abandon(const char* log_reason = "client_disconnected");
  bool finished() const;

  int size() const { return int(streams_.size()); }
  const GenerationStream& operator[](int i) const { return *streams_[size_t(i)]; }

 private:
  void note_when_finished();  // several choices: one request-log note once all have finished

  std::shared_ptr<StreamSignal> signal_ = std::make_shared<StreamSignal>();
  std::vector<std::unique_ptr<GenerationStream>> streams_;
  std::chrono::steady_clock::time_point arrival_;
  bool noted_ = false;
};

}  // namespace tandem::server
