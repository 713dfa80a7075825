// The engine end to end on tiny checkpoints: greedy output equals the single-sequence fast path,
// alone or batched with others (continuous batching, chunked prefill, preemption), cancellation
// frees KV memory at once, and bad requests are refused with the right kind.
#include <gtest/gtest.h>

#include <cmath>
#include <condition_variable>
#include <future>
#include <mutex>
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
  bool done = false;
  std::function<void(const TokenEvent&)> callback() {
    return [this](const TokenEvent& e) {
      std::lock_guard lock(mutex);
      if (e.token >= 0) tokens.push_back(e.token), logprobs.push_back(e.logprob);
      if (e.finish != FinishReason::None) {
        finish = e.finish;
        completion_tokens = e.completion_tokens;
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
                                      int max_waiting = 64) {
    EngineOptions o;
    o.worker.max_slots = slots;
    o.worker.max_step_tokens = step_tokens;
    o.worker.kv_memory_bytes = kv_bytes;
    o.max_waiting = max_waiting;
    o.sampling_pool = pool_.get();  // as `tandem serve` runs it
    return std::make_unique<Engine>(*ckpt_, *ops_, comm_, o);
  }
  // KV memory for `full_blocks` blocks of 16 positions in the full-attention layers, and the sliding
  // layers' windows of `sequences` sequences (with 32-token steps).
  size_t kv_bytes_of(int full_blocks, int sequences) const {
    KvCacheOptions o;
    o.block_size = 16;
    return size_t(KvCache::sliding_blocks_per_sequence(ckpt_->config, 16, 32)) * size_t(sequences) *
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

}  // namespace
}  // namespace tandem
