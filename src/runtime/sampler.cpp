#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>

#include "runtime/warp_order.h"

namespace tandem {

namespace {

constexpr size_t kBlock = 64;  // ids per block of block_maxima

// The largest logit of each block of kBlock ids (NaNs never count; -inf for a block of NaNs).
// Sixteen independent running maxima per block instead of one chain of comparisons: a Gemma row
// (1 MB) in ~0.05 ms instead of ~0.2.
void block_maxima(std::span<const float> logits, std::vector<float>& maxima) {
  const size_t vocab = logits.size(), blocks = (vocab + kBlock - 1) / kBlock;
  maxima.resize(blocks);
  const float* p = logits.data();
  for (size_t b = 0; b < blocks; ++b) {
    const size_t first = b * kBlock, end = std::min(vocab, first + kBlock);
    float m = -INFINITY;
    if (end - first == kBlock) {
      float lanes[16];
      for (float& l : lanes) l = -INFINITY;
      for (size_t i = first; i < end; i += 16)
        for (size_t j = 0; j < 16; ++j) lanes[j] = p[i + j] > lanes[j] ? p[i + j] : lanes[j];
      for (float l : lanes) m = l > m ? l : m;
    } else {
      for (size_t i = first; i < end; ++i) m = p[i] > m ? p[i] : m;
    }
    maxima[b] = m;
  }
}

// The first id of the largest logit, as comes_before orders them: a NaN never wins, and a row of
// nothing but -inf and NaN gives 0.
int32_t argmax(std::span<const float> logits, std::vector<float>& maxima) {
  block_maxima(logits, maxima);
  size_t best_block = 0;
  for (size_t b = 1; b < maxima.size(); ++b)
    if (maxima[b] > maxima[best_block]) best_block = b;
  const float best = maxima.empty() ? -INFINITY : maxima[best_block];
  if (!(best > -INFINITY)) return 0;
  for (size_t i = best_block * kBlock; i < logits.size(); ++i)
    if (logits[i] == best) return int32_t(i);
  return 0;
}

}  // namespace

// Compiled for AVX-512, AVX2 and the baseline, the copy picked at load time from cpuid (GCC's
// target_clones): 262144 logits in ~0.1 ms on AVX-512 (1.26 ms with libm's double exp, 1.5% of an
// E4B q4 decode step for every request that asks for log-probabilities).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
RowExpSums row_exp_sums(std::span<const float> logits) {
  RowExpSums r;
  constexpr size_t kLanes = 16, kRun = 1024;
  const float* p = logits.data();
  const size_t n = logits.size(), whole = n / kLanes * kLanes;
  r.max = row_max(p, n);
  if (r.max == -INFINITY) return r;
  if (r.max == INFINITY) {  // exp(logit - inf): 1 for each +inf logit, 0 for the rest
    for (float v : logits) r.sum += v == INFINITY ? 1.0 : 0.0;
    return r;
  }
  // Sixteen float sums over runs of 1024 logits (each term is at most 1, so a run's sums stay
  // within ~4e-6 of exact), added into a double.
  const float max = r.max;
  for (size_t run = 0; run < whole; run += kRun) {
    float lanes[kLanes] = {};
    const size_t end = std::min(whole, run + kRun);
    for (size_t i = run; i < end; i += kLanes)
      for (size_t j = 0; j < kLanes; ++j) {
        const float e = exp_nonpositive(p[i + j] - max);
        lanes[j] += e == e ? e : 0.0f;  // a NaN logit counts as -inf
      }
    for (float l : lanes) r.sum += double(l);
  }
  for (size_t i = whole; i < n; ++i)
    if (!std::isnan(p[i])) r.sum += double(exp_nonpositive(p[i] - max));
  return r;
}

double log_normalizer(std::span<const float> logits) {
  const RowExpSums r = row_exp_sums(logits);
  return r.sum > 0.0 ? r.max + std::log(r.sum) : -INFINITY;
}

// The first k ids in the warpers' order (comes_before), as a partial sort of every id gives them.
// The k largest block maxima are logits of k different ids, so the k-th of them is a floor that
// every one of the first k ids reaches; only the blocks whose maximum reaches it are scanned, and
// only their ids at or above it sorted: a few hundred of Gemma's 262144 for k = 64, where a heap
// over every id took ~0.3 ms per token. maxima: scratch.
void top_k_order(std::span<const float> logits, size_t k, std::vector<float>& maxima, std::vector<int32_t>& order) {
  const size_t vocab = logits.size();
  float floor = -INFINITY;
  size_t blocks = 0;
  if (k > 0 && vocab > k * kBlock) {
    block_maxima(logits, maxima);
    blocks = maxima.size();
    maxima.resize(2 * blocks);  // a copy to select from, after the maxima in block order
    const auto selected = maxima.begin() + long(blocks);
    std::copy(maxima.begin(), selected, selected);
    std::nth_element(selected, selected + long(k - 1), maxima.end(), std::greater<float>());
    floor = selected[long(k - 1)];
  }
  order.clear();
  if (floor == -INFINITY) {  // nothing to cut by value (and NaNs, as -inf, may be among the first k)
    order.resize(vocab);
    std::iota(order.begin(), order.end(), 0);
  } else {
    for (size_t b = 0; b < blocks; ++b) {
      if (!(maxima[b] >= floor)) continue;
      for (size_t i = b * kBlock; i < std::min(vocab, (b + 1) * kBlock); ++i)
        if (logits[i] >= floor) order.push_back(int32_t(i));
    }
  }
  k = std::min(k, order.size());
  std::partial_sort(order.begin(), order.begin() + long(k), order.end(),
                    [&](int32_t a, int32_t b) { return comes_before(logits, a, b); });
  order.resize(k);
}

Sampler::Sampler(const SamplingParams& params, std::span<const int32_t> prompt) : params_(params) {
  rng_.seed(params.seed ? *params.seed : std::random_device{}());
  if (params.repetition_penalty != 1.0f) penalized_.assign(prompt.begin(), prompt.end());
  if (params.json_vocabulary) json_.emplace(params.json_vocabulary, params.json_end_tokens, params.json_grammar);
}

void Sampler::apply_bias_and_penalties(std::span<float> logits) const {
  // The bias first, to the logits the model produced (as OpenAI describes it); ids past the
  // row were refused with the request.
  for (const auto& [t, bias] : params_.logit_bias)
    if (t >= 0 && size_t(t) < logits.size()) logits[size_t(t)] += bias;
  if (params_.repetition_penalty != 1.0f) {
    // HF: divide positive logits, multiply negative ones, once per distinct token seen.
    std::vector<int32_t> seen(penalized_);
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    for (int32_t t : seen) {
      if (t < 0 || size_t(t) >= logits.size()) continue;
      float& l = logits[size_t(t)];
      l = l > 0 ? l / params_.repetition_penalty : l * params_.repetition_penalty;
    }
  }
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) {
    // OpenAI: subtract presence once and frequency per occurrence, over generated tokens.
    for (const auto& [t, count] : output_counts_)
      logits[size_t(t)] -= params_.presence_penalty + params_.frequency_penalty * float(count);
  }
  // Last, so no bias can undo it.
  if (sampled_ < params_.min_tokens)
    for (int32_t t : params_.min_tokens_blocked)
      if (t >= 0 && size_t(t) < logits.size()) logits[size_t(t)] = -INFINITY;
}

