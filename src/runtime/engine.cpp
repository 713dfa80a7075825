#include "runtime/engine.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <utility>

#include "core/error.h"

namespace tandem {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::None: return "none";
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Cancelled: return "cancelled";
    case FinishReason::Error: return "error";
  }
  return "?";
}

struct Engine::Request {
  uint64_t id = 0;
  ScheduledSequence seq;
  int prompt_tokens = 0;
  int max_tokens = 0;
  std::vector<int32_t> stop_tokens;
  std::function<void(const TokenEvent&)> on_event;
  SamplingParams sampling;
  std::unique_ptr<Sampler> sampler;
  int generated = 0;
  bool finished = false;
  int prompt_logprobs = -1;
  bool prompt_only = false;
  std::vector<PromptTokenLogprob> prompt_scores;  // for prompt tokens 1..n-1, filled as chunks run
  bool prompt_scores_sent = false;
};

namespace {

void broadcast_plan(Communicator& comm, const StepPlan& plan) {
  std::vector<uint8_t> bytes = plan.serialize();
  uint64_t size = bytes.size();
  comm.broadcast_idle_wait(&size, sizeof size, 0);
  comm.broadcast(bytes.data(), bytes.size(), 0);
}

StepPlan receive_plan(Communicator& comm) {
  uint64_t size = 0;
  comm.broadcast_idle_wait(&size, sizeof size, 0);  // between steps the followers wait here
  std::vector<uint8_t> bytes(size);
  comm.broadcast(bytes.data(), bytes.size(), 0);
  return StepPlan::deserialize(bytes.data(), bytes.size());
}

}  // namespace

