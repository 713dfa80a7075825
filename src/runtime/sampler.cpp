#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace tandem {

namespace {

// log-sum-exp of the whole row, for log-probabilities.
double log_normalizer(std::span<const float> logits) {
  const float max = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float v : logits) sum += std::exp(double(v) - max);
  return max + std::log(sum);
}

}  // namespace

Sampler::Sampler(const SamplingParams& params, std::span<const int32_t> prompt) : params_(params) {
  rng_.seed(params.seed ? *params.seed : std::random_device{}());
  if (params.repetition_penalty != 1.0f) penalized_.assign(prompt.begin(), prompt.end());
}

void Sampler::apply_penalties(std::span<float> logits) const {
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
}

SampledToken Sampler::sample(std::span<float> logits, std::optional<double> given_normalizer) {
  SampledToken out;
  // Log-probabilities describe the model's own distribution, before penalties and warpers.
  double normalizer = 0.0;
  if (params_.logprobs) normalizer = given_normalizer ? *given_normalizer : log_normalizer(logits);
  if (params_.logprobs && params_.top_logprobs > 0) {
    const size_t k = std::min(size_t(params_.top_logprobs), logits.size());
    order_.resize(logits.size());
    std::iota(order_.begin(), order_.end(), 0);
    std::partial_sort(order_.begin(), order_.begin() + long(k), order_.end(),
                      [&](int32_t a, int32_t b) { return logits[size_t(a)] > logits[size_t(b)]; });
    for (size_t i = 0; i < k; ++i)
      out.top.push_back({order_[i], float(logits[size_t(order_[i])] - normalizer)});
  }
  std::vector<float> raw;
  if (params_.logprobs) raw.assign(logits.begin(), logits.end());

  apply_penalties(logits);
  if (params_.greedy()) {
    out.token = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  } else {
    // Temperature, then top-k, top-p, min-p over the candidates sorted by logit.
    const float inv_t = 1.0f / params_.temperature;
    order_.resize(logits.size());
    std::iota(order_.begin(), order_.end(), 0);
    size_t n = logits.size();
    auto by_logit = [&](int32_t a, int32_t b) {
      return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
    };
    if (params_.top_k > 0 && size_t(params_.top_k) < n) {
      n = size_t(params_.top_k);
      std::partial_sort(order_.begin(), order_.begin() + long(n), order_.end(), by_logit);
    } else {
      std::sort(order_.begin(), order_.end(), by_logit);
    }
    const float max = logits[size_t(order_[0])] * inv_t;
    probs_.resize(n);
    double total = 0.0;
    for (size_t i = 0; i < n; ++i) total += (probs_[i] = std::exp(logits[size_t(order_[i])] * inv_t - max));
    for (size_t i = 0; i < n; ++i) probs_[i] = float(probs_[i] / total);
    if (params_.top_p < 1.0f) {  // keep the smallest prefix whose mass reaches top_p (at least one)
      double mass = 0.0;
      size_t keep = 0;
      while (keep < n) {
        mass += probs_[keep++];
        if (mass >= params_.top_p) break;
      }
      n = keep;
    }
    if (params_.min_p > 0.0f) {  // drop candidates below min_p times the most likely one
      const float floor = params_.min_p * probs_[0];
      size_t keep = 1;
      while (keep < n && probs_[keep] >= floor) ++keep;
      n = keep;
    }
    double kept = 0.0;
    for (size_t i = 0; i < n; ++i) kept += probs_[i];
    double u = std::uniform_real_distribution<double>(0.0, kept)(rng_);
    size_t pick = n - 1;
    for (size_t i = 0; i < n; ++i) {
      if (u < probs_[i]) {
        pick = i;
        break;
      }
      u -= probs_[i];
    }
    out.token = order_[pick];
  }
  if (params_.logprobs) out.logprob = float(raw[size_t(out.token)] - normalizer);
  ++output_counts_[out.token];
  if (params_.repetition_penalty != 1.0f) penalized_.push_back(out.token);
  return out;
}

}  // namespace tandem