// Temperature, then top-k, top-p and min-p over the candidates in logit order, then a draw.
int32_t Sampler::sample_warped(std::span<const float> logits) {
  const float inv_t = 1.0f / params_.temperature;
  const size_t vocab = logits.size();
  if (vocab == 0) return -1;
  weights_.resize(vocab);
  size_t count = vocab;  // candidates
  double total = 0.0;
  std::optional<WarpOrder> lazy;
  if (params_.top_k > 0 && size_t(params_.top_k) < vocab) {
    top_k_order(logits, size_t(params_.top_k), maxima_, order_);
    count = order_.size();
    const float first = logits[size_t(order_[0])] * inv_t;
    const float max = std::isnan(first) ? -INFINITY : first;
    for (int32_t id : order_) total += (weights_[size_t(id)] = token_weight(logits[size_t(id)], inv_t, max));
  } else {
    total = row_weights(logits, inv_t, weights_, maxima_);
    lazy.emplace(logits, weights_, maxima_, warp_keys_);
  }
  auto candidate = [&](size_t i) -> int32_t {  // the i-th in logit order; -1 past the candidates
    if (i >= count) return -1;
    return lazy ? lazy->at(i) : order_[i];
  };
  if (!(total > 0.0)) return candidate(0);  // every candidate at -inf (or NaN): the first in order
  const double inv_total = 1.0 / total;
  auto prob = [&](int32_t id) { return float(weights_[size_t(id)] * inv_total); };

  size_t n = count;
  if (params_.top_p < 1.0f) {  // keep the smallest prefix whose mass reaches top_p (at least one)
    double mass = 0.0;
    size_t keep = 0;
    for (int32_t id; keep < n && (id = candidate(keep)) >= 0;) {
      mass += prob(id);
      ++keep;
      if (mass >= params_.top_p) break;
    }
    n = keep;
  }
  if (params_.min_p > 0.0f) {  // drop candidates below min_p times the most likely one
    const float floor = params_.min_p * prob(candidate(0));
    size_t keep = 1;
    for (int32_t id; keep < n && (id = candidate(keep)) >= 0 && prob(id) >= floor;) ++keep;
    n = keep;
  }
  double kept = 0.0;  // the mass the draw is spread over
  if (n == count && lazy) {
    kept = scaled_sum(weights_, inv_total);  // no need to order the whole vocabulary
  } else {
    for (size_t i = 0; i < n; ++i) kept += prob(candidate(i));
  }
  double u = std::uniform_real_distribution<double>(0.0, kept)(rng_);
  // Candidates come in logit order, so those after the first of probability 0 have none either: where
  // rounding leaves u past the last one that has any, that one is the pick, never a token at -inf.
  int32_t pick = candidate(0);
  for (size_t i = 0; i < n; ++i) {
    const int32_t id = candidate(i);
    if (id < 0) break;
    const float p = prob(id);
    if (!(p > 0.0f)) break;
    pick = id;
    if (u < p) break;
    u -= p;
  }
  return pick;
}