Engine::Engine(const Gemma4Checkpoint& checkpoint, Ops& ops, Communicator& comm, const EngineOptions& options)
    : checkpoint_(checkpoint), comm_(comm), options_(options) {
  const Gemma4Config& c = checkpoint.config;
  context_limit_ = options.context_limit > 0 ? std::min(options.context_limit, c.max_position_embeddings)
                                             : c.max_position_embeddings;
  vocab_size_ = c.vocab_size;
  worker_ = std::make_unique<Worker>(checkpoint, ops, comm, options.worker);
  scheduler_ = std::make_unique<Scheduler>(*worker_, options.worker.max_slots, options.worker.max_step_tokens,
                                           options.worker.prefix_reuse);
  // A sequence can never hold more positions than the full-attention pool has blocks for.
  const KvCache& cache = worker_->cache();
  if (cache.options().full_blocks > 0)
    context_limit_ = int(std::min<int64_t>(context_limit_, cache.options().full_blocks * cache.options().block_size));
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() { shutdown(); }

void Engine::shutdown() {
  {
    std::lock_guard lock(mutex_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

uint64_t Engine::submit(GenerationRequest request) {
  std::vector<GenerationRequest> one;
  one.push_back(std::move(request));
  return submit_all(std::move(one)).front();
}

std::unique_ptr<Engine::Request> Engine::prepare(GenerationRequest request) const {
  const int prompt = int(request.prompt.size());
  if (prompt == 0) throw RequestRejected(RequestRejected::Kind::Invalid, "the prompt is empty");
  for (int32_t t : request.prompt)
    if (t < 0 || t >= vocab_size_)
      throw RequestRejected(RequestRejected::Kind::Invalid,
                            fmt::format("token id {} is outside the vocabulary (0..{})", t, vocab_size_ - 1));
  if (request.max_tokens < 0) throw RequestRejected(RequestRejected::Kind::Invalid, "max_tokens must be positive");
  constexpr int kMaxPromptLogprobs = 20;
  if (request.prompt_logprobs > kMaxPromptLogprobs)
    throw RequestRejected(RequestRejected::Kind::Invalid,
                          fmt::format("prompt logprobs can list at most {} alternatives", kMaxPromptLogprobs));
  if (request.prompt_only && prompt > context_limit_)
    throw RequestRejected(RequestRejected::Kind::ContextLength,
                          fmt::format("this model's maximum context length is {} tokens, but the prompt has {} tokens",
                                      context_limit_, prompt));
  if (!request.prompt_only && prompt >= context_limit_)
    throw RequestRejected(RequestRejected::Kind::ContextLength,
                          fmt::format("this model's maximum context length is {} tokens, but the prompt has {} "
                                      "tokens (and at least one must be generated)",
                                      context_limit_, prompt));
  const int max_tokens = request.prompt_only ? 0 : request.max_tokens > 0 ? request.max_tokens : context_limit_ - prompt;
  if (prompt + max_tokens > context_limit_)
    throw RequestRejected(RequestRejected::Kind::ContextLength,
                          fmt::format("this model's maximum context length is {} tokens, but {} were requested "
                                      "({} in the prompt, {} to generate)",
                                      context_limit_, prompt + max_tokens, prompt, max_tokens));

  auto r = std::make_unique<Request>();
  r->seq.tokens = std::move(request.prompt);
  r->prompt_tokens = prompt;
  r->max_tokens = max_tokens;
  r->stop_tokens = std::move(request.stop_tokens);
  r->on_event = std::move(request.on_event);
  r->sampling = request.sampling;
  r->sampler = std::make_unique<Sampler>(request.sampling, r->seq.tokens);
  r->prompt_logprobs = std::max(-1, request.prompt_logprobs);
  r->prompt_only = request.prompt_only;
  r->seq.prompt_length = prompt;
  r->seq.score_prompt = r->prompt_logprobs >= 0;
  if (r->seq.score_prompt) r->prompt_scores.resize(size_t(prompt - 1));
  return r;
}

std::vector<uint64_t> Engine::submit_all(std::vector<GenerationRequest> requests) {
  std::vector<std::unique_ptr<Request>> prepared;
  for (GenerationRequest& request : requests) prepared.push_back(prepare(std::move(request)));
  const int capacity = request_capacity();
  if (int(prepared.size()) > capacity)
    throw RequestRejected(RequestRejected::Kind::Invalid,
                          fmt::format("{} requests at once are more than the server runs and queues together ({} "
                                      "sequences and {} waiting)",
                                      prepared.size(), options_.worker.max_slots, options_.max_waiting));
  std::vector<uint64_t> ids;
  std::lock_guard lock(mutex_);
  if (stopping_) throw RequestRejected(RequestRejected::Kind::ShuttingDown, "the server is shutting down");
  // Open requests against the slots plus the queue: one that arrives while slots are free is not
  // queued, even before the loop has admitted it (counting only arrivals refused 3 of 4 requests sent
  // at once to an idle server with --parallel 4 --max-queue 1).
  const int open = int(incoming_.size()) + stat_waiting_.load() + stat_running_.load();
  if (open + int(prepared.size()) > capacity)
    throw RequestRejected(RequestRejected::Kind::QueueFull,
                          fmt::format("the queue is full ({} requests waiting); try again later", options_.max_waiting));
  for (auto& r : prepared) {
    r->id = r->seq.id = next_id_++;
    ids.push_back(r->id);
    incoming_.push_back(std::move(r));
  }
  wake_.notify_all();
  return ids;
}

void Engine::cancel(uint64_t request_id) {
  std::lock_guard lock(mutex_);
  cancelled_.push_back(request_id);
  wake_.notify_all();
}

EngineStats Engine::stats() const {
  EngineStats s;
  s.running = stat_running_.load();
  s.waiting = stat_waiting_.load();
  s.kv_usage = stat_kv_usage_.load();
  s.prompt_tokens = stat_prompt_.load();
  s.generation_tokens = stat_generated_.load();
  s.preemptions = stat_preemptions_.load();
  s.steps = stat_steps_.load();
  s.prefix_cache_queries = stat_reuse_queries_.load();
  s.prefix_cache_hits = stat_reuse_hits_.load();
  return s;
}

void Engine::finish(Request& r, FinishReason reason, int32_t stop_token, const std::string& error) {
  if (r.finished) return;
  r.finished = true;
  if (r.seq.slot >= 0) {
    // Requests end between steps, so the slot's cache holds exactly their computed tokens; not
    // after a failed step, whose writes may be partial.
    scheduler_->end(r.seq, reason != FinishReason::Error);
    running_.erase(std::remove(running_.begin(), running_.end(), &r.seq), running_.end());
  } else {
    waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), &r.seq), waiting_.end());
  }
  TokenEvent e;
  e.request_id = r.id;
  e.finish = reason;
  e.stop_token = stop_token;
  e.error = error;
  e.prompt_tokens = r.prompt_tokens;
  e.cached_prompt_tokens = std::max(0, r.seq.reused);
  e.completion_tokens = r.generated;
  attach_prompt_logprobs(r, e);
  if (r.on_event) r.on_event(e);
}

void Engine::attach_prompt_logprobs(Request& r, TokenEvent& e) {
  if (!r.seq.score_prompt || r.prompt_scores_sent || r.seq.computed < r.prompt_tokens) return;
  e.prompt_logprobs = std::move(r.prompt_scores);
  r.prompt_scores_sent = true;
}

void Engine::score_prompt_token(Request& r, int token_index, std::span<const float> logits, double normalizer) {
  if (r.prompt_scores_sent) return;  // recomputed after a preemption: already reported
  PromptTokenLogprob& s = r.prompt_scores[size_t(token_index - 1)];
  s.logprob = float(double(logits[size_t(r.seq.tokens[size_t(token_index)])]) - normalizer);
  s.top.clear();
  if (r.prompt_logprobs == 0) return;
  top_k_order(logits, size_t(r.prompt_logprobs), top_maxima_, top_order_);
  for (int32_t id : top_order_) s.top.push_back({id, float(double(logits[size_t(id)]) - normalizer)});
}

void Engine::loop() {
  for (;;) {
    std::vector<uint64_t> cancelled;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] {
        // A finished sequence's blocks go back at the next plan, even with nothing else to do.
        return stopping_ || !incoming_.empty() || !cancelled_.empty() || !running_.empty() || !waiting_.empty() ||
               scheduler_->has_releases();
      });
      if (stopping_) break;
      while (!incoming_.empty()) {
        std::unique_ptr<Request> r = std::move(incoming_.front());
        incoming_.pop_front();
        waiting_.push_back(&r->seq);
        const uint64_t id = r->id;
        requests_.emplace(id, std::move(r));
      }
      cancelled.swap(cancelled_);
      stat_waiting_ = int(waiting_.size());
    }
    for (uint64_t id : cancelled) {
      auto it = requests_.find(id);
      if (it == requests_.end()) continue;
      finish(*it->second, FinishReason::Cancelled);
      requests_.erase(it);
    }
    if (!cancelled.empty()) publish_stats();
    if (running_.empty() && waiting_.empty() && !scheduler_->has_releases()) continue;
    try {
      step();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tandem: engine step failed: %s\n", e.what());
      if (comm_.size() > 1) comm_.abort_job(1);  // the other ranks are mid-collective: end the job
      fail_all(e.what());
    }
  }
  fail_all("");  // shutting down: every open request ends as cancelled
  if (comm_.size() > 1) {
    StepPlan bye;
    bye.command = StepPlan::Shutdown;
    broadcast_plan(comm_, bye);
  }
}

