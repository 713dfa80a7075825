// The engine end to end on tiny checkpoints: greedy output equals the single-sequence fast path,
// alone or batched with others (continuous batching, chunked prefill, preemption), cancellation
// frees KV memory at once, and bad requests are refused with the right kind.
#include <gtest/gtest.h>

#include <atomic>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <future>
#include <mutex>
#include <random>
#include <thread>

#include "kernels/cpu/cpu_ops.h"
#include "model/checkpoint.h"
#include "model/kv_cache.h"
#include "model/sequence_model.h"
#include "runtime/engine.h"
#include "support/test_support.h"

namespace tandem {
namespace {

using test::pseudo_random_ids;

// Collects one request's events and lets the test wait for its end.
struct Collector {
  std::mutex mutex;
  std::condition_variable done_cv;
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  FinishReason finish = FinishReason::None;
  int completion_tokens = 0;  // the finish event's count
  int cached_prompt_tokens = -1;
  std::vector<PromptTokenLogprob> prompt_logprobs;
  int prompt_logprob_events = 0;
  bool done = false;
  std::function<void(const TokenEvent&)> callback() {
    return [this](const TokenEvent& e) {
      std::lock_guard lock(mutex);
      if (e.token >= 0) tokens.push_back(e.token), logprobs.push_back(e.logprob);
      if (!e.prompt_logprobs.empty()) prompt_logprobs = e.prompt_logprobs, ++prompt_logprob_events;
      if (e.finish != FinishReason::None) {
        finish = e.finish;
        completion_tokens = e.completion_tokens;
        cached_prompt_tokens = e.cached_prompt_tokens;
        done = true;
        done_cv.notify_all();
      }
    };
  }
  void wait() {
    std::unique_lock lock(mutex);
    ASSERT_TRUE(done_cv.wait_for(lock, std::chrono::seconds(120), [&] { return done; }));
  }
};

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ckpt_ = Gemma4Checkpoint::open(test::golden_tiny_checkpoint());
    pool_ = std::make_unique<ThreadPool>(2);
    ops_ = std::make_unique<cpu::CpuOps>(*pool_);
  }
  std::unique_ptr<Engine> make_engine(size_t kv_bytes = 32 << 20, int slots = 8, int step_tokens = 64,
                                      int max_waiting = 64, bool prefix_reuse = true) {
    EngineOptions o;
    o.worker.prefix_reuse = prefix_reuse;
    o.worker.max_slots = slots;
    o.worker.max_step_tokens = step_tokens;
    o.worker.kv_memory_bytes = kv_bytes;
    o.max_waiting = max_waiting;
    o.sampling_pool = pool_.get();  // as `tandem serve` runs it
    return std::make_unique<Engine>(*ckpt_, *ops_, comm_, o);
  }
  // KV memory for `full_blocks` blocks of 16 positions in the full-attention layers, and the sliding
  // layers' windows of `sequences` sequences (with 32-token steps) and their pinned prompt windows.
  size_t kv_bytes_of(int full_blocks, int sequences) const {
    KvCacheOptions o;
    o.block_size = 16;
    return size_t(KvCache::sliding_blocks_per_sequence(ckpt_->config, 16, 32) +
                  KvCache::pinned_blocks_per_sequence(ckpt_->config, 16)) *
               size_t(sequences) *
               KvCache::sliding_block_bytes(ckpt_->config, ckpt_->weights, o) +
           size_t(full_blocks) * KvCache::full_block_bytes(ckpt_->config, ckpt_->weights, o);
  }
  std::vector<int32_t> alone_greedy(const std::vector<int32_t>& prompt, int n) {
    FastSequenceModel m(*ckpt_, *ops_, comm_, 512, 32);
    std::vector<int32_t> out;
    auto logits = m.forward(prompt, false).back();
    for (int i = 0; i < n; ++i) {
      const int32_t t = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
      out.push_back(t);
      const int32_t one[1] = {t};
      logits = m.forward(one, false).back();
    }
    return out;
  }
  GenerationRequest greedy_request(std::vector<int32_t> prompt, int max_tokens, Collector& c) {
    GenerationRequest r;
    r.prompt = std::move(prompt);
    r.max_tokens = max_tokens;
    r.sampling.temperature = 0;
    r.on_event = c.callback();
    return r;
  }
  // Runs one greedy request to its end; returns its tokens and how many prompt tokens were reused.
  std::pair<std::vector<int32_t>, int> run_alone(Engine& engine, const std::vector<int32_t>& prompt, int max_tokens) {
    Collector c;
    engine.submit(greedy_request(prompt, max_tokens, c));
    c.wait();
    return {c.tokens, c.cached_prompt_tokens};
  }
  void wait_for_idle_kv(Engine& engine) {  // stats are published after each step
    for (int tries = 0; tries < 200 && engine.stats().kv_usage > 0; ++tries)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::unique_ptr<Gemma4Checkpoint> ckpt_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<cpu::CpuOps> ops_;
  LocalCommunicator comm_;
};

TEST_F(EngineTest, ConcurrentGreedyRequestsMatchSingleSequenceRuns) {
  auto engine = make_engine();
  const int n = 12;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < n; ++i) prompts.push_back(pseudo_random_ids(2 + 11 * i, 512, 300 + i));
  std::vector<std::unique_ptr<Collector>> collectors;
  for (int i = 0; i < n; ++i) {
    collectors.push_back(std::make_unique<Collector>());
    engine->submit(greedy_request(prompts[size_t(i)], 10 + i, *collectors.back()));
  }
  for (int i = 0; i < n; ++i) {
    collectors[size_t(i)]->wait();
    EXPECT_EQ(collectors[size_t(i)]->finish, FinishReason::Length);
    EXPECT_EQ(collectors[size_t(i)]->tokens, alone_greedy(prompts[size_t(i)], 10 + i)) << "request " << i;
  }
  // The engine publishes its stats after each step; give it a moment to settle.
  for (int tries = 0; tries < 100 && engine->stats().kv_usage > 0; ++tries)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

// Rows are sampled side by side on the pool: each request must get its own row's token and
// log-probability. The reference is the request alone, greedy, with log softmax in double.
TEST_F(EngineTest, ConcurrentRequestsSampleTheirOwnRows) {
  auto engine = make_engine();
  const int n = 6, steps = 8;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::unique_ptr<Collector>> collectors;
  for (int i = 0; i < n; ++i) {
    prompts.push_back(pseudo_random_ids(3 + 5 * i, 512, 700 + i));
    collectors.push_back(std::make_unique<Collector>());
    GenerationRequest r = greedy_request(prompts.back(), steps, *collectors.back());
    r.sampling.logprobs = true;
    engine->submit(std::move(r));
  }
  for (int i = 0; i < n; ++i) {
    collectors[size_t(i)]->wait();
    FastSequenceModel m(*ckpt_, *ops_, comm_, 512, 32);
    auto logits = m.forward(prompts[size_t(i)], false).back();
    for (int s = 0; s < steps; ++s) {
      const int32_t t = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
      ASSERT_EQ(collectors[size_t(i)]->tokens.at(size_t(s)), t) << "request " << i << ", token " << s;
      double sum = 0;
      for (float l : logits) sum += std::exp(double(l) - double(logits[size_t(t)]));
      EXPECT_NEAR(collectors[size_t(i)]->logprobs.at(size_t(s)), -std::log(sum), 1e-4) << "request " << i;
      const int32_t one[1] = {t};
      logits = m.forward(one, false).back();
    }
  }
}

TEST_F(EngineTest, PreemptionUnderMemoryPressureKeepsOutputsExact) {
  // A pool too small for all sequences at once (24 blocks of 16 positions for full-attention
  // layers, ~500 positions needed): some are preempted and recomputed.
  auto engine = make_engine(kv_bytes_of(24, 8), 8, 32);
  const int n = 8;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < n; ++i) prompts.push_back(pseudo_random_ids(20 + 3 * i, 512, 700 + i));
  std::vector<std::unique_ptr<Collector>> collectors;
  for (int i = 0; i < n; ++i) {
    collectors.push_back(std::make_unique<Collector>());
    engine->submit(greedy_request(prompts[size_t(i)], 40, *collectors.back()));
  }
  for (int i = 0; i < n; ++i) {
    collectors[size_t(i)]->wait();
    EXPECT_EQ(collectors[size_t(i)]->tokens, alone_greedy(prompts[size_t(i)], 40)) << "request " << i;
  }
  EXPECT_GT(engine->stats().preemptions, 0u);
}

