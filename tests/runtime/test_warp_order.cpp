// The warpers' order over a whole vocabulary (WarpOrder) against a full sort by comes_before, and the
// row's weights (row_weights) against libm.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "runtime/warp_order.h"

namespace tandem {
namespace {

// A row with what makes an order hard: ties, both zeros, -inf, NaN, +inf-free, a flat spread
// reaching many bands, and a length that is not a whole number of blocks.
std::vector<float> awkward_row(size_t n, uint32_t seed, float spread) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> value(0.0f, spread);
  std::vector<float> logits(n);
  for (float& v : logits) v = std::round(value(rng) * 4.0f) / 4.0f;  // many equal logits
  for (size_t i = 0; i < n; i += 97) logits[i] = -INFINITY;
  for (size_t i = 5; i < n; i += 131) logits[i] = NAN;
  for (size_t i = 7; i < n; i += 101) logits[i] = (i / 101) % 2 ? 0.0f : -0.0f;
  for (size_t i = 11; i < n; i += 1009) logits[i] = -300.0f;  // weight 0 after the clamp below exp(-87)
  return logits;
}

std::vector<int32_t> reference_order(const std::vector<float>& logits) {
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return comes_before(logits, a, b); });
  return ids;
}

TEST(WarpOrder, WalksExactlyTheFullSortOfTheRow) {
  for (const float spread : {0.5f, 3.0f, 12.0f}) {
    for (const float temperature : {1.0f, 0.3f, 2.5f}) {
      const std::vector<float> logits = awkward_row(20011, 3 + uint32_t(spread), spread);
      std::vector<float> weights(logits.size()), block_max;
      row_weights(logits, 1.0f / temperature, weights, block_max);
      std::vector<uint64_t> keys;
      WarpOrder order(logits, weights, block_max, keys);
      const std::vector<int32_t> ref = reference_order(logits);
      for (size_t i = 0; i < ref.size(); ++i)
        ASSERT_EQ(order.at(i), ref[i]) << "position " << i << ", spread " << spread << ", T " << temperature;
      EXPECT_EQ(order.at(ref.size()), -1);
    }
  }
}

TEST(WarpOrder, AnswersPositionsAskedOutOfOrder) {
  const std::vector<float> logits = awkward_row(5000, 9, 4.0f);
  std::vector<float> weights(logits.size()), block_max;
  row_weights(logits, 1.0f, weights, block_max);
  std::vector<uint64_t> keys;
  WarpOrder order(logits, weights, block_max, keys);
  const std::vector<int32_t> ref = reference_order(logits);
  for (const size_t i : {size_t(40), size_t(3), size_t(4000), size_t(0), size_t(4999), size_t(41)})
    EXPECT_EQ(order.at(i), ref[i]) << "position " << i;
}

TEST(WarpOrder, RowWeightsAreTheSoftmaxNumerators) {
  const std::vector<float> logits = awkward_row(70001, 21, 5.0f);
  for (const float inv_t : {1.0f, 1.7f, 0.4f}) {
    std::vector<float> weights(logits.size()), block_max;
    const double total = row_weights(logits, inv_t, weights, block_max);
    float max = -INFINITY;
    for (float v : logits)
      if (v * inv_t > max) max = v * inv_t;
    double want_total = 0.0;
    for (size_t i = 0; i < logits.size(); ++i) {
      const float v = logits[i];
      const double want = std::isnan(v) || v == -INFINITY ? 0.0 : std::exp(double(v * inv_t) - double(max));
      want_total += want;
      if (want < 1e-37) {  // below exp(-85): nothing, or a value far below every sum it joins
        ASSERT_LE(weights[i], 1e-36f) << i;
        continue;
      }
      // The exponent v / T - max is a float difference, rounded by up to half an ulp of its size.
      const double x = std::abs(double(v * inv_t) - double(max));
      ASSERT_NEAR(weights[i], want, want * (6e-7 + x * 1.2e-7)) << "id " << i << ", logit " << v;
    }
    EXPECT_NEAR(total, want_total, want_total * 1e-6);
    ASSERT_EQ(block_max.size(), (logits.size() + kWeightBlock - 1) / kWeightBlock);
    for (size_t b = 0; b < block_max.size(); ++b) {
      const size_t end = std::min(logits.size(), (b + 1) * kWeightBlock);
      EXPECT_EQ(block_max[b], *std::max_element(weights.begin() + long(b * kWeightBlock), weights.begin() + long(end)));
    }
  }
}

TEST(WarpOrder, RowsWithInfiniteMaximaWeighOnlyTheirInfinities) {
  std::vector<float> logits(300, 1.0f);
  logits[17] = INFINITY;
  logits[250] = INFINITY;
  logits[40] = NAN;
  std::vector<float> weights(logits.size()), block_max;
  EXPECT_EQ(row_weights(logits, 1.0f, weights, block_max), 2.0);
  for (size_t i = 0; i < logits.size(); ++i) EXPECT_EQ(weights[i], i == 17 || i == 250 ? 1.0f : 0.0f) << i;

  std::vector<float> nothing(300, -INFINITY);
  nothing[3] = NAN;
  EXPECT_EQ(row_weights(nothing, 1.0f, weights, block_max), 0.0);
  for (float w : weights) EXPECT_EQ(w, 0.0f);
}

TEST(WarpOrder, ScaledSumAddsTheRoundedProbabilities) {
  std::vector<float> weights(1003);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (float& w : weights) w = u(rng);
  const double scale = 1.0 / 501.7;
  double want = 0.0;
  for (float w : weights) want += double(float(double(w) * scale));
  EXPECT_NEAR(scaled_sum(weights, scale), want, 1e-12);
}

}  // namespace
}  // namespace tandem
