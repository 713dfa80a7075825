// The sampler: greedy, the Hugging Face warper order, penalties, seeds and log-probabilities.
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "runtime/sampler.h"

namespace tandem {
namespace {

std::vector<float> row() { return {1.0f, 3.0f, 2.0f, -1.0f, 2.5f}; }

int sample_once(const SamplingParams& p, std::vector<float> logits, std::vector<int32_t> prompt = {}) {
  Sampler s(p, prompt);
  return s.sample(logits).token;
}

// How often one sampler (one random stream) draws each token from `draws` copies of a row.
std::map<int32_t, int> draw_counts(const SamplingParams& p, const std::vector<float>& logits, int draws) {
  Sampler s(p, {});
  std::map<int32_t, int> counts;
  for (int i = 0; i < draws; ++i) {
    auto l = logits;
    ++counts[s.sample(l).token];
  }
  return counts;
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
  const int n = 40000;
  auto counts = draw_counts(p, row(), n);
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

// A vocabulary the size of Gemma's, spread over many orders of magnitude of probability, so that
// the candidates come from several of the sampler's lazily sorted bands.
std::vector<float> wide_row(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> r(n);
  for (float& v : r) v = normal(rng);
  return r;
}

// The reference: sort every id by logit (ties: lower id first), softmax at temperature t.
std::vector<std::pair<int32_t, double>> sorted_softmax(const std::vector<float>& logits, float t) {
  std::vector<std::pair<int32_t, double>> p(logits.size());
  const double max = *std::max_element(logits.begin(), logits.end()) / double(t);
  double total = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    p[i] = {int32_t(i), std::exp(logits[i] / double(t) - max)};
    total += p[i].second;
  }
  for (auto& [id, q] : p) q /= total;
  std::sort(p.begin(), p.end(), [&](const auto& a, const auto& b) {
    return logits[size_t(a.first)] > logits[size_t(b.first)] ||
           (logits[size_t(a.first)] == logits[size_t(b.first)] && a.first < b.first);
  });
  return p;
}

TEST(Sampler, TopPOverAWholeVocabularyKeepsExactlyTheReferencePrefix) {
  const auto logits = wide_row(65536, 5);
  const auto ref = sorted_softmax(logits, 1.0f);
  std::set<int32_t> prefix;  // the smallest prefix with mass >= 0.6
  double mass = 0;
  for (const auto& [id, q] : ref) {
    prefix.insert(id);
    if ((mass += q) >= 0.6) break;
  }
  ASSERT_GT(prefix.size(), 50u);  // a real spread, not one token
  SamplingParams p;
  p.top_p = 0.6f;
  p.seed = 3;
  const int draws = 1000;
  auto counts = draw_counts(p, logits, draws);
  for (const auto& [t, c] : counts) ASSERT_TRUE(prefix.count(t)) << "token " << t << " is outside the top-p prefix";
  // The most likely token, renormalized over the prefix.
  const double top = ref[0].second / mass;
  EXPECT_NEAR(counts[ref[0].first] / double(draws), top, 4 * std::sqrt(top * (1 - top) / draws) + 0.002);
}

TEST(Sampler, FullVocabularyDrawsFollowTheSoftmaxAcrossBands) {
  // One token at logit 0, 300 at -6 and 20000 at -12: each group's weights lie 2^8 or more below the
  // group's before it, so the sampler reaches them in separate bands, and only a draw that passes
  // the mass above reaches a lower one. Probabilities by group: 1, 300 e^-6, 20000 e^-12 over their sum.
  std::vector<float> logits(20301, -12.0f);
  logits[7] = 0.0f;
  for (int i = 0; i < 300; ++i) logits[size_t(100 + i * 67)] = -6.0f;
  const double w[3] = {1.0, 300 * std::exp(-6.0), 20000 * std::exp(-12.0)};
  const double total = w[0] + w[1] + w[2];
  SamplingParams p;
  p.seed = 11;
  const int draws = 5000;
  int counts[3] = {0, 0, 0};
  for (const auto& [t, c] : draw_counts(p, logits, draws)) {
    const float chosen = logits[size_t(t)];
    counts[chosen == 0.0f ? 0 : chosen == -6.0f ? 1 : 2] += c;
  }
  for (int g = 0; g < 3; ++g) {
    const double q = w[g] / total;
    EXPECT_NEAR(counts[g] / double(draws), q, 5 * std::sqrt(q * (1 - q) / draws)) << "group " << g;
  }
}

TEST(Sampler, MinPOverAWholeVocabularyKeepsTheTokensAboveTheFloor) {
  const auto logits = wide_row(100000, 9);
  const auto ref = sorted_softmax(logits, 1.0f);
  const double floor = 0.05 * ref[0].second;
  SamplingParams p;
  p.min_p = 0.05f;
  p.seed = 4;
  for (const auto& [t, c] : draw_counts(p, logits, 500)) {
    const double q = std::exp(double(logits[size_t(t)]) - double(logits[size_t(ref[0].first)])) * ref[0].second;
    ASSERT_GE(q, floor * (1 - 1e-5)) << "token " << t;
  }
}

// A Gemma-sized row with ties everywhere (whole-number logits), some NaNs and -infs.
std::vector<float> tied_row(size_t n, uint32_t seed) {
  auto r = wide_row(n, seed);
  for (float& v : r) v = std::round(v);
  for (size_t i = 5; i < n; i += 9973) r[i] = NAN;
  for (size_t i = 11; i < n; i += 7919) r[i] = -INFINITY;
  return r;
}

// The first k ids by logit (NaN as -inf), ties by lower id: the order top-k keeps.
std::vector<int32_t> reference_top_k(const std::vector<float>& logits, size_t k) {
  auto key = [&](int32_t id) { return std::isnan(logits[size_t(id)]) ? -INFINITY : logits[size_t(id)]; };
  std::vector<int32_t> ids(logits.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return key(a) > key(b); });
  ids.resize(k);
  return ids;
}

TEST(Sampler, TopKOverAWholeVocabularyDrawsExactlyTheReferenceTopK) {
  const auto logits = tied_row(262144, 21);
  auto ref = reference_top_k(logits, 65);
  ASSERT_EQ(logits[size_t(ref[63])], logits[size_t(ref[64])]);  // the cut falls inside a tie
  ref.resize(64);
  SamplingParams p;
  p.top_k = 64;
  p.temperature = 50.0f;  // nearly flat over the 64, so each of them shows up
  p.seed = 6;
  const auto counts = draw_counts(p, logits, 6000);
  const std::set<int32_t> allowed(ref.begin(), ref.end());
  for (const auto& [t, c] : counts) ASSERT_TRUE(allowed.count(t)) << "token " << t << " is not in the top 64";
  EXPECT_EQ(counts.size(), allowed.size());
}

TEST(Sampler, TopKWithFewerFiniteLogitsThanKDrawsOnlyThose) {
  std::vector<float> logits(100000, -INFINITY);
  const std::set<int32_t> finite = {3, 999, 50000, 99999};
  for (int32_t id : finite) logits[size_t(id)] = float(id % 7);
  logits[17] = NAN;
  SamplingParams p;
  p.top_k = 64;
  p.seed = 2;
  const auto counts = draw_counts(p, logits, 400);
  for (const auto& [t, c] : counts) ASSERT_TRUE(finite.count(t)) << "token " << t;
  EXPECT_EQ(counts.size(), finite.size());
}

TEST(Sampler, InfiniteAndNaNLogitsGiveAWellDefinedDraw) {
  for (int top_k : {0, 64}) {
    SamplingParams p;
    p.top_k = top_k;
    p.seed = 9;
    auto logits = wide_row(100000, 3);
    logits[4242] = INFINITY;
    logits[10] = NAN;
    for (const auto& [t, c] : draw_counts(p, logits, 50)) EXPECT_EQ(t, 4242) << "top_k " << top_k;
    std::vector<float> none(5000, -INFINITY);
    none[3] = NAN;
    for (const auto& [t, c] : draw_counts(p, none, 20)) EXPECT_EQ(t, 0) << "top_k " << top_k;
  }
}

TEST(Sampler, GreedyTakesTheFirstOfTiedMaximaAndNeverANaN) {
  SamplingParams p;
  p.temperature = 0;
  auto logits = wide_row(262144, 8);
  logits[0] = NAN;
  logits[70001] = 40.0f;
  logits[200] = 40.0f;
  EXPECT_EQ(sample_once(p, logits), 200);
  logits[262143] = INFINITY;
  EXPECT_EQ(sample_once(p, logits), 262143);
  EXPECT_EQ(sample_once(p, std::vector<float>(1000, -INFINITY)), 0);
  EXPECT_EQ(sample_once(p, std::vector<float>(1000, NAN)), 0);
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

TEST(Sampler, LogitBiasIsAddedBeforeThePenalties) {
  SamplingParams p;
  p.temperature = 0;
  p.logit_bias = {{0, 2.1f}};  // token 0: 1.0 -> 3.1, above token 1 (3.0)
  EXPECT_EQ(sample_once(p, row(), {}), 0);
  p.logit_bias = {{1, -100.0f}, {4, -100.0f}};  // the two best (3.0, 2.5) pushed out: token 2 (2.0)
  EXPECT_EQ(sample_once(p, row(), {}), 2);
  // Token 1 in the prompt, +5 and a repetition penalty of 4: biased first, (3 + 5) / 4 = 2.0 loses
  // to token 4 (2.5); penalized first, 3 / 4 + 5 = 5.75 would win.
  p.logit_bias = {{1, 5.0f}};
  p.repetition_penalty = 4.0f;
  EXPECT_EQ(sample_once(p, row(), {1}), 4);
  // Sampling draws from the biased row: -100 on every token but one leaves only that one.
  SamplingParams warm;
  warm.temperature = 1.0f;
  warm.seed = 7;
  for (int32_t t = 0; t < int32_t(row().size()); ++t)
    if (t != 3) warm.logit_bias.emplace_back(t, -100.0f);
  Sampler s(warm, {});
  const std::vector<float> l = row();
  for (int i = 0; i < 20; ++i) EXPECT_EQ(s.sample(l).token, 3);
  EXPECT_EQ(l, row());  // the model's row is not changed
}

TEST(Sampler, MinTokensKeepsTheBlockedIdsOutUntilThatManyWereSampled) {
  SamplingParams p;
  p.temperature = 0;
  p.min_tokens = 3;
  p.min_tokens_blocked = {1, 4};  // the two best (3.0, 2.5): token 2 (2.0) until three were sampled
  p.logit_bias = {{4, 50.0f}};    // no bias brings a blocked id back
  p.logprobs = true;
  Sampler s(p, {});
  const std::vector<float> l = row();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(s.sample(l).token, 2) << i;
  const SampledToken after = s.sample(l);
  EXPECT_EQ(after.token, 4);
  EXPECT_NEAR(after.logprob, 2.5 - std::log(std::exp(1.0) + std::exp(3.0) + std::exp(2.0) + std::exp(-1.0) + std::exp(2.5)),
              1e-5) << "log-probabilities stay the model's";
  EXPECT_TRUE(p.adjusts_logits());
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

// Over a row far wider than the top_logprobs count (the sampler reads only the blocks that can hold
// them), the alternatives are the reference sort's first k: logit descending, the lower id first
// among equal logits, never a NaN.
TEST(Sampler, TopLogprobsOverAWholeVocabularyAreTheReferenceOrder) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> l(20000);
  for (float& v : l) v = std::round(normal(rng) * 8.0f) / 8.0f;  // coarse: many equal logits
  l[777] = NAN;
  l[12345] = 12.0f;
  SamplingParams p;
  p.temperature = 0;
  p.logprobs = true;
  p.top_logprobs = 40;
  Sampler s(p, {});
  const SampledToken t = s.sample(l);
  std::vector<int32_t> ids(l.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    const float la = std::isnan(l[size_t(a)]) ? -INFINITY : l[size_t(a)];
    const float lb = std::isnan(l[size_t(b)]) ? -INFINITY : l[size_t(b)];
    return la > lb;
  });
  double total = 0;
  for (float v : l)
    if (!std::isnan(v)) total += std::exp(double(v) - 12.0);
  const double normalizer = 12.0 + std::log(total);
  ASSERT_EQ(t.top.size(), 40u);
  for (size_t i = 0; i < t.top.size(); ++i) {
    EXPECT_EQ(t.top[i].token, ids[i]) << i;
    EXPECT_NEAR(t.top[i].logprob, l[size_t(ids[i])] - normalizer, 1e-4) << i;
  }
  EXPECT_EQ(t.token, 12345);
}

// The log-sum-exp under every log-probability, over a Gemma-sized row with masked (-inf) and NaN
// logits, against libm in double precision; a row of nothing finite gives -inf, one with +inf
// logits +inf.
TEST(Sampler, LogNormalizerOfAWholeVocabularyMatchesDoublePrecision) {
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(-3.0f, 6.0f);
  std::vector<float> l(262144 + 5);  // a tail past the vector width
  for (float& v : l) v = normal(rng);
  l[3] = -INFINITY;
  l[100] = NAN;
  l[262146] = -INFINITY;
  l[5000] = 41.0f;  // one logit far above the rest
  double sum = 0.0;
  for (float v : l)
    if (!std::isnan(v)) sum += std::exp(double(v) - 41.0);
  EXPECT_NEAR(log_normalizer(l), 41.0 + std::log(sum), 1e-6);
  l[5000] = 2.0f;  // now thousands of terms of similar size
  sum = 0.0;
  float max = -INFINITY;
  for (float v : l) max = v > max ? v : max;
  for (float v : l)
    if (!std::isnan(v)) sum += std::exp(double(v) - max);
  EXPECT_NEAR(log_normalizer(l), max + std::log(sum), 1e-5);
  EXPECT_EQ(log_normalizer(std::vector<float>{-INFINITY, NAN, -INFINITY}), -INFINITY);
  EXPECT_EQ(log_normalizer(std::vector<float>{1.0f, INFINITY, 2.0f}), INFINITY);
}

// Penalties steer the choice but not the reported log-probabilities, which describe the model's
// own row; the caller's row is read, never written.
TEST(Sampler, PenaltiesLeaveTheRowAndItsLogprobsAlone) {
  SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 4.0f;  // token 1 (3.0, in the prompt) -> 0.75: token 4 (2.5) wins
  p.logprobs = true;
  p.top_logprobs = 1;
  Sampler s(p, std::vector<int32_t>{1});
  const std::vector<float> l = row();
  const SampledToken t = s.sample(l);
  EXPECT_EQ(t.token, 4);
  EXPECT_EQ(l, row());
  double total = 0;
  for (float v : row()) total += std::exp(v);
  EXPECT_NEAR(t.logprob, 2.5 - std::log(total), 1e-5);
  ASSERT_EQ(t.top.size(), 1u);
  EXPECT_EQ(t.top[0].token, 1);  // the model's most likely token, before the penalty
}

}  // namespace
}  // namespace tandem
