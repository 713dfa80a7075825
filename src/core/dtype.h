#pragma once
// Element types found in checkpoints, and the exact conversions between them and float.
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace tandem {

enum class DType { F32, F16, BF16, I8, U8, I32, I64, F64, BOOL };

std::optional<DType> dtype_from_name(std::string_view name);  // safetensors spelling, e.g. "BF16"
std::string_view dtype_name(DType dtype);
size_t dtype_size(DType dtype);

inline float bf16_to_f32(uint16_t bits) {
  uint32_t u = uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Round to nearest even, as PyTorch and NumPy do; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

float f16_to_f32(uint16_t bits);
uint16_t f32_to_f16(float f);

// The index of the first Inf or NaN among the F32, F16 or BF16 elements of `bytes` bytes at `data`
// (exponent bits all ones), or -1: a scan at memory speed, for refusing corrupt weights at load.
int64_t first_non_finite(DType dtype, const void* data, size_t bytes);

}  // namespace tandem