// A waiting prompt that does not fit beside a running sequence waits for it, rather than being
// admitted on its first chunk, preempted as soon as the running one grows, and readmitted at once
// (its prefill redone every few steps: hundreds of preemptions).
TEST_F(EngineTest, APromptThatDoesNotFitWaitsInsteadOfThrashing) {
  // 24 blocks of 16 positions: A (60 + 250 positions) grows to 20 of them and holds 18 when B arrives;
  // B's prompt needs 8.
  auto engine = make_engine(kv_bytes_of(24, 2), 2, 32);
  const std::vector<int32_t> a_prompt = pseudo_random_ids(60, 512, 901), b_prompt = pseudo_random_ids(120, 512, 902);
  Collector a, b;
  engine->submit(greedy_request(a_prompt, 250, a));
  while (true) {  // A is decoding, past 270 positions, before B arrives
    {
      std::lock_guard lock(a.mutex);
      if (a.tokens.size() >= 215) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  engine->submit(greedy_request(b_prompt, 8, b));
  a.wait();
  b.wait();
  EXPECT_EQ(a.tokens, alone_greedy(a_prompt, 250));
  EXPECT_EQ(b.tokens, alone_greedy(b_prompt, 8));
  EXPECT_LE(engine->stats().preemptions, 2u);
}

// The sliding layers' pool holds each slot's share (its window and a chunk), so a long prompt
// only needs its full-attention blocks free to be admitted beside a running sequence; counting
// every sliding block of its whole prompt kept it waiting until the engine was idle.
TEST_F(EngineTest, ALongPromptIsAdmittedBesideARunningSequence) {
  auto engine = make_engine(kv_bytes_of(64, 2), 2, 32);  // sliding share: 4 blocks of 16 positions
  Collector a, b;
  engine->submit(greedy_request(pseudo_random_ids(20, 512, 903), 400, a));
  while (true) {
    {
      std::lock_guard lock(a.mutex);
      if (!a.tokens.empty()) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const auto b_prompt = pseudo_random_ids(300, 512, 904);  // 19 sliding blocks over its whole prompt
  engine->submit(greedy_request(b_prompt, 3, b));
  b.wait();
  {
    std::lock_guard lock(a.mutex);
    EXPECT_FALSE(a.done) << "B waited for A to end";
  }
  EXPECT_EQ(b.tokens, alone_greedy(b_prompt, 3));
  a.wait();
}

TEST_F(EngineTest, CancelFreesTheSequence) {
  auto engine = make_engine();
  Collector c;
  const uint64_t id = engine->submit(greedy_request(pseudo_random_ids(10, 512, 1), 400, c));
  for (int tries = 0; tries < 1000; ++tries) {
    {
      std::lock_guard lock(c.mutex);
      if (c.tokens.size() >= 3) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  engine->cancel(id);
  c.wait();
  EXPECT_EQ(c.finish, FinishReason::Cancelled);
  Collector after;  // the engine keeps serving, and the freed memory is usable
  engine->submit(greedy_request(pseudo_random_ids(5, 512, 2), 3, after));
  after.wait();
  EXPECT_EQ(after.tokens.size(), 3u);
  for (int tries = 0; tries < 100 && engine->stats().kv_usage > 0; ++tries)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(engine->stats().running, 0);
}

TEST_F(EngineTest, StopTokenEndsTheRequestWithoutBeingEmitted) {
  auto engine = make_engine();
  const auto prompt = pseudo_random_ids(12, 512, 5);
  const auto expected = alone_greedy(prompt, 6);
  Collector c;
  GenerationRequest r = greedy_request(prompt, 20, c);
  r.stop_tokens = {expected[3]};
  engine->submit(std::move(r));
  c.wait();
  EXPECT_EQ(c.finish, FinishReason::Stop);
  const auto first = std::find(expected.begin(), expected.end(), expected[3]);
  EXPECT_EQ(c.tokens, std::vector<int32_t>(expected.begin(), first));
  EXPECT_EQ(c.completion_tokens, int(c.tokens.size()) + 1) << "the stop token is counted, as vLLM counts it";
}

TEST_F(EngineTest, SeededSamplingIsReproducible) {
  auto engine = make_engine();
  auto run = [&](uint64_t seed) {
    Collector c;
    GenerationRequest r;
    r.prompt = pseudo_random_ids(8, 512, 9);
    r.max_tokens = 24;
    r.sampling.temperature = 1.0f;
    r.sampling.seed = seed;
    r.on_event = c.callback();
    engine->submit(std::move(r));
    c.wait();
    return c.tokens;
  };
  EXPECT_EQ(run(11), run(11));
  EXPECT_NE(run(11), run(12));
}

TEST_F(EngineTest, RejectsBadRequests) {
  auto engine = make_engine();
  Collector c;
  auto kind_of = [&](GenerationRequest r) {
    try {
      engine->submit(std::move(r));
    } catch (const RequestRejected& e) {
      return int(e.kind);
    }
    return -1;
  };
  EXPECT_EQ(kind_of(greedy_request({}, 5, c)), int(RequestRejected::Kind::Invalid));
  EXPECT_EQ(kind_of(greedy_request({2, 9999}, 5, c)), int(RequestRejected::Kind::Invalid));
  const int limit = engine->context_limit();
  EXPECT_EQ(kind_of(greedy_request(std::vector<int32_t>(size_t(limit), 7), 1, c)), int(RequestRejected::Kind::ContextLength));
  EXPECT_EQ(kind_of(greedy_request({2, 7}, limit, c)), int(RequestRejected::Kind::ContextLength));
  // A prompt scored alone generates nothing, so it may fill the context, and no more (a pool of 8
  // blocks: a context of 128).
  engine = make_engine(kv_bytes_of(8, 2), 2, 32);
  const int small = engine->context_limit();
  ASSERT_EQ(small, 128);
  GenerationRequest too_long = greedy_request(std::vector<int32_t>(size_t(small) + 1, 7), 1, c);
  too_long.prompt_only = true;
  EXPECT_EQ(kind_of(std::move(too_long)), int(RequestRejected::Kind::ContextLength));
  Collector whole;
  GenerationRequest filling = greedy_request(pseudo_random_ids(small, 512, 81), 1, whole);
  filling.prompt_only = true;
  filling.prompt_logprobs = 0;
  EXPECT_EQ(kind_of(std::move(filling)), -1);
  whole.wait();
  EXPECT_EQ(whole.finish, FinishReason::Length);
  EXPECT_EQ(whole.prompt_logprobs.size(), size_t(small) - 1);
}

TEST_F(EngineTest, FullQueueIsRefused) {
  auto engine_owner = make_engine(8 << 20, 1, 16, 2);
  Engine& engine = *engine_owner;
  std::vector<std::unique_ptr<Collector>> cs;
  int refused = 0;
  for (int i = 0; i < 10; ++i) {
    cs.push_back(std::make_unique<Collector>());
    try {
      engine.submit(greedy_request(pseudo_random_ids(30, 512, uint32_t(i)), 200, *cs.back()));
    } catch (const RequestRejected& e) {
      EXPECT_EQ(e.kind, RequestRejected::Kind::QueueFull);
      ++refused;
    }
  }
  EXPECT_GT(refused, 0);
  engine.shutdown();  // open requests end as cancelled
}

// The queue counts requests beyond the slots: on an idle engine, as many requests as slots plus
// queue places are taken at once, and the next is refused.
TEST_F(EngineTest, FreeSlotsAreNotQueuePlaces) {
  auto engine_owner = make_engine(8 << 20, 4, 16, 1);
  Engine& engine = *engine_owner;
  std::vector<std::unique_ptr<Collector>> cs;
  for (int i = 0; i < 5; ++i) {
    cs.push_back(std::make_unique<Collector>());
    EXPECT_NO_THROW(engine.submit(greedy_request(pseudo_random_ids(30, 512, uint32_t(i)), 200, *cs.back()))) << i;
  }
  cs.push_back(std::make_unique<Collector>());
  EXPECT_THROW(engine.submit(greedy_request(pseudo_random_ids(30, 512, 9), 200, *cs.back())), RequestRejected);
  engine.shutdown();
}

// A group of requests (the choices of one response) goes in whole or not at all: one that does
// not fit the queue now is refused without taking any place, one larger than slots and queue
// together is refused as invalid, and a bad request anywhere in it refuses the group.
TEST_F(EngineTest, AGroupOfRequestsIsTakenWholeOrNotAtAll) {
  auto engine_owner = make_engine(8 << 20, 2, 16, 2);
  Engine& engine = *engine_owner;
  std::vector<std::unique_ptr<Collector>> cs;
  auto group = [&](int n, uint32_t seed) {
    std::vector<GenerationRequest> g;
    for (int i = 0; i < n; ++i) {
      cs.push_back(std::make_unique<Collector>());
      g.push_back(greedy_request(pseudo_random_ids(30, 512, seed + uint32_t(i)), 200, *cs.back()));
    }
    return g;
  };
  auto kind_of = [&](std::vector<GenerationRequest> g) {
    try {
      engine.submit_all(std::move(g));
    } catch (const RequestRejected& e) {
      return int(e.kind);
    }
    return -1;
  };
  EXPECT_EQ(kind_of(group(5, 10)), int(RequestRejected::Kind::Invalid)) << "5 > 2 slots + 2 queue places";
  auto bad = group(2, 20);
  bad[1].prompt.push_back(100000);
  EXPECT_EQ(kind_of(std::move(bad)), int(RequestRejected::Kind::Invalid));
  EXPECT_EQ(engine.submit_all(group(3, 30)).size(), 3u);
  EXPECT_EQ(kind_of(group(2, 40)), int(RequestRejected::Kind::QueueFull)) << "3 open, room for one more";
  EXPECT_NO_THROW(engine.submit(greedy_request(pseudo_random_ids(30, 512, 50), 200, *cs.front())))
      << "the refused groups took no place";
  engine.shutdown();
}

// A NaN that reaches one request's final hidden state (here from a corrupt embedding row that only
// its prompt uses; mapped weights are not scanned at load) fails that request alone: rows never mix,
// so the request beside it in the same steps answers as it does on the intact checkpoint, and the
// engine goes on serving.
TEST_F(EngineTest, ANonFiniteRowFailsOnlyItsRequest) {
  const std::string intact = test::synth_checkpoint("tiny");
  test::TempDir corrupt;
  test::copy_folder_files(intact, corrupt.path());
  test::overwrite_tensor_start(corrupt.path(), "model.language_model.embed_tokens.weight", std::string("\xc0\x7f", 2));
  auto reference_ckpt = Gemma4Checkpoint::open(intact);
  auto ckpt = Gemma4Checkpoint::open(corrupt.path());
  EngineOptions o;
  o.worker.max_slots = 4;
  o.worker.max_step_tokens = 64;
  o.worker.kv_memory_bytes = 16 << 20;
  Engine engine(*ckpt, *ops_, comm_, o);
  const auto clean = pseudo_random_ids(30, 256, 95);
  std::vector<int32_t> poisoned = pseudo_random_ids(20, 256, 96);
  poisoned[5] = 0;  // token 0's embedding row starts with the NaN
  FastSequenceModel m(*reference_ckpt, *ops_, comm_, 512, 32);
  std::vector<int32_t> want;
  auto logits = m.forward(clean, false).back();
  for (int i = 0; i < 12; ++i) {
    want.push_back(int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    logits = m.forward(std::span(&want.back(), 1), false).back();
  }
  ASSERT_EQ(std::count(want.begin(), want.end(), 0), 0) << "the clean answer must not feed token 0 back";

  Collector bad, good, after;
  engine.submit(greedy_request(poisoned, 12, bad));
  engine.submit(greedy_request(clean, 12, good));
  bad.wait();
  good.wait();
  EXPECT_EQ(bad.finish, FinishReason::Error);
  EXPECT_TRUE(bad.tokens.empty());
  EXPECT_EQ(good.finish, FinishReason::Length);
  EXPECT_EQ(good.tokens, want);
  engine.submit(greedy_request(clean, 12, after));
  after.wait();
  EXPECT_EQ(after.tokens, want) << "the engine goes on serving";
}

// Prefix reuse: a prompt that goes on from an ended request's tokens (the next turn of a chat)
// prefills only its new tokens, and gets the tokens it gets alone.
TEST_F(EngineTest, APromptThatGoesOnFromAnEndedRequestReusesItsCache) {
  for (bool reuse : {true, false}) {
    auto engine = make_engine(32 << 20, 8, 64, 64, reuse);
    const auto first_prompt = pseudo_random_ids(40, 512, 31);
    const auto [first, first_cached] = run_alone(*engine, first_prompt, 12);
    ASSERT_EQ(first.size(), 12u);
    EXPECT_EQ(first_cached, 0);
    std::vector<int32_t> next = first_prompt;
    next.insert(next.end(), first.begin(), first.end());
    const auto more = pseudo_random_ids(9, 512, 32);
    next.insert(next.end(), more.begin(), more.end());
    const auto [second, second_cached] = run_alone(*engine, next, 10);
    EXPECT_EQ(second, alone_greedy(next, 10)) << "reuse " << reuse;
    // The first request's cache holds its prompt and all its tokens but the last, never fed back.
    const int kept = reuse ? 40 + 12 - 1 : 0;
    EXPECT_EQ(second_cached, kept);
    const EngineStats stats = engine->stats();
    EXPECT_EQ(stats.prefix_cache_queries, uint64_t(first_prompt.size() + next.size()));
    EXPECT_EQ(stats.prefix_cache_hits, uint64_t(kept));
    // The same prompt again: all but its last token, which must run to give logits.
    const auto [again, again_cached] = run_alone(*engine, next, 10);
    EXPECT_EQ(again, second);
    EXPECT_EQ(again_cached, reuse ? int(next.size()) - 1 : 0);
    wait_for_idle_kv(*engine);
    EXPECT_EQ(engine->stats().kv_usage, 0.0) << "kept prefixes are not in use";
  }
}

// A prompt that shares only the start of what an ended request kept (one slot, so it must take
// that one): reused where the sliding layers still hold the shared part's window (a sequence keeps
// its share of the sliding pool, here 6 blocks of 16 for a window of 16 and steps of 64), not where
// they have given it back. The tokens are the prompt's alone either way.
TEST_F(EngineTest, PartlySharedPromptsReuseWhatTheSlidingWindowStillHolds) {
  ASSERT_EQ(ckpt_->config.sliding_window, 16);
  auto engine = make_engine(32 << 20, 1, 64);
  const auto base = pseudo_random_ids(150, 512, 41);
  EXPECT_EQ(run_alone(*engine, base, 1).second, 0);  // keeps 150 positions; sliding blocks 4-9
  auto with_tail = [&](int shared, uint32_t seed) {
    std::vector<int32_t> p(base.begin(), base.begin() + shared);
    const auto tail = pseudo_random_ids(10, 512, seed);
    p.insert(p.end(), tail.begin(), tail.end());
    return p;
  };
  const auto near = with_tail(100, 42);  // a query at 100 sees 85-100: block 5, held
  const auto [near_tokens, near_cached] = run_alone(*engine, near, 6);
  EXPECT_EQ(near_cached, 100);
  EXPECT_EQ(near_tokens, alone_greedy(near, 6));
  const auto far = with_tail(40, 43);  // a query at 40 sees 25-40: block 1, given back
  const auto [far_tokens, far_cached] = run_alone(*engine, far, 6);
  EXPECT_EQ(far_cached, 0);
  EXPECT_EQ(far_tokens, alone_greedy(far, 6));
}

// However long an answer runs past its sliding window (a thinking answer, which the chat template
// then leaves out of the history), its prompt stays reusable: the prompt's window is pinned. So the
// next turn reuses the whole previous prompt, the same prompt asked again all but its last token, and
// a prompt that also shares the start of the answer (an answer the template trimmed or edited) the
// previous prompt at least; and such a match is taken although empty slots are free.
TEST_F(EngineTest, APromptStaysReusableAfterALongAnswer) {
  ASSERT_EQ(ckpt_->config.sliding_window, 16);
  auto engine = make_engine(32 << 20, 4, 32);  // a share of 4 sliding blocks: 64 positions
  auto with_tail = [&](std::vector<int32_t> p, uint32_t seed) {
    const auto tail = pseudo_random_ids(12, 512, seed);
    p.insert(p.end(), tail.begin(), tail.end());
    return p;
  };
  // The same prompt again, then one that shares the start of the (same) answer too.
  const auto prompt = pseudo_random_ids(40, 512, 91);
  const auto [answer, first_cached] = run_alone(*engine, prompt, 120);
  EXPECT_EQ(first_cached, 0);
  const auto [again, again_cached] = run_alone(*engine, prompt, 120);
  EXPECT_EQ(again_cached, 39);
  EXPECT_EQ(again, answer);
  std::vector<int32_t> edited = prompt;  // the history with the answer's first 50 tokens, then others
  edited.insert(edited.end(), answer.begin(), answer.begin() + 50);
  edited = with_tail(edited, 93);
  const auto [edited_tokens, edited_cached] = run_alone(*engine, edited, 6);
  EXPECT_EQ(edited_cached, 40);
  EXPECT_EQ(edited_tokens, alone_greedy(edited, 6));

  // The next turn, without the answer (its thinking dropped), then that turn regenerated.
  const auto other = pseudo_random_ids(40, 512, 94);
  EXPECT_EQ(run_alone(*engine, other, 120).second, 0);
  const auto next = with_tail(other, 92);
  const auto [next_tokens, next_cached] = run_alone(*engine, next, 100);
  EXPECT_EQ(next_cached, 40);
  EXPECT_EQ(next_tokens, alone_greedy(next, 100));
  const auto [regenerated, regenerated_cached] = run_alone(*engine, next, 6);
  EXPECT_EQ(regenerated_cached, int(next.size()) - 1);
  EXPECT_EQ(regenerated, std::vector<int32_t>(next_tokens.begin(), next_tokens.begin() + 6));
}

// Which kept prefix a prompt takes: the longest match that is at least half of what its slot keeps
// (cutting a slot back to less gives up more than it saves while an empty slot is free).
TEST_F(EngineTest, APromptTakesTheLongestMatchWorthItsSlot) {
  auto engine = make_engine(32 << 20, 4, 64);
  const auto base = pseudo_random_ids(100, 512, 71);
  auto start_of = [&](int n, uint32_t tail_seed, int tail) {
    std::vector<int32_t> p(base.begin(), base.begin() + n);
    const auto more = pseudo_random_ids(tail, 512, tail_seed);
    p.insert(p.end(), more.begin(), more.end());
    return p;
  };
  EXPECT_EQ(run_alone(*engine, base, 1).second, 0);  // keeps 100 tokens
  // 20 of 100: not worth that slot; an empty one is taken (and keeps 30).
  EXPECT_EQ(run_alone(*engine, start_of(20, 72, 10), 1).second, 0);
  // 40 of 100 fails the rule, 20 of 30 passes it; but an empty slot is left, which takes a copy of
  // those 40 instead (the 100 stay kept).
  const auto prompt = start_of(40, 73, 8);
  const auto [tokens, cached] = run_alone(*engine, prompt, 5);
  EXPECT_EQ(cached, 40);
  EXPECT_EQ(tokens, alone_greedy(prompt, 5));
  EXPECT_EQ(run_alone(*engine, start_of(100, 74, 3), 1).second, 100) << "the 100 were kept beside the copy";
}

// The n choices of one request are n requests with one prompt: the first prefills it, the others
// wait for that prefill and start from copies of its cache, so the prompt runs once, and each
// answers as the prompt alone does.
TEST_F(EngineTest, ChoicesOfOnePromptPrefillItOnce) {
  const auto prompt = pseudo_random_ids(150, 512, 81);
  const auto want = alone_greedy(prompt, 8);
  for (const bool reuse : {true, false}) {
    SCOPED_TRACE(reuse ? "prefix reuse" : "no prefix reuse");
    auto engine = make_engine(32 << 20, 4, 64, 64, reuse);
    std::vector<std::unique_ptr<Collector>> choices;
    for (int i = 0; i < 4; ++i) {
      choices.push_back(std::make_unique<Collector>());
      engine->submit(greedy_request(prompt, 8, *choices.back()));
    }
    int copied = 0;
    for (auto& c : choices) {
      c->wait();
      EXPECT_EQ(c->tokens, want);
      if (c->cached_prompt_tokens == 149) ++copied;
      else EXPECT_EQ(c->cached_prompt_tokens, 0);
    }
    EXPECT_EQ(copied, reuse ? 3 : 0);
    EXPECT_EQ(engine->stats().prefix_cache_hits, reuse ? 3u * 149u : 0u);
    wait_for_idle_kv(*engine);
    EXPECT_EQ(engine->stats().kv_usage, 0.0);
  }
  // The same once every slot keeps an earlier request's prefix (a server that has run a while): the
  // copies go into the least recently used kept slots.
  auto engine = make_engine(32 << 20, 4, 64);
  for (uint32_t i = 0; i < 4; ++i) EXPECT_EQ(run_alone(*engine, pseudo_random_ids(60, 512, 120 + i), 2).second, 0);
  const auto other = pseudo_random_ids(160, 512, 130);
  std::vector<std::unique_ptr<Collector>> choices;
  for (int i = 0; i < 4; ++i) {
    choices.push_back(std::make_unique<Collector>());
    engine->submit(greedy_request(other, 8, *choices.back()));
  }
  const auto other_want = alone_greedy(other, 8);
  int copied = 0;
  for (auto& c : choices) {
    c->wait();
    EXPECT_EQ(c->tokens, other_want);
    copied += c->cached_prompt_tokens == 159;
  }
  EXPECT_EQ(copied, 3);
}

// The choices of one prompt share the blocks its prefill filled instead of each holding a copy: four
// choices of a 150-token prompt (ten blocks of 16 positions) run side by side with room for 16
// blocks, where copies would have taken 40. Each choice's first token comes before any choice ends.
TEST_F(EngineTest, ChoicesOfOnePromptShareItsBlocks) {
  const auto prompt = pseudo_random_ids(150, 512, 83);
  const auto want = alone_greedy(prompt, 8);
  auto engine = make_engine(kv_bytes_of(16, 4), 4, 32);
  std::atomic<int> clock{0};
  struct Times {
    int first_token = -1, finish = -1;
  };
  std::vector<Times> times(4);
  std::vector<std::unique_ptr<Collector>> choices;
  std::vector<GenerationRequest> requests;  // submitted together, as the server submits a request's n choices
  for (int i = 0; i < 4; ++i) {
    choices.push_back(std::make_unique<Collector>());
    GenerationRequest r = greedy_request(prompt, 8, *choices.back());
    r.on_event = [&, i, inner = r.on_event](const TokenEvent& e) {
      const int now = clock++;
      if (e.token >= 0 && times[size_t(i)].first_token < 0) times[size_t(i)].first_token = now;
      if (e.finish != FinishReason::None) times[size_t(i)].finish = now;
      inner(e);
    };
    requests.push_back(std::move(r));
  }
  engine->submit_all(std::move(requests));
  for (auto& c : choices) c->wait();
  int first_finish = INT32_MAX;
  for (const Times& t : times) first_finish = std::min(first_finish, t.finish);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(choices[size_t(i)]->tokens, want) << "choice " << i;
    EXPECT_LT(times[size_t(i)].first_token, first_finish) << "choice " << i << " ran beside the others";
  }
  EXPECT_EQ(engine->stats().prefix_cache_hits, 3u * 149u);
  EXPECT_EQ(engine->stats().preemptions, 0u);
  wait_for_idle_kv(*engine);
  EXPECT_EQ(engine->stats().kv_usage, 0.0);
}

// Concurrent prompts that share a long start (one system prompt, different questions) copy it from
// whichever sequence computed it, while that one runs on, whatever the sliding window has done
// since; prompts sharing less than Scheduler::kMinCopiedPrefix tokens do not wait for each other.
TEST_F(EngineTest, ConcurrentPromptsCopyASharedStartFromARunningSequence) {
  auto engine = make_engine(32 << 20, 6, 32);  // 32-token steps: the first prompt takes three
  const auto system = pseudo_random_ids(70, 512, 82);
  auto with_question = [&](uint32_t seed, int length) {
    std::vector<int32_t> p = system;
    const auto q = pseudo_random_ids(length + 1, 512, seed);
    p.insert(p.end(), q.begin() + 1, q.end());  // (past its <bos>)
    return p;
  };
  std::vector<std::vector<int32_t>> prompts = {with_question(83, 20), with_question(84, 9), with_question(85, 33)};
  prompts.push_back(pseudo_random_ids(40, 512, 86));  // shares nothing
  std::vector<std::unique_ptr<Collector>> collectors;
  for (const auto& p : prompts) {
    collectors.push_back(std::make_unique<Collector>());
    engine->submit(greedy_request(p, 40, *collectors.back()));
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    collectors[i]->wait();
    EXPECT_EQ(collectors[i]->tokens, alone_greedy(prompts[i], 40)) << "request " << i;
  }
  EXPECT_EQ(collectors[0]->cached_prompt_tokens, 0);
  EXPECT_EQ(collectors[1]->cached_prompt_tokens, 70);
  EXPECT_EQ(collectors[2]->cached_prompt_tokens, 70);
  EXPECT_EQ(collectors[3]->cached_prompt_tokens, 0);
  // Later, while the first is long past the system prompt: still copied, from a kept or running slot.
  Collector late;
  const auto next = with_question(87, 12);
  engine->submit(greedy_request(next, 6, late));
  late.wait();
  EXPECT_EQ(late.tokens, alone_greedy(next, 6));
  EXPECT_GE(late.cached_prompt_tokens, 70);
}

// Many requests sharing a prompt start under memory pressure: copies, kept prefixes, preemption and
// readmission all draw on one pool, and every answer stays the one its prompt gives alone.
TEST_F(EngineTest, SharedPromptStartsUnderMemoryPressureStayExact) {
  auto engine = make_engine(kv_bytes_of(30, 6), 6, 32);
  const auto system = pseudo_random_ids(60, 512, 88);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::unique_ptr<Collector>> collectors;
  for (int i = 0; i < 10; ++i) {
    std::vector<int32_t> p = system;
    const auto q = pseudo_random_ids(6 + 7 * i, 512, 90 + uint32_t(i));
    p.insert(p.end(), q.begin() + 1, q.end());
    prompts.push_back(p);
    collectors.push_back(std::make_unique<Collector>());
    engine->submit(greedy_request(p, 30 + 5 * i, *collectors.back()));
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    collectors[i]->wait();
    EXPECT_EQ(collectors[i]->finish, FinishReason::Length) << "request " << i;
    EXPECT_EQ(collectors[i]->tokens, alone_greedy(prompts[i], 30 + 5 * int(i))) << "request " << i;
  }
  EXPECT_GT(engine->stats().prefix_cache_hits, 0u);
  wait_for_idle_kv(*engine);
  EXPECT_EQ(engine->stats().kv_usage, 0.0);
}

// Prompts that branch off a few shared conversations at any position (inside blocks too), arriving
// in waves under memory pressure: shared blocks, copies of partly filled ones, kept prefixes cut back
// inside a block others still read, preemption and readmission. Every answer stays the one its
// prompt gives alone, and every block goes back in the end. (Before the cut's copy could take a block
// freed by the cut itself or by a kept prefix given back first, seed 11 failed a step that way in
// about half of its runs.)
TEST_F(EngineTest, PromptsBranchingOffSharedConversationsStayExact) {
  for (const uint32_t seed : {3u, 11u, 12u}) {
    SCOPED_TRACE(seed);
    auto engine = make_engine(kv_bytes_of(seed == 12 ? 40 : 20, 4), 4, 32);
    std::vector<std::vector<int32_t>> trunks;
    for (uint32_t i = 0; i < 3; ++i) trunks.push_back(pseudo_random_ids(120, 512, 200 + i));
    std::mt19937 rng(seed);
    for (int wave = 0; wave < 6; ++wave) {
      std::vector<std::vector<int32_t>> prompts;
      std::vector<int> max_tokens;
      std::vector<std::unique_ptr<Collector>> collectors;
      for (int i = 0; i < 6; ++i) {
        const auto& trunk = trunks[rng() % trunks.size()];
        std::vector<int32_t> p(trunk.begin(), trunk.begin() + 20 + int(rng() % 100));
        const auto tail = pseudo_random_ids(1 + int(rng() % 12), 512, 300 + uint32_t(wave * 10 + i));
        p.insert(p.end(), tail.begin() + 1, tail.end());
        prompts.push_back(p);
        max_tokens.push_back(4 + int(rng() % 20));
        collectors.push_back(std::make_unique<Collector>());
        engine->submit(greedy_request(p, max_tokens.back(), *collectors.back()));
      }
      for (size_t i = 0; i < prompts.size(); ++i) {
        collectors[i]->wait();
        EXPECT_EQ(collectors[i]->finish, FinishReason::Length) << "wave " << wave << " request " << i;
        EXPECT_EQ(collectors[i]->tokens, alone_greedy(prompts[i], max_tokens[i])) << "wave " << wave << " request " << i;
      }
    }
    EXPECT_GT(engine->stats().prefix_cache_hits, 0u);
    wait_for_idle_kv(*engine);
    EXPECT_EQ(engine->stats().kv_usage, 0.0);
  }
}

// Two conversations share the blocks of a common start (the second copied it from the first while
// both ran). A third prompt then takes the first's kept slot, cut back to a position inside a shared
// block, and writes on from there: it must write into a copy of that block, so that the second
// conversation, continued afterwards from its kept prefix, still reads its own keys and values.
TEST_F(EngineTest, CuttingAKeptPrefixInsideASharedBlockLeavesTheOtherHolderIntact) {
  auto engine = make_engine(32 << 20, 4, 32);
  const auto trunk = pseudo_random_ids(100, 512, 210);
  auto branch = [&](int keep, uint32_t seed, int tail) {
    std::vector<int32_t> p(trunk.begin(), trunk.begin() + keep);
    const auto t = pseudo_random_ids(tail + 1, 512, seed);
    p.insert(p.end(), t.begin() + 1, t.end());
    return p;
  };
  const auto first = branch(100, 211, 0), second = branch(100, 212, 5);
  Collector a, b;
  std::vector<GenerationRequest> both;
  both.push_back(greedy_request(first, 2, a));
  both.push_back(greedy_request(second, 30, b));
  engine->submit_all(std::move(both));  // together: the second waits for the first's prefill, then shares it
  a.wait();
  b.wait();
  ASSERT_EQ(b.cached_prompt_tokens, 100) << "the second copied the first's start";
  // 82: inside the shared block of positions 80-95, where the first's window still reaches.
  const auto third = branch(82, 213, 7);
  const auto [third_tokens, third_cached] = run_alone(*engine, third, 12);
  EXPECT_EQ(third_cached, 82);
  EXPECT_EQ(third_tokens, alone_greedy(third, 12));
  std::vector<int32_t> next = second;
  next.insert(next.end(), b.tokens.begin(), b.tokens.end());
  const auto more = pseudo_random_ids(4, 512, 214);
  next.insert(next.end(), more.begin() + 1, more.end());
  const auto [tokens, cached] = run_alone(*engine, next, 8);
  EXPECT_EQ(cached, int(second.size() + b.tokens.size()) - 1) << "the second conversation went on from its kept prefix";
  EXPECT_EQ(tokens, alone_greedy(next, 8));
  wait_for_idle_kv(*engine);
  EXPECT_EQ(engine->stats().kv_usage, 0.0);
}

// Kept prefixes hold blocks only while nobody needs them: requests that need the memory take it
// (least recently kept first) instead of waiting or preempting, and a prefix given back is not reused.
TEST_F(EngineTest, KeptPrefixesGiveWayToRequestsThatNeedTheirBlocks) {
  // 24 blocks of 16 positions for the full-attention layers: three ended requests of 100 positions
  // (7 blocks each) fill most of them.
  auto engine = make_engine(kv_bytes_of(24, 4), 4, 32);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) {
    prompts.push_back(pseudo_random_ids(96, 512, 50 + uint32_t(i)));
    const auto [tokens, cached] = run_alone(*engine, prompts.back(), 5);
    EXPECT_EQ(cached, 0);
    EXPECT_EQ(tokens, alone_greedy(prompts.back(), 5)) << "request " << i;
  }
  EXPECT_EQ(engine->stats().preemptions, 0u);
  EXPECT_EQ(run_alone(*engine, prompts[0], 5).second, 0) << "the oldest prefix was given back";
  EXPECT_EQ(run_alone(*engine, prompts[5], 5).second, 95) << "the newest is still kept";
  wait_for_idle_kv(*engine);
  EXPECT_EQ(engine->stats().kv_usage, 0.0);
}

// Prompt logprobs (completions' echo with logprobs): every prompt token from the second on gets its
// log-probability given the tokens before it, and the most likely tokens there, whatever the chunking
// (more rows than a step holds) and the requests beside it. The reference is the prompt run alone
// with every position's logits, log-softmax in double.
TEST_F(EngineTest, PromptLogprobsScoreEveryPromptToken) {
  auto engine = make_engine(32 << 20, 4, 64);  // 64-token steps, 32 logit rows: three steps for 90 tokens
  const auto prompt = pseudo_random_ids(90, 512, 61), other = pseudo_random_ids(30, 512, 62);
  FastSequenceModel m(*ckpt_, *ops_, comm_, 512, 32);
  const auto rows = m.forward(prompt, true);
  Collector scored, only, beside;
  GenerationRequest r = greedy_request(prompt, 4, scored);
  r.prompt_logprobs = 3;
  engine->submit(std::move(r));
  GenerationRequest q = greedy_request(prompt, 4, only);
  q.prompt_logprobs = 0;
  q.prompt_only = true;
  engine->submit(std::move(q));
  engine->submit(greedy_request(other, 12, beside));
  scored.wait();
  only.wait();
  beside.wait();

  EXPECT_EQ(engine->stats().prefix_cache_queries, other.size()) << "scored prompts never look up kept prefixes";
  EXPECT_EQ(scored.tokens, alone_greedy(prompt, 4));
  EXPECT_EQ(beside.tokens, alone_greedy(other, 12));
  EXPECT_EQ(only.finish, FinishReason::Length);
  EXPECT_TRUE(only.tokens.empty());
  EXPECT_EQ(only.completion_tokens, 0);
  EXPECT_EQ(scored.prompt_logprob_events, 1);
  EXPECT_EQ(only.prompt_logprob_events, 1);
  ASSERT_EQ(scored.prompt_logprobs.size(), prompt.size() - 1);
  ASSERT_EQ(only.prompt_logprobs.size(), prompt.size() - 1);
  for (size_t i = 1; i < prompt.size(); ++i) {
    const std::vector<float>& row = rows[i - 1];
    double sum = 0;
    const float best = *std::max_element(row.begin(), row.end());
    for (float l : row) sum += std::exp(double(l) - double(best));
    const double normalizer = double(best) + std::log(sum);
    const PromptTokenLogprob& s = scored.prompt_logprobs[i - 1];
    EXPECT_NEAR(s.logprob, double(row[size_t(prompt[i])]) - normalizer, 1e-4) << "token " << i;
    EXPECT_NEAR(only.prompt_logprobs[i - 1].logprob, s.logprob, 1e-4) << "token " << i;
    EXPECT_TRUE(only.prompt_logprobs[i - 1].top.empty());
    ASSERT_EQ(s.top.size(), 3u);
    EXPECT_EQ(s.top[0].token, int32_t(std::max_element(row.begin(), row.end()) - row.begin())) << "token " << i;
    EXPECT_NEAR(s.top[0].logprob, double(best) - normalizer, 1e-4);
    EXPECT_GE(s.top[0].logprob, s.top[1].logprob);
    EXPECT_GE(s.top[1].logprob, s.top[2].logprob);
  }
}

}  // namespace
}  // namespace tandem
