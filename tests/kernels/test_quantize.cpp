// quantize_row_q8 / quantize_row_q4: layouts as weight.h decodes them, and round-trip error bounds.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/quantize.h"
#include "kernels/weight.h"

namespace tandem {
namespace {

std::vector<float> random_row(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, 0.02f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  v[5] = 0.3f;  // an outlier, as real weight rows have
  return v;
}

// Decodes through WeightMatrix::row_to_float, the loader's view of the bytes.
std::vector<float> decode(WeightFormat format, const std::vector<uint8_t>& data, const std::vector<uint16_t>& scales,
                          int64_t n) {
  WeightMatrix w;
  w.format = format;
  w.rows = 1;
  w.cols = n;
  w.data = data.data();
  w.row_stride = row_bytes(format, n);
  w.scales = reinterpret_cast<const uint8_t*>(scales.data());
  w.scale_stride = n / kQuantBlock * 2;
  std::vector<float> out(static_cast<size_t>(n));
  w.row_to_float(0, out.data());
  return out;
}

float block_amax(const std::vector<float>& x, int64_t b) {
  float m = 0;
  for (int i = 0; i < kQuantBlock; ++i) m = std::max(m, std::fabs(x[size_t(b * kQuantBlock + i)]));
  return m;
}

TEST(Quantize, Q8RoundTripWithinHalfAStep) {
  std::mt19937 rng(1);
  const int64_t n = 1024;
  const std::vector<float> x = random_row(n, rng);
  std::vector<uint8_t> q(static_cast<size_t>(n));
  std::vector<uint16_t> s(static_cast<size_t>(n / kQuantBlock));
  quantize_row_q8(x.data(), n, reinterpret_cast<int8_t*>(q.data()), s.data());
  const std::vector<float> back = decode(WeightFormat::Q8, q, s, n);
  for (int64_t i = 0; i < n; ++i) {
    const float step = f16_to_f32(s[size_t(i / kQuantBlock)]);
    EXPECT_NEAR(step, block_amax(x, i / kQuantBlock) / 127.0f, 1e-3f * step);
    EXPECT_LE(std::fabs(back[size_t(i)] - x[size_t(i)]), 0.5f * step * 1.0001f) << i;
    EXPECT_LE(std::abs(int(int8_t(q[size_t(i)]))), 127);
  }
}

TEST(Quantize, Q4RoundTripAndLayout) {
  std::mt19937 rng(2);
  const int64_t n = 512;
  const std::vector<float> x = random_row(n, rng);
  std::vector<uint8_t> packed(static_cast<size_t>(n / 2));
  std::vector<uint16_t> s(static_cast<size_t>(n / kQuantBlock));
  quantize_row_q4(x.data(), n, packed.data(), s.data());
  const std::vector<float> back = decode(WeightFormat::Q4, packed, s, n);
  for (int64_t b = 0; b < n / kQuantBlock; ++b) {
    const float step = std::fabs(f16_to_f32(s[size_t(b)]));
    EXPECT_NEAR(step, block_amax(x, b) / 8.0f, 1e-3f * step);
    for (int i = 0; i < kQuantBlock; ++i) {
      const size_t c = size_t(b * kQuantBlock + i);
      // within half a step, except the one clipped level (+8 steps) opposite the extreme value
      EXPECT_LE(std::fabs(back[c] - x[c]), step * 1.0001f) << c;
      if (std::fabs(x[c] / step) < 7.5f) {
        EXPECT_LE(std::fabs(back[c] - x[c]), 0.5f * step * 1.0001f) << c;
      }
    }
  }
  // the block's extreme value is exactly representable: it maps to code -8 (nibble 0)
  const int extreme_byte = 5 / 2;
  EXPECT_EQ(packed[extreme_byte] >> 4, 0) << "x[5] = 0.3 is the first block's extreme, odd column: high nibble";
  EXPECT_FLOAT_EQ(back[5], -8.0f * f16_to_f32(s[0]));
}

TEST(Quantize, NibbleOrderIsLowFirst) {
  std::vector<float> x(32, 0.0f);
  x[0] = -8.0f;  // extreme: scale 1, code -8
  x[1] = 3.0f;
  x[2] = 7.0f;
  std::vector<uint8_t> packed(16);
  std::vector<uint16_t> s(1);
  quantize_row_q4(x.data(), 32, packed.data(), s.data());
  EXPECT_EQ(f16_to_f32(s[0]), 1.0f);
  EXPECT_EQ(packed[0], uint8_t(0 | (11 << 4)));  // x0 -> -8+8 = 0 low, x1 -> 3+8 = 11 high
  EXPECT_EQ(packed[1], uint8_t(15 | (8 << 4)));  // x2 -> 15, x3 = 0 -> 8
}

// Codes round to nearest with halves away from zero (std::lround), in both formats and signs, and
// values a float step either side of a half go to the nearer code.
TEST(Quantize, HalvesRoundAwayFromZero) {
  std::vector<float> x(32, 0.0f);
  x[0] = 127.0f;  // Q8 scale 1
  const float below_half = std::nextafter(0.5f, 0.0f), above_half = std::nextafter(2.5f, 3.0f);
  const float values[] = {0.5f, -0.5f, 1.5f, -1.5f, 2.5f, -2.5f, below_half, -below_half, above_half, -above_half};
  const int q8_codes[] = {1, -1, 2, -2, 3, -3, 0, 0, 3, -3};
  for (size_t i = 0; i < std::size(values); ++i) x[1 + i] = values[i];
  std::vector<int8_t> q8(32);
  std::vector<uint16_t> s(1);
  quantize_row_q8(x.data(), 32, q8.data(), s.data());
  ASSERT_EQ(f16_to_f32(s[0]), 1.0f);
  for (size_t i = 0; i < std::size(values); ++i) EXPECT_EQ(q8[1 + i], q8_codes[i]) << values[i];

  x[0] = -8.0f;  // Q4 scale 1 (the extreme maps to -8)
  for (size_t i = 0; i < std::size(values); ++i) x[1 + i] = values[i];
  std::vector<uint8_t> packed(16);
  quantize_row_q4(x.data(), 32, packed.data(), s.data());
  ASSERT_EQ(f16_to_f32(s[0]), 1.0f);
  for (size_t i = 0; i < std::size(values); ++i) {
    const size_t c = 1 + i;
    const int code = ((c % 2 ? packed[c / 2] >> 4 : packed[c / 2] & 0xf)) - 8;
    EXPECT_EQ(code, q8_codes[i]) << values[i];
  }
}

TEST(Quantize, ZeroBlocksStayZero) {
  std::vector<float> x(64, 0.0f);
  x[40] = 1.0f;
  std::vector<uint8_t> q8(64), q4(32);
  std::vector<uint16_t> s8(2), s4(2);
  quantize_row_q8(x.data(), 64, reinterpret_cast<int8_t*>(q8.data()), s8.data());
  quantize_row_q4(x.data(), 64, q4.data(), s4.data());
  EXPECT_EQ(f16_to_f32(s8[0]), 0.0f);
  EXPECT_EQ(f16_to_f32(s4[0]), 0.0f);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(q8[size_t(i)], 0);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(q4[size_t(i)], 0x88);
  const std::vector<float> b8 = decode(WeightFormat::Q8, q8, s8, 64), b4 = decode(WeightFormat::Q4, q4, s4, 64);
  for (int i = 0; i < 64; ++i) {
    EXPECT_NEAR(b8[size_t(i)], x[size_t(i)], 0.5f / 127) << i;
    EXPECT_NEAR(b4[size_t(i)], x[size_t(i)], 1.0f / 8) << i;
  }
  EXPECT_FLOAT_EQ(b4[40], 1.0f);  // the extreme is exact
}

TEST(Quantize, RejectsBadInput) {
  std::vector<float> x(33, 1.0f);
  std::vector<int8_t> q(64);
  std::vector<uint16_t> s(2);
  EXPECT_THROW(quantize_row_q8(x.data(), 33, q.data(), s.data()), Error);
  std::vector<float> bad(32, 1.0f);
  bad[3] = NAN;
  EXPECT_THROW(quantize_row_q8(bad.data(), 32, q.data(), s.data()), Error);
  bad[3] = 1e30f;
  EXPECT_THROW(quantize_row_q4(bad.data(), 32, reinterpret_cast<uint8_t*>(q.data()), s.data()), Error);
}

}  // namespace
}  // namespace tandem
