// The sampler: greedy, the Hugging Face warper order, penalties, seeds and log-probabilities.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "runtime/sampler.h"

namespace tandem {
namespace {

std::vector<float> row() { return {1.0f, 3.0f, 2.0f, -1.0f, 2.5f}; }

int sample_once(const SamplingParams& p, std::vector<float> logits, std::vector<int32_t> prompt = {}) {
  Sampler s(p, prompt);
  return s.sample(logits).token;
}

TEST(Sampler, GreedyPicksTheLargestLogit) {
  SamplingParams p;
  p.temperature = 0;
  EXPECT_EQ(sample_once(p, row()), 1);
}

TEST(Sampler, TopKOneAndTinyTopPAreGreedy) {
  for (uint64_t seed = 0; seed < 20; ++seed) {
    SamplingParams k1;
    k1.top_k = 1;
    k1.seed = seed;
    EXPECT_EQ(sample_once(k1, row()), 1);
    SamplingParams p;
    p.top_p = 0.01f;
    p.seed = seed;
    EXPECT_EQ(sample_once(p, row()), 1);
  }
}

TEST(Sampler, FrequenciesFollowTheSoftmax) {
  SamplingParams p;
  p.temperature = 2.0f;
  p.seed = 42;
  Sampler s(p, {});
  std::map<int, int> counts;
  const int n = 40000;
  for (int i = 0; i < n; ++i) {
    auto logits = row();
    ++counts[s.sample(logits).token];
  }
  const auto r = row();
  double total = 0;
  for (float v : r) total += std::exp(v / 2.0);
  for (int t = 0; t < 5; ++t) EXPECT_NEAR(counts[t] / double(n), std::exp(r[size_t(t)] / 2.0) / total, 0.01) << t;
}

TEST(Sampler, TopKThenTopPThenMinPRestrictTheCandidates) {
  SamplingParams p;
  p.top_k = 3;  // candidates 1, 4, 2
  for (uint64_t seed = 0; seed < 200; ++seed) {
    p.seed = seed;
    const int t = sample_once(p, row());
    EXPECT_TRUE(t == 1 || t == 4 || t == 2) << t;
  }
  SamplingParams mp;
  mp.min_p = 0.7f;  // p(4)/p(1) = e^-0.5 = 0.61 < 0.7: only token 1 survives
  for (uint64_t seed = 0; seed < 50; ++seed) {
    mp.seed = seed;
    EXPECT_EQ(sample_once(mp, row()), 1);
  }
}

TEST(Sampler, SameSeedSameTokensOtherSeedOtherTokens) {
  std::vector<float> flat(1000, 0.0f);
  SamplingParams p;
  p.seed = 7;
  Sampler a(p, {}), b(p, {});
  p.seed = 8;
  Sampler c(p, {});
  std::vector<int> ta, tb, tc;
  for (int i = 0; i < 50; ++i) {
    auto l1 = flat, l2 = flat, l3 = flat;
    ta.push_back(a.sample(l1).token);
    tb.push_back(b.sample(l2).token);
    tc.push_back(c.sample(l3).token);
  }
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta, tc);
}

TEST(Sampler, PenaltiesPushAwayRepeatedTokens) {
  SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 4.0f;  // token 1 (3.0, in the prompt) -> 0.75: token 4 (2.5) wins
  EXPECT_EQ(sample_once(p, row(), {1}), 4);
  SamplingParams f;
  f.temperature = 0;
  f.frequency_penalty = 1.0f;
  Sampler s(f, {});
  auto l = row();
  EXPECT_EQ(s.sample(l).token, 1);  // then 1 has count 1: 3 - 1 = 2 < 2.5
  l = row();
  EXPECT_EQ(s.sample(l).token, 4);
}

TEST(Sampler, LogprobsDescribeTheModelDistribution) {
  SamplingParams p;
  p.temperature = 0;
  p.logprobs = true;
  p.top_logprobs = 2;
  Sampler s(p, {});
  auto l = row();
  const SampledToken t = s.sample(l);
  const auto r = row();
  double total = 0;
  for (float v : r) total += std::exp(v);
  EXPECT_NEAR(t.logprob, 3.0 - std::log(total), 1e-5);
  ASSERT_EQ(t.top.size(), 2u);
  EXPECT_EQ(t.top[0].token, 1);
  EXPECT_EQ(t.top[1].token, 4);
  EXPECT_NEAR(t.top[1].logprob, 2.5 - std::log(total), 1e-5);
}

}  // namespace
}  // namespace tandem
