#pragma once
// Picks the next token from logits: penalties, then temperature, top-k, top-p and min-p in the
// order Hugging Face applies them, then a draw from a per-request random stream (reproducible
// with a seed). Greedy when temperature is 0. Also reports log-probabilities for `logprobs`.
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "runtime/json_output.h"

namespace tandem {

struct SamplingParams {
  float temperature = 1.0f;   // 0: greedy
  int top_k = 0;              // 0: off
  float top_p = 1.0f;         // 1: off
  float min_p = 0.0f;         // 0: off
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;  // 1: off; applies to prompt and output tokens (HF semantics)
  std::optional<uint64_t> seed;
  int top_logprobs = 0;       // alternatives to report per token (with logprobs on)
  bool logprobs = false;
  // OpenAI's logit_bias: (token id, bias) pairs added to the model's logits before the penalties.
  std::vector<std::pair<int32_t, float>> logit_bias;
  // vLLM's min_tokens: the `min_tokens_blocked` ids (the stop tokens) are not sampled until this many
  // tokens were.
  int min_tokens = 0;
  std::vector<int32_t> min_tokens_blocked;
  // OpenAI's response_format json_object and json_schema: with a vocabulary, the output is held to
  // JSON (json_output.h), a value of `json_grammar` (null: any object), which the `json_end_tokens`
  // may end only once it is complete.
  std::shared_ptr<const TokenBytes> json_vocabulary;
  std::shared_ptr<const JsonGrammar> json_grammar;
  std::vector<int32_t> json_end_tokens;

  bool greedy() const { return temperature <= 0.0f; }
  // Whether the row is changed before the warpers (penalties or biases): a tensor-parallel step then
  // gathers whole rows, since any token may become a candidate.
  bool adjusts_logits() const {
    return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f || !logit_bias.empty() ||
           (min_tokens > 0 && !min_tokens_blocked.empty()) || json_vocabulary != nullptr;
  }
};

struct TokenLogprob {
  int32_t token;
  float logprob;
};

struct SampledToken {
  int32_t token = -1;
  float logprob = 0.0f;             // of the chosen token under the model's distribution
  std::vector<TokenLogprob> top;    // the top_logprobs most likely tokens
};

// Log-probabilities of a row: its largest logit and the sum of exp(logit - max) over the row, a NaN
// counting as -inf (as in top_k_order and the warpers); -inf and 0 for a row without a finite or
// +inf logit. Ranks of a tensor-parallel model each send these for their slice.
struct RowExpSums {
  float max = -INFINITY;
  double sum = 0.0;
};
RowExpSums row_exp_sums(std::span<const float> logits);
// log(sum(exp(logits))) from row_exp_sums: what a logit minus it is the log-probability of.
double log_normalizer(std::span<const float> logits);

// The first k ids of a logits row, largest logit first (among equal logits the lower id first; a NaN
// counts as -inf), without sorting the whole row. maxima: scratch.
void top_k_order(std::span<const float> logits, size_t k, std::vector<float>& maxima, std::vector<int32_t>& order);

class Sampler {
 public:
  Sampler(const SamplingParams& params, std::span<const int32_t> prompt);

  // `logits` is the full vocabulary row, read where it lies (the model's own output: a copy per
  // sequence and step cost E4B decode ~0.15 ms a token); entries of -inf are tokens that can't be
  // chosen. Biases and penalties apply to the sampler's own copy, made only when one is on. `log_normalizer`
  // (log-sum-exp of the model's logits) is computed from the row when not given. Records the
  // token it returns.
  SampledToken sample(std::span<const float> logits, std::optional<double> log_normalizer = std::nullopt);

 private:
  void apply_bias_and_penalties(std::span<float> logits) const;
  int32_t sample_warped(std::span<const float> logits);  // temperature > 0
  SamplingParams params_;
  std::optional<JsonOutputConstraint> json_;
  std::mt19937_64 rng_;
  std::unordered_map<int32_t, int> output_counts_;
  int sampled_ = 0;                 // tokens returned so far (min_tokens)
  std::vector<int32_t> penalized_;  // prompt and output tokens, for the repetition penalty
  std::vector<int32_t> order_;      // scratch: candidate indices
  std::vector<uint64_t> warp_keys_;  // scratch: the warpers' order over a whole vocabulary
  std::vector<float> weights_;      // scratch: exp(logit / T - max) by token id
  std::vector<float> maxima_;       // scratch: the logits' maxima per block of ids (top-k)
  std::vector<float> penalized_logits_;  // scratch: the row with biases and penalties applied
};

}  // namespace tandem
