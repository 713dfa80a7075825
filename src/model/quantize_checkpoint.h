#pragma once
// `tandem quantize`: rewrites a Gemma 4 checkpoint with its text model's linear weights in Q8 or Q4
// (see docs/quantization.md), in the published layout, so that --model loads it directly.
#include <string>

#include "kernels/weight.h"

namespace tandem {

struct QuantizeSummary {
  int quantized = 0;      // matrices written as NAME + NAME_scale
  int copied = 0;         // tensors copied unchanged (norms, scalars, the PLE table, ...)
  int dropped = 0;        // vision/audio tensors and the unused k/v of KV-shared layers
  uint64_t bytes_in = 0;  // tensor bytes read
  uint64_t bytes_out = 0; // tensor bytes written
};

// type is WeightFormat::Q8 or WeightFormat::Q4. Streams one tensor at a time (memory stays bounded
// by a chunk of rows per thread, whatever the model size) and quantizes rows on all cores.
QuantizeSummary quantize_checkpoint(const std::string& in_dir, const std::string& out_dir, WeightFormat type,
                                    bool show_progress);

}  // namespace tandem
