#pragma once
// Gemma 4 text-decoder configuration, read from a Hugging Face config.json (nested `gemma4` with a
// `text_config`, or flat `gemma4_text`), plus the per-layer table derived from it: attention kind,
// head geometry, which layer's K/V each layer reads, MLP width. Nothing about E4B is hard-coded.
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace tandem {

enum class AttentionKind { Sliding, Full };
const char* attention_kind_name(AttentionKind kind);

struct RopeConfig {
  std::string type;                    // "default" or "proportional"
  double theta = 10000.0;
  double partial_rotary_factor = 1.0;  // proportional only
  double factor = 1.0;                 // frequencies are divided by it
};

struct LayerConfig {
  AttentionKind kind = AttentionKind::Sliding;
  int head_dim = 0;
  int num_kv_heads = 0;
  bool shares_kv = false;  // reads the K/V of `kv_layer` instead of computing its own
  int kv_layer = 0;        // the layer whose cache holds this layer's K/V: itself or its donor
  int mlp_width = 0;
};

// Largest query-head group per KV head the attention kernels hold state for (Gemma 4 uses <= 8).
constexpr int kMaxQueryHeadsPerKvHead = 64;

struct Gemma4Config {
  std::string source;  // the file it came from, for messages
  int hidden_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int vocab_size = 0;
  int ple_vocab_size = 0;  // rows of the per-layer embedding table
  int ple_dim = 0;         // hidden_size_per_layer_input; 0 disables PLE
  int intermediate_size = 0;
  bool double_wide_mlp = false;
  int num_kv_shared_layers = 0;
  int sliding_window = 0;  // keys visible on sliding layers, the current one included
  int max_position_embeddings = 0;
  float rms_norm_eps = 1e-6f;
  float final_logit_softcap = 0.0f;  // 0: none
  RopeConfig rope_sliding, rope_full;
  int bos_token_id = 2;
  int pad_token_id = 0;
  std::vector<int> eos_token_ids;  // from config.json; see GenerationConfig for stop tokens
  std::vector<LayerConfig> layers;

  int first_kv_shared_layer() const { return num_layers - num_kv_shared_layers; }
  const RopeConfig& rope(AttentionKind kind) const {
    return kind == AttentionKind::Sliding ? rope_sliding : rope_full;
  }
  int max_head_dim() const;
  int max_mlp_width() const;

  static Gemma4Config from_json(const nlohmann::json& config, const std::string& source);
  static Gemma4Config load(const std::string& model_dir);  // reads model_dir/config.json
};

// Generation defaults and stop tokens: generation_config.json when present, else config.json.
struct GenerationConfig {
  std::vector<int> stop_token_ids;
  bool do_sample = false;
  float temperature = 1.0f;
  int top_k = 0;        // 0: off
  float top_p = 1.0f;
  float min_p = 0.0f;   // 0: off
  float repetition_penalty = 1.0f;

  static GenerationConfig load(const std::string& model_dir, const Gemma4Config& config);
};

}  // namespace tandem
