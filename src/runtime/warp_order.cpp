#include "runtime/warp_order.h"

#include <algorithm>
#include <utility>

namespace tandem {

// Compiled for AVX-512, AVX2 and the baseline, the copy picked at load time from cpuid (GCC's
// target_clones), like row_exp_sums: libm's exp and one chain of double additions had taken ~1.5
// ms of the 4 ms that sampling a 262144-token row at temperature 1 cost.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
double row_weights(std::span<const float> logits, float inv_t, std::span<float> weights, std::vector<float>& block_max) {
  constexpr size_t kLanes = 16, kRun = 1024;
  const size_t n = logits.size(), whole = n / kLanes * kLanes;
  const float* p = logits.data();
  float* w = weights.data();
  // The largest scaled logit is the largest logit scaled (rounding keeps the order).
  const float max = row_max(p, n) * inv_t;
  double total = 0.0;
  if (max == INFINITY || max == -INFINITY) {  // token_weight's special rows, one id at a time
    for (size_t i = 0; i < n; ++i) total += (w[i] = token_weight(p[i], inv_t, max));
  } else {
    // Sixteen float sums over runs of 1024 weights (each at most 1), added into a double.
    for (size_t run = 0; run < whole; run += kRun) {
      float lanes[kLanes] = {};
      const size_t end = std::min(whole, run + kRun);
      for (size_t i = run; i < end; i += kLanes)
        for (size_t j = 0; j < kLanes; ++j) {
          float e = exp_nonpositive(p[i + j] * inv_t - max);
          e = e == e ? e : 0.0f;  // a NaN logit weighs nothing
          w[i + j] = e;
          lanes[j] += e;
        }
      for (float l : lanes) total += double(l);
    }
    for (size_t i = whole; i < n; ++i) total += (w[i] = token_weight(p[i], inv_t, max));
  }
  const size_t blocks = (n + kWeightBlock - 1) / kWeightBlock, whole_blocks = n / kWeightBlock;
  block_max.resize(blocks);
  for (size_t b = 0; b < whole_blocks; ++b) {
    float lanes[kLanes] = {};
    for (size_t i = b * kWeightBlock; i < (b + 1) * kWeightBlock; i += kLanes)
      for (size_t j = 0; j < kLanes; ++j) lanes[j] = w[i + j] > lanes[j] ? w[i + j] : lanes[j];
    float m = 0.0f;
    for (float l : lanes) m = l > m ? l : m;
    block_max[b] = m;
  }
  if (whole_blocks < blocks) {
    float m = 0.0f;
    for (size_t i = whole_blocks * kWeightBlock; i < n; ++i) m = w[i] > m ? w[i] : m;
    block_max[whole_blocks] = m;
  }
  return total;
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
double scaled_sum(std::span<const float> weights, double scale) {
  constexpr size_t kLanes = 8;
  const size_t n = weights.size(), whole = n / kLanes * kLanes;
  double lanes[kLanes] = {};
  for (size_t i = 0; i < whole; i += kLanes)
    for (size_t j = 0; j < kLanes; ++j) lanes[j] += double(float(double(weights[i + j]) * scale));
  double sum = 0.0;
  for (double l : lanes) sum += l;
  for (size_t i = whole; i < n; ++i) sum += double(float(double(weights[i]) * scale));
  return sum;
}

namespace {

// The keys of the ids whose weight lies in [lo, hi), in id order, appended to keys; only the blocks
// whose largest weight reaches lo are read. Each block's members are found as a bit mask first (a
// loop without branches, vectorized), so a deep band (tens of thousands of ids in a flat row) costs
// one pass of compares rather than a branch per id.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
void append_band_keys(std::span<const float> logits, std::span<const float> weights, std::span<const float> block_max,
                      float lo, float hi, std::vector<uint64_t>& keys) {
  const size_t n = weights.size();
  for (size_t b = 0; b < block_max.size(); ++b) {
    if (!(block_max[b] >= lo)) continue;
    const size_t base = b * kWeightBlock, count = std::min(kWeightBlock, n - base);
    const float* w = weights.data() + base;
    uint64_t members = 0;
    if (count == kWeightBlock) {
      for (size_t j = 0; j < kWeightBlock; ++j) members |= uint64_t(w[j] >= lo && w[j] < hi) << j;
    } else {
      for (size_t j = 0; j < count; ++j) members |= uint64_t(w[j] >= lo && w[j] < hi) << j;
    }
    for (; members; members &= members - 1) {
      const size_t i = base + size_t(__builtin_ctzll(members));
      keys.push_back(warp_key(logits[i], int32_t(i)));
    }
  }
}

}  // namespace

WarpOrder::WarpOrder(std::span<const float> logits, std::span<const float> weights, std::span<const float> block_max,
                     std::vector<uint64_t>& keys)
    : logits_(logits), weights_(weights), block_max_(block_max), keys_(keys) {
  keys_.clear();
}

int32_t WarpOrder::at(size_t i) {
  while (i >= done_) {
    if (pivots_.empty()) {
      if (!gather_next_band()) return -1;
    } else {
      settle_front();
    }
  }
  return int32_t(uint32_t(keys_[i]));
}

// Appends the keys of the next band that has any (in id order) and opens it as one unordered segment.
bool WarpOrder::gather_next_band() {
  while (band_ <= kLastBand) {
    const int band = band_++;
    const float hi = band == 0 ? INFINITY : std::ldexp(1.0f, -8 * band);
    const float lo = band == kLastBand ? 0.0f : std::ldexp(1.0f, -8 * (band + 1));
    const size_t first = keys_.size();
    append_band_keys(logits_, weights_, block_max_, lo, hi, keys_);
    if (keys_.size() > first) {
      pivots_.push_back(keys_.size());
      return true;
    }
  }
  return false;
}

// One step of the incremental quicksort on the segment [done_, pivots_.back()): a segment of a few
// keys is sorted outright; a larger one is partitioned around the median of its first, middle and
// last keys, and the pivot, now in its final place, bounds the next (front) segment.
void WarpOrder::settle_front() {
  constexpr size_t kSmall = 32;
  const size_t end = pivots_.back();
  if (done_ == end) {  // a pivot in its place, or the band's end
    pivots_.pop_back();
    if (end < keys_.size()) ++done_;
    return;
  }
  uint64_t* k = keys_.data();
  if (end - done_ <= kSmall) {
    std::sort(k + done_, k + end);
    done_ = end;
    return;
  }
  const size_t first = done_, last = end - 1, mid = first + (last - first) / 2;
  if (k[mid] < k[first]) std::swap(k[mid], k[first]);
  if (k[last] < k[first]) std::swap(k[last], k[first]);
  if (k[last] < k[mid]) std::swap(k[last], k[mid]);
  std::swap(k[mid], k[last]);  // the median, as the pivot, at the segment's end
  const uint64_t pivot = k[last];
  size_t store = first;
  for (size_t i = first; i < last; ++i)
    if (k[i] < pivot) std::swap(k[i], k[store++]);
  std::swap(k[store], k[last]);
  pivots_.push_back(store);
}

}  // namespace tandem