SampledToken Sampler::sample(std::span<const float> logits, std::optional<double> given_normalizer) {
  SampledToken out;
  // Log-probabilities describe the model's own distribution, before penalties and warpers.
  double normalizer = 0.0;
  if (params_.logprobs) normalizer = given_normalizer ? *given_normalizer : log_normalizer(logits);
  if (params_.logprobs && params_.top_logprobs > 0) {
    top_k_order(logits, std::min(size_t(params_.top_logprobs), logits.size()), maxima_, order_);
    for (int32_t id : order_) out.top.push_back({id, float(logits[size_t(id)] - normalizer)});
  }
  std::span<const float> warped = logits;
  if (params_.adjusts_logits()) {
    penalized_logits_.assign(logits.begin(), logits.end());
    apply_bias_and_penalties(penalized_logits_);
    if (json_) json_->mask(penalized_logits_);
    warped = penalized_logits_;
  }
  out.token = params_.greedy() ? argmax(warped, maxima_) : sample_warped(warped);
  if (json_) json_->accept(out.token);
  if (params_.logprobs) out.logprob = float(logits[size_t(out.token)] - normalizer);
  ++output_counts_[out.token];
  ++sampled_;
  if (params_.repetition_penalty != 1.0f) penalized_.push_back(out.token);
  return out;
}

}  // namespace tandem
