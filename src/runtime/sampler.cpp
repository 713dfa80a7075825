#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>

namespace tandem {

namespace {

// log-sum-exp of the whole row, for log-probabilities.
double log_normalizer(std::span<const float> logits) {
  const float max = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float v : logits) sum += std::exp(double(v) - max);
  return max + std::log(sum);
}

// Whether token a comes before token b in the warpers' order: logit descending, the lower id first
// among equal logits; a NaN logit counts as -inf, so the order stays strict and weak for std::sort.
bool comes_before(std::span<const float> logits, int32_t a, int32_t b) {
  const float la = std::isnan(logits[size_t(a)]) ? -INFINITY : logits[size_t(a)];
  const float lb = std::isnan(logits[size_t(b)]) ? -INFINITY : logits[size_t(b)];
  return la > lb || (la == lb && a < b);
}

// Token ids in the warpers' order (comes_before), sorted lazily: the weights exp(logit / T - max)
// fall in bands [2^-8(b+1), 2^-8b), and a band is sorted only when the walk reaches it. Every
// weight of a band is above every weight of the next, so the bands end to end are the full order;
// top-p, min-p and the draw nearly always stop in the first band or two, so a 262144-token
// vocabulary costs a few passes instead of a sort (31 ms per token on the dev VM).
class LazyOrder {
 public:
  LazyOrder(std::span<const float> logits, std::span<const float> weights, std::vector<int32_t>& order)
      : logits_(logits), weights_(weights), order_(order) {
    order_.clear();
  }
  // The i-th candidate, sorting further bands as needed; -1 past the last.
  int32_t at(size_t i) {
    while (i >= order_.size() && extend()) {
    }
    return i < order_.size() ? order_[i] : -1;
  }

 private:
  bool extend() {
    if (band_ > kLastBand) return false;
    const float hi = band_ == 0 ? INFINITY : std::ldexp(1.0f, -8 * band_);
    const float lo = std::ldexp(1.0f, -8 * (band_ + 1));
    const bool last = band_ == kLastBand;
    ++band_;
    const size_t first = order_.size();
    const float last_floor = std::ldexp(1.0f, -8 * kLastBand);
    for (size_t i = 0; i < weights_.size(); ++i) {
      const float w = weights_[i];
      const bool in_band = last ? !(w >= last_floor) || w == INFINITY : w >= lo && w < hi;
      if (in_band) order_.push_back(int32_t(i));
    }
    std::sort(order_.begin() + long(first), order_.end(),
              [&](int32_t a, int32_t b) { return comes_before(logits_, a, b); });
    return true;
  }
  // Below 2^-152 no float is left: the last band takes what no band before took, zeros, infinities
  // and NaNs included, so every id comes out exactly once.
  static constexpr int kLastBand = 19;
  std::span<const float> logits_, weights_;
  std::vector<int32_t>& order_;
  int band_ = 0;
};

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

// Temperature, then top-k, top-p and min-p over the candidates in logit order, then a draw.
int32_t Sampler::sample_warped(std::span<const float> logits) {
  const float inv_t = 1.0f / params_.temperature;
  const size_t vocab = logits.size();
  if (vocab == 0) return -1;
  weights_.resize(vocab);
  size_t count = vocab;  // candidates
  double total = 0.0;
  std::optional<LazyOrder> lazy;
  if (params_.top_k > 0 && size_t(params_.top_k) < vocab) {
    count = size_t(params_.top_k);
    order_.resize(vocab);
    std::iota(order_.begin(), order_.end(), 0);
    std::partial_sort(order_.begin(), order_.begin() + long(count), order_.end(),
                      [&](int32_t a, int32_t b) { return comes_before(logits, a, b); });
    order_.resize(count);
    const float max = logits[size_t(order_[0])] * inv_t;
    for (int32_t id : order_) total += (weights_[size_t(id)] = std::exp(logits[size_t(id)] * inv_t - max));
  } else {
    float max = -INFINITY;
    for (float v : logits) max = std::max(max, v * inv_t);
    for (size_t i = 0; i < vocab; ++i) total += (weights_[i] = std::exp(logits[i] * inv_t - max));
    lazy.emplace(logits, weights_, order_);
  }
  auto candidate = [&](size_t i) -> int32_t {  // the i-th in logit order; -1 past the candidates
    if (i >= count) return -1;
    return lazy ? lazy->at(i) : order_[i];
  };
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
    for (size_t i = 0; i < vocab; ++i) kept += prob(int32_t(i));  // no need to order the whole vocabulary
  } else {
    for (size_t i = 0; i < n; ++i) kept += prob(candidate(i));
  }
  double u = std::uniform_real_distribution<double>(0.0, kept)(rng_);
  int32_t pick = candidate(0);
  for (size_t i = 0; i < n; ++i) {
    const int32_t id = candidate(i);
    if (id < 0) break;
    pick = id;
    if (u < prob(id)) break;
    u -= prob(id);
  }
  return pick;
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
    out.token = sample_warped(logits);
  }
  if (params_.logprobs) out.logprob = float(raw[size_t(out.token)] - normalizer);
  ++output_counts_[out.token];
  if (params_.repetition_penalty != 1.0f) penalized_.push_back(out.token);
  return out;
}

}  // namespace tandem
