#include "core/dtype.h"

#include <cmath>

namespace tandem {

namespace {
struct NamedDType {
  std::string_view name;
  DType dtype;
  size_t size;
};
constexpr NamedDType kDTypes[] = {
    {"F32", DType::F32, 4}, {"F16", DType::F16, 2}, {"BF16", DType::BF16, 2},
    {"I8", DType::I8, 1},   {"U8", DType::U8, 1},   {"I32", DType::I32, 4},
    {"I64", DType::I64, 8}, {"F64", DType::F64, 8}, {"BOOL", DType::BOOL, 1},
};
}  // namespace

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& d : kDTypes)
    if (d.name == name) return d.dtype;
  return std::nullopt;
}

std::string_view dtype_name(DType dtype) {
  for (const auto& d : kDTypes)
    if (d.dtype == dtype) return d.name;
  return "?";
}

size_t dtype_size(DType dtype) {
  for (const auto& d : kDTypes)
    if (d.dtype == dtype) return d.size;
  return 0;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  uint32_t u;
  if (exponent == 0) {
    if (mantissa == 0) {
      u = sign;
    } else {  // subnormal: value = mantissa * 2^-24, exact in float
      float f = std::ldexp(float(mantissa), -24);
      std::memcpy(&u, &f, sizeof u);
      u |= sign;
    }
  } else if (exponent == 31) {
    u = sign | 0x7f800000u | (mantissa << 13);
  } else {
    u = sign | ((exponent + 112) << 23) | (mantissa << 13);
  }
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;            // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;           // overflow (incl. inf) after rounding
  if (abs < 0x38800000u) {                                 // subnormal or zero in f16
    float a;
    std::memcpy(&a, &abs, sizeof a);
    return sign | uint16_t(std::nearbyint(a * 16777216.0f));  // units of 2^-24, ties to even
  }
  uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  return sign | uint16_t((rounded - 0x38000000u) >> 13);
}

// Words of 8 bytes at a time: a lane of (word & exponents) ^ exponents is zero where the exponent
// bits are all set, found with the has-a-zero-lane trick (whose false hits, from a borrow, need a
// zero lane below them), then the element within the 64-byte line that had one.
int64_t first_non_finite(DType dtype, const void* data, size_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  const size_t elem = dtype == DType::F32 ? 4 : 2;
  const uint64_t exponents = dtype == DType::F32   ? 0x7F8000007F800000ull
                             : dtype == DType::F16 ? 0x7C007C007C007C00ull
                                                   : 0x7F807F807F807F80ull;
  const uint64_t ones = elem == 4 ? 0x0000000100000001ull : 0x0001000100010001ull;
  const uint64_t highs = elem == 4 ? 0x8000000080000000ull : 0x8000800080008000ull;
  size_t i = 0;
  for (; i + 64 <= bytes; i += 64) {
    uint64_t hit = 0;
    for (size_t w = 0; w < 64; w += 8) {
      uint64_t word;
      std::memcpy(&word, p + i + w, 8);
      const uint64_t x = (word & exponents) ^ exponents;
      hit |= (x - ones) & ~x & highs;
    }
    if (hit) break;
  }
  const uint32_t exponent = elem == 4 ? uint32_t(exponents) : uint32_t(exponents & 0xFFFF);
  for (; i + elem <= bytes; i += elem) {
    uint32_t v = 0;
    std::memcpy(&v, p + i, elem);
    if ((v & exponent) == exponent) return int64_t(i / elem);
  }
  return -1;
}

}  // namespace tandem
