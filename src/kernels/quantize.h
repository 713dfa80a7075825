#pragma once
// Quantizes float rows into the Q8 / Q4 layouts of weight.h: symmetric, one f16 scale per block
// of 32 consecutive values, value = scale * q.
//
//   Q8: scale = max|x| / 127, q = round(x / scale) in [-127, 127].
//   Q4: scale = -m / 8 where m is the value of largest magnitude (sign kept), q = round(x / scale)
//       clamped to [-8, 7], stored as q + 8, two per byte, low nibble first. The extreme value lands
//       exactly on -8, so the block uses all 16 levels (llama.cpp's Q4_0 rule): the step is max|x|/8
//       rather than max|x|/7, an eighth finer, at the price of one clipped level on the other side.
// Rounding is to nearest, ties away from zero; the quotient uses the f16-rounded scale, so the
// stored scale and codes agree. An all-zero block gets scale 0 and codes 0 (q = 8 for Q4).
// n must be a multiple of 32.
#include <cstdint>

namespace tandem {

void quantize_row_q8(const float* x, int64_t n, int8_t* q, uint16_t* f16_scales);
void quantize_row_q4(const float* x, int64_t n, uint8_t* packed, uint16_t* f16_scales);

}  // namespace tandem
