#include "kernels/quantize.h"

#include <algorithm>
#include <cmath>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/weight.h"

namespace tandem {

namespace {

void check_length(int64_t n) {
  if (n % kQuantBlock) fail("cannot quantize a row of {} values: not a multiple of {}", n, kQuantBlock);
}

// std::lround (halves away from zero) without the library call, which was a third of `tandem
// quantize`'s time: the fraction v - trunc(v) is exact in float for |v| < 2^31, so the result is
// the same for every v the quantizers pass (finite, at most a few units past the code range).
inline int round_half_away(float v) {
  const int whole = int(v);  // toward zero
  const float fraction = v - float(whole);
  return whole + (fraction >= 0.5f) - (fraction <= -0.5f);
}

// 1 / scale, or 0 for a zero (or, after f16 rounding, vanished) scale so the block becomes zeros.
float inverse(float scale) { return scale != 0.0f ? 1.0f / scale : 0.0f; }

void check_block(const float* xb, uint16_t scale) {
  for (int i = 0; i < kQuantBlock; ++i)
    if (!std::isfinite(xb[i])) fail("cannot quantize {}: not a finite value", xb[i]);
  if (!std::isfinite(f16_to_f32(scale))) fail("cannot quantize a block: its scale overflows f16");
}

}  // namespace

void quantize_row_q8(const float* x, int64_t n, int8_t* q, uint16_t* f16_scales) {
  check_length(n);
  for (int64_t b = 0; b < n / kQuantBlock; ++b) {
    const float* xb = x + b * kQuantBlock;
    float amax = 0.0f;
    for (int i = 0; i < kQuantBlock; ++i) amax = std::max(amax, std::fabs(xb[i]));
    f16_scales[b] = f32_to_f16(amax / 127.0f);
    check_block(xb, f16_scales[b]);
    const float inv = inverse(f16_to_f32(f16_scales[b]));
    for (int i = 0; i < kQuantBlock; ++i)
      q[b * kQuantBlock + i] = int8_t(std::clamp(round_half_away(xb[i] * inv), -127, 127));
  }
}

void quantize_row_q4(const float* x, int64_t n, uint8_t* packed, uint16_t* f16_scales) {
  check_length(n);
  for (int64_t b = 0; b < n / kQuantBlock; ++b) {
    const float* xb = x + b * kQuantBlock;
    float extreme = 0.0f;
    for (int i = 0; i < kQuantBlock; ++i)
      if (std::fabs(xb[i]) > std::fabs(extreme)) extreme = xb[i];
    f16_scales[b] = f32_to_f16(-extreme / 8.0f);
    check_block(xb, f16_scales[b]);
    const float inv = inverse(f16_to_f32(f16_scales[b]));
    uint8_t* out = packed + b * kQuantBlock / 2;
    for (int i = 0; i < kQuantBlock; i += 2) {
      const int lo = std::clamp(round_half_away(xb[i] * inv), -8, 7) + 8;
      const int hi = std::clamp(round_half_away(xb[i + 1] * inv), -8, 7) + 8;
      out[i / 2] = uint8_t(lo | (hi << 4));
    }
  }
}

}  // namespace tandem
