#pragma once
// Rotary position embedding frequencies, computed as Hugging Face does in float32.
// Layout is "rotate half": dimension k pairs with k + D/2 and both use angle position * f[k].
#include <vector>

#include "model/config.h"

namespace tandem {

// D/2 frequencies for a head of `head_dim`. "default": f[k] = theta^(-2k/D) for every k.
// "proportional" (Gemma 4 full layers): the same ladder with denominator D for the first
// int(partial_rotary_factor * D / 2) frequencies and 0 (no rotation) for the rest.
std::vector<float> rope_inv_freq(const RopeConfig& rope, int head_dim);

// Rotates one head vector of length head_dim in place at `position`.
void apply_rope(float* head, int head_dim, const float* inv_freq, int position);

}  // namespace tandem
