#pragma once
// Writes random Gemma 4 checkpoints in exactly the published Hugging Face layout: nested
// config.json, generation_config.json, bf16 safetensors shards with an index, dummy vision/audio
// tensors and the unused k/v projections on KV-shared layers, as the real files have. Used for
// tests (tiny presets), the demo model and benchmarks (E2B/E4B shapes).
#include <cstdint>
#include <string>
#include <vector>

namespace tandem {

struct SynthOptions {
  std::string preset;          // see synth_preset_names()
  std::string out_dir;
  uint64_t seed = 1;
  std::string tokenizer_json;  // copied into out_dir when set
  bool show_progress = true;
};

std::vector<std::string> synth_preset_names();
void synthesize_checkpoint(const SynthOptions& options);

}  // namespace tandem
