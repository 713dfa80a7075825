#include "model/rope.h"

#include <cmath>

#include "core/error.h"

namespace tandem {

std::vector<float> rope_inv_freq(const RopeConfig& rope, int head_dim) {
  if (head_dim % 2) fail("RoPE needs an even head dimension, got {}", head_dim);
  const int half = head_dim / 2;
  int rotated = half;
  if (rope.type == "proportional") {
    rotated = int(rope.partial_rotary_factor * head_dim) / 2;
  }
  std::vector<float> inv(size_t(half), 0.0f);
  const float base = float(rope.theta);
  for (int k = 0; k < rotated; ++k) {
    const float exponent = float(2 * k) / float(head_dim);
    inv[size_t(k)] = 1.0f / std::pow(base, exponent);
    if (rope.factor != 1.0) inv[size_t(k)] /= float(rope.factor);
  }
  return inv;
}

void apply_rope(float* x, int head_dim, const float* inv_freq, int position) {
  const int half = head_dim / 2;
  for (int k = 0; k < half; ++k) {
    const float angle = float(position) * inv_freq[k];
    const float c = std::cos(angle), s = std::sin(angle);
    const float a = x[k], b = x[k + half];
    x[k] = a * c - b * s;
    x[k + half] = b * c + a * s;
  }
}

}  // namespace tandem
