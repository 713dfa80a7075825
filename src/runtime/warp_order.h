#pragma once
// What sampling over a whole vocabulary needs from a logits row, without a sort of the row: the
// weights exp(logit / T - max) and their sum in one vectorized pass, and the ids in the warpers'
// order (comes_before) handed out one at a time, ordered only as far as top-p, min-p and the draw
// walk. Sorting Gemma's 262144 ids, or 19 passes over them, had cost 3-5 ms per sequence and token
// (bench/sampler_bench, docs/server.md "What sampling costs").
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

namespace tandem {

// Whether token a comes before token b in the warpers' order: logit descending, the lower id first
// among equal logits; a NaN logit counts as -inf, so the order is strict and total.
inline bool comes_before(std::span<const float> logits, int32_t a, int32_t b) {
  const float la = std::isnan(logits[size_t(a)]) ? -INFINITY : logits[size_t(a)];
  const float lb = std::isnan(logits[size_t(b)]) ? -INFINITY : logits[size_t(b)];
  return la > lb || (la == lb && a < b);
}

// exp(x) for x <= 0 (a scaled logit minus the row's max; NaN stays NaN): 2^n p(r), r = x - n ln 2,
// p of degree 6, relative error ~2e-7, 0 below -87 (so a -inf logit weighs nothing). Plain float
// arithmetic (rounding by the 1.5 * 2^23 trick, 2^n from its exponent bits) that the compiler
// vectorizes.
inline float exp_nonpositive(float x) {
  const float c = x < -87.0f ? -87.0f : x;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23
  const float n = (c * 1.44269504088896341f + kRound) - kRound;
  float r = c - n * 0.693145751953125f;
  r = r - n * 1.428606765330187045e-06f;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (int32_t(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale * float(c == x);  // 0 below -87, NaN stays NaN
}

// The largest of n logits (NaNs never win; -inf when there is none), in sixteen independent lanes
// that the compiler vectorizes. Inline, so that each target_clones copy of its callers gets its own.
inline float row_max(const float* p, size_t n) {
  constexpr size_t kLanes = 16;
  const size_t whole = n / kLanes * kLanes;
  float lanes[kLanes];
  for (float& l : lanes) l = -INFINITY;
  for (size_t i = 0; i < whole; i += kLanes)
    for (size_t j = 0; j < kLanes; ++j) lanes[j] = p[i + j] > lanes[j] ? p[i + j] : lanes[j];
  float max = -INFINITY;
  for (float l : lanes) max = l > max ? l : max;
  for (size_t i = whole; i < n; ++i) max = p[i] > max ? p[i] : max;
  return max;
}

// A candidate's weight exp(logit * inv_t - max), max the largest scaled logit: nothing for a NaN
// logit; when max is +inf, 1 for each +inf logit and nothing for the rest, and nothing for anyone
// when it is -inf (exp would give NaN for inf - inf).
inline float token_weight(float logit, float inv_t, float max) {
  if (max == INFINITY) return logit == INFINITY ? 1.0f : 0.0f;
  if (max == -INFINITY) return 0.0f;
  return std::isnan(logit) ? 0.0f : exp_nonpositive(logit * inv_t - max);
}

// Ids per block of a row's weight summary (WarpOrder skips the blocks with nothing in a band).
constexpr size_t kWeightBlock = 64;

// Every id's weight, as token_weight gives it, into weights (the row's size); their sum, and the
// largest weight of each block of kWeightBlock ids into block_max. One pass, vectorized.
double row_weights(std::span<const float> logits, float inv_t, std::span<float> weights, std::vector<float>& block_max);

// sum(float(weights[i] * scale)) in double: the probabilities the draw walks, over the whole row.
double scaled_sum(std::span<const float> weights, double scale);

// A key whose ascending order is comes_before's: the logit's bits turned so that a larger logit
// gives a smaller key (NaN as -inf, -0 as +0, which compare equal), then the id.
inline uint64_t warp_key(float logit, int32_t id) {
  const float f = std::isnan(logit) ? -INFINITY : (logit == 0.0f ? 0.0f : logit);
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  const uint32_t ascending = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  return uint64_t(~ascending) << 32 | uint32_t(id);
}

// The ids of a row with its weights (row_weights), in the warpers' order, one at a time. Ids go in
// bands by weight, [2^-8(b+1), 2^-8b) for band b (the last band takes the rest: zeros and
// subnormals), every weight of a band above every weight of the next; a band's ids are gathered
// when the walk reaches it, from the blocks whose largest weight reaches the band, as warp_keys,
// and ordered by an incremental quicksort: each step partitions only the front of what is left, so
// walking m of a band's n ids costs about n + m log n comparisons instead of a sort of the band.
// The order is comes_before's exactly, ties included, so the walk is the one a full sort gives.
class WarpOrder {
 public:
  // keys: storage (reused across rows).
  WarpOrder(std::span<const float> logits, std::span<const float> weights, std::span<const float> block_max,
            std::vector<uint64_t>& keys);
  // The i-th id, for i = 0, 1, 2, ... asked in any order; -1 past the last.
  int32_t at(size_t i);

 private:
  bool gather_next_band();
  void settle_front();  // orders [done_, next pivot) until done_ moves on

  static constexpr int kLastBand = 18;  // 2^-144: below it the last band takes every id left
  std::span<const float> logits_, weights_, block_max_;
  std::vector<uint64_t>& keys_;
  std::vector<size_t> pivots_;  // ends of the unordered segments of the current band, innermost last
  size_t done_ = 0;             // keys_[0, done_) is in its final order
  int band_ = 0;                // the next band to gather
};

}  // namespace tandem
