#pragma once
// The engine: requests in, token events out. A single step-loop thread admits waiting requests,
// runs one batched forward pass per step (prefill chunks and decodes together), samples, and
// reports each new token through the request's callback. New requests join between steps
// (continuous batching); a cancelled request leaves at the next step and its KV blocks are freed.
// The engine knows tokens only: text, chat templates and HTTP live above it.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/thread_pool.h"
#include "model/checkpoint.h"
#include "parallel/communicator.h"
#include "runtime/sampler.h"
#include "runtime/scheduler.h"
#include "runtime/worker.h"

namespace tandem {

enum class FinishReason { None, Stop, Length, Cancelled, Error };
const char* finish_reason_name(FinishReason reason);

// A prompt token's log-probability given the tokens before it, and the most likely tokens there.
struct PromptTokenLogprob {
  float logprob = 0.0f;
  std::vector<TokenLogprob> top;
};

struct TokenEvent {
  uint64_t request_id = 0;
  int32_t token = -1;          // a generated token, or -1 on a finish-only event
  float logprob = 0.0f;
  std::vector<TokenLogprob> top_logprobs;
  FinishReason finish = FinishReason::None;
  int32_t stop_token = -1;     // the stop token that ended the request (not part of the output)
  std::string error;
  int prompt_tokens = 0;
  int cached_prompt_tokens = 0;  // of prompt_tokens, those whose K/V were reused from an earlier request
  int completion_tokens = 0;
  // With GenerationRequest::prompt_logprobs, once, on the first event after the whole prompt ran:
  // entries for prompt tokens 1..n-1 (the first has nothing before it).
  std::vector<PromptTokenLogprob> prompt_logprobs;
};

struct GenerationRequest {
  std::vector<int32_t> prompt;
  int max_tokens = 0;                 // 0: up to the context limit
  SamplingParams sampling;
  std::vector<int32_t> stop_tokens;   // finish with "stop" when one is sampled
  int prompt_logprobs = -1;           // >= 0: score every prompt token, with this many alternatives
  bool prompt_only = false;           // run the prompt and generate nothing (finishes with "length")
  // Called on the engine thread for every event; it must return quickly (queue and go).
  std::function<void(const TokenEvent&)> on_event;
};

// Why submit() refused a request; the server maps these to HTTP statuses.
class RequestRejected : public std::runtime_error {
 public:
  enum class Kind { QueueFull, ContextLength, Invalid, ShuttingDown };
  RequestRejected(Kind kind, const std::string& message) : std::runtime_error(message), kind(kind) {}
  Kind kind;
};

struct EngineOptions {
  WorkerOptions worker;
  int max_waiting = 256;     // requests queued beyond the running ones; more are refused
  int context_limit = 0;     // 0: the model's max_position_embeddings
  // Samples a step's rows side by side (the CPU backend's pool, idle between forward passes); null:
  // one row after another on the engine's thread. Each row has its own sampler, so the tokens are
  // the same either way.
  ThreadPool* sampling_pool = nullptr;
};

struct EngineStats {
  int running = 0;
  int waiting = 0;
  double kv_usage = 0.0;     // fraction of KV blocks in use by requests (not counting kept prefixes)
  uint64_t prefix_cache_queries = 0;  // prompt tokens looked up in the kept prefixes (first admissions)
  uint64_t prefix_cache_hits = 0;     // of those, tokens whose K/V were reused
  uint64_t prompt_tokens = 0;      // totals since start
  uint64_t generation_tokens = 0;
  uint64_t preemptions = 0;
  uint64_t steps = 0;
};

class Engine {
 public:
  // Rank 0 of a tensor-parallel group (or the only rank). Other ranks run run_follower().
  Engine(const Gemma4Checkpoint& checkpoint, Ops& ops, Communicator& comm, const EngineOptions& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  uint64_t submit(GenerationRequest request);  // throws RequestRejected
  // Several requests taken together or not at all (the choices of one response): a group larger
  // than the slots and the queue together is Invalid, one that does not fit now QueueFull.
  std::vector<uint64_t> submit_all(std::vector<GenerationRequest> requests);
  void cancel(uint64_t request_id);
  EngineStats stats() const;
  int context_limit() const { return context_limit_; }
  int request_capacity() const { return options_.worker.max_slots + options_.max_waiting; }  // running and waiting
  int max_tokens_limit(int prompt_tokens) const { return context_limit_ - prompt_tokens; }
  void shutdown();  // finishes every request with Cancelled, stops the loop and the followers

 private:
  struct Request;
  std::unique_ptr<Request> prepare(GenerationRequest request) const;  // checks it; throws RequestRejected
  void loop();
  void step();
  void finish(Request& r, FinishReason reason, int32_t stop_token = -1, const std::string& error = {});
  void fail_all(const std::string& error);
  void publish_stats();  // the atomics stats() reads

  const Gemma4Checkpoint& checkpoint_;
  Communicator& comm_;
  EngineOptions options_;
  int context_limit_;
  int64_t vocab_size_;
  std::unique_ptr<Worker> worker_;
  std::unique_ptr<Scheduler> scheduler_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::unique_ptr<Request>> incoming_;
  std::vector<uint64_t> cancelled_;
  bool stopping_ = false;
  uint64_t next_id_ = 1;

  // Owned by the loop thread.
  std::unordered_map<uint64_t, std::unique_ptr<Request>> requests_;
  std::deque<ScheduledSequence*> waiting_;
  std::vector<ScheduledSequence*> running_;
  StepPlan plan_;
  struct SampledRow {
    ScheduledSequence* seq;
    Request* request;
    int64_t row;  // in the step's logits
    SampledToken token;
  };
  void score_prompt_token(Request& r, int token_index, std::span<const float> logits, double normalizer);
  void attach_prompt_logprobs(Request& r, TokenEvent& e);
  std::vector<SampledRow> sampled_;  // this step's rows that want a token
  std::vector<float> top_maxima_;    // scratch of top_k_order for prompt logprobs
  std::vector<int32_t> top_order_;

  std::atomic<int> stat_running_{0}, stat_waiting_{0};
  std::atomic<double> stat_kv_usage_{0.0};
  std::atomic<uint64_t> stat_prompt_{0}, stat_generated_{0}, stat_preemptions_{0}, stat_steps_{0};
  std::atomic<uint64_t> stat_reuse_queries_{0}, stat_reuse_hits_{0};
  std::thread thread_;
};

// Ranks other than 0: execute the plans rank 0 broadcasts until it says shut down.
void run_follower(const Gemma4Checkpoint& checkpoint, Ops& ops, Communicator& comm, const WorkerOptions& options);

}  // namespace tandem