void Engine::fail_all(const std::string& error) {
  std::vector<uint64_t> ids;
  for (auto& [id, r] : requests_) ids.push_back(id);
  for (uint64_t id : ids) finish(*requests_[id], error.empty() ? FinishReason::Cancelled : FinishReason::Error, -1, error);
  requests_.clear();
  std::deque<std::unique_ptr<Request>> never_started;
  {
    std::lock_guard lock(mutex_);
    never_started.swap(incoming_);
  }
  for (auto& r : never_started) {  // callbacks run outside the lock: they may call back in
    TokenEvent e;
    e.request_id = r->id;
    e.finish = FinishReason::Cancelled;
    if (r->on_event) r->on_event(e);
  }
  // Slots and blocks of the dropped sequences go back at the next plan (Scheduler::end).
}

void Engine::step() {
  std::vector<ScheduledSequence*> planned = scheduler_->plan(waiting_, running_, plan_);
  // With tensor parallelism, each rank sends only its largest logits per row to sampling: enough
  // for greedy (1), for top-k (k) and for the top log-probabilities; sampling without top-k looks
  // at the best kWideCandidates per rank. A request whose biases or penalties change the row gets
  // whole rows: any token may end up first once they apply.
  constexpr int kWideCandidates = 1024;
  for (size_t i = 0; i < planned.size(); ++i) {
    if (plan_.sequences[i].logit_rows == 0) continue;
    if (planned[i]->score_prompt) {  // any token's logit and the normalizer: whole rows
      plan_.candidates = std::numeric_limits<int>::max();
      plan_.need_log_normalizers = 1;
    }
    const SamplingParams& p = requests_.at(planned[i]->id)->sampling;
    const int wanted = p.adjusts_logits() ? std::numeric_limits<int>::max()
                       : p.greedy()       ? 1
                                          : (p.top_k > 0 ? p.top_k : kWideCandidates);
    plan_.candidates = std::max({plan_.candidates, wanted, p.logprobs ? p.top_logprobs : 0});
    if (p.logprobs) plan_.need_log_normalizers = 1;
  }
  if (comm_.size() > 1) broadcast_plan(comm_, plan_);
  worker_->execute(plan_);
  const std::span<const float> full = worker_->full_logits(plan_.candidates, plan_.need_log_normalizers != 0);
  const std::span<const double> normalizers = worker_->log_normalizers();
  ++stat_steps_;

  // Every row's token first (side by side when there is a pool: ~0.05-0.7 ms a row for Gemma's
  // vocabulary, bench/sampler_bench), then the events in plan order.
  // A sequence's rows are its chunk's last logit_rows positions; a row at position p predicts the
  // token at p + 1: a prompt token to score, or the next token to sample.
  sampled_.clear();
  // A sequence whose rows came out non-finite fails alone: rows never mix, so the others stand.
  const std::span<const uint8_t> non_finite = worker_->non_finite_rows();
  std::vector<Request*> failed;
  int64_t row = 0;
  for (size_t i = 0; i < planned.size(); ++i) {
    ScheduledSequence* seq = planned[i];
    Request& r = *requests_.at(seq->id);
    const int rows = plan_.sequences[i].logit_rows;
    if (std::any_of(non_finite.begin() + row, non_finite.begin() + row + rows, [](uint8_t bad) { return bad != 0; })) {
      failed.push_back(&r);
      row += rows;
      continue;
    }
    for (int j = 0; j < rows; ++j, ++row) {
      const int next = seq->computed - rows + j + 1;
      if (seq->score_prompt && next < r.prompt_tokens)
        score_prompt_token(r, next, full.subspan(size_t(row) * size_t(vocab_size_), size_t(vocab_size_)),
                           normalizers[size_t(row)]);
      else if (next == int(seq->tokens.size()) && !r.prompt_only)
        sampled_.push_back({seq, &r, row, {}});
    }
  }
  const auto sample_rows = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      SampledRow& s = sampled_[size_t(i)];
      const std::span<const float> logits = full.subspan(size_t(s.row) * size_t(vocab_size_), size_t(vocab_size_));
      const std::optional<double> normalizer =
          plan_.need_log_normalizers ? std::optional<double>(normalizers[size_t(s.row)]) : std::nullopt;
      s.token = s.request->sampler->sample(logits, normalizer);
    }
  };
  const int64_t rows = int64_t(sampled_.size());
  if (options_.sampling_pool && rows > 1) options_.sampling_pool->parallel_for(rows, sample_rows);
  else sample_rows(0, rows);

  for (Request* r : failed) {
    std::fprintf(stderr, "tandem: request %llu failed: its step produced a non-finite value\n",
                 static_cast<unsigned long long>(r->id));
    const uint64_t id = r->id;
    finish(*r, FinishReason::Error, -1,
           "the model produced a non-finite value (NaN or Inf) in its final hidden state: the checkpoint holds "
           "non-finite weights, or the arithmetic overflowed");
    requests_.erase(id);
  }

  // Prompt-only requests (they never sample, so none ended above) end once their whole prompt ran.
  for (ScheduledSequence* seq : planned) {
    const auto found = requests_.find(seq->id);
    if (found == requests_.end()) continue;  // failed above
    Request& r = *found->second;
    if (!r.prompt_only || seq->computed < r.prompt_tokens) continue;
    stat_prompt_ += uint64_t(r.prompt_tokens);
    finish(r, FinishReason::Length);
    requests_.erase(seq->id);
  }

  for (SampledRow& sampled : sampled_) {
    ScheduledSequence* seq = sampled.seq;
    Request& r = *sampled.request;
    SampledToken& t = sampled.token;
    if (r.generated == 0) stat_prompt_ += uint64_t(r.prompt_tokens);
    if (std::find(r.stop_tokens.begin(), r.stop_tokens.end(), t.token) != r.stop_tokens.end()) {
      // Not part of the output, but generated: counted in completion_tokens as vLLM counts it.
      ++r.generated;
      ++stat_generated_;
      finish(r, FinishReason::Stop, t.token);
      requests_.erase(seq->id);
      continue;
    }
    seq->tokens.push_back(t.token);
    ++r.generated;
    ++stat_generated_;
    TokenEvent e;
    e.request_id = r.id;
    e.token = t.token;
    e.logprob = t.logprob;
    e.top_logprobs = std::move(t.top);
    e.prompt_tokens = r.prompt_tokens;
    e.cached_prompt_tokens = std::max(0, seq->reused);
    e.completion_tokens = r.generated;
    attach_prompt_logprobs(r, e);
    if (r.on_event) r.on_event(e);
    if (r.generated >= r.max_tokens) {
      finish(r, FinishReason::Length);
      requests_.erase(seq->id);
    }
  }
  publish_stats();
}

void Engine::publish_stats() {
  stat_preemptions_ = scheduler_->preemptions();
  stat_running_ = int(running_.size());
  stat_waiting_ = int(waiting_.size());
  const KvCache& cache = worker_->cache();
  const int64_t total = cache.total_blocks();
  const int64_t in_use = total - cache.free_full_blocks() - cache.free_sliding_blocks() - scheduler_->kept_blocks();
  stat_kv_usage_ = total > 0 ? double(in_use) / double(total) : 0.0;
  stat_reuse_queries_ = scheduler_->reuse_queries();
  stat_reuse_hits_ = scheduler_->reuse_hits();
}

void run_follower(const Gemma4Checkpoint& checkpoint, Ops& ops, Communicator& comm, const WorkerOptions& options) {
  Worker worker(checkpoint, ops, comm, options);
  for (;;) {
    StepPlan plan = receive_plan(comm);
    if (plan.command == StepPlan::Shutdown) return;
    worker.execute(plan);
    worker.full_logits(plan.candidates, plan.need_log_normalizers != 0);
  }
}

}  // namespace tandem
