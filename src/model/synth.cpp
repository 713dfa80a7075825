#include "model/synth.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/dtype.h"
#include "core/error.h"
#include "core/progress.h"
#include "core/thread_pool.h"
#include "io/safetensors.h"

namespace tandem {

namespace {

struct Preset {
  const char* name;
  int hidden, layers, period, heads, kv_heads, head_dim, global_head_dim, intermediate;
  bool double_wide;
  int kv_shared, window, vocab, ple_dim;
  int shards;
};

// tiny: the shapes of ../shared/golden (tiny-e4b). tiny-e2b: E2B-like (one KV head, double-wide
// MLP, 4+1 pattern, another window). tiny-unshared: every layer writes its own cache (no KV
// sharing, as in Gemma 4 configurations without it). tiny-odd: sizes off the kernels' multiples
// (hidden 80, head sizes 40 and 72, MLP 200, vocabulary 500, a 2+1 pattern, window 7), so their
// tails and fallbacks run: rows too short for row groups, quantization blocks cut short, heads that
// are no multiple of 16. demo: the real vocabulary with small layers, for the server.
constexpr Preset kPresets[] = {
    {"tiny", 128, 12, 6, 4, 2, 32, 64, 512, false, 4, 16, 512, 16, 2},
    {"tiny-e2b", 96, 10, 5, 4, 1, 32, 64, 384, true, 4, 8, 512, 16, 2},
    {"tiny-unshared", 128, 8, 4, 4, 2, 32, 64, 512, false, 0, 16, 512, 16, 2},
    {"tiny-odd", 80, 7, 3, 4, 1, 40, 72, 200, true, 3, 7, 500, 8, 2},
    {"demo", 256, 6, 3, 4, 2, 64, 128, 1024, false, 2, 64, 262144, 32, 2},
    {"e2b", 1536, 35, 5, 8, 1, 256, 512, 6144, true, 20, 512, 262144, 256, 3},
    {"e4b", 2560, 42, 6, 8, 2, 256, 512, 10240, false, 18, 512, 262144, 256, 4},
};

const Preset& find_preset(const std::string& name) {
  for (const Preset& p : kPresets)
    if (name == p.name) return p;
  std::string known;
  for (const Preset& p : kPresets) known += std::string(known.empty() ? "" : ", ") + p.name;
  fail("unknown preset '{}' (known: {})", name, known);
}

const std::string kText = "model.language_model.";

bool is_full(const Preset& p, int layer) { return layer == p.layers - 1 || layer % p.period == p.period - 1; }

nlohmann::ordered_json text_config(const Preset& p) {
  std::vector<std::string> types;
  for (int i = 0; i < p.layers; ++i) types.push_back(is_full(p, i) ? "full_attention" : "sliding_attention");
  return {
      {"model_type", "gemma4_text"},
      {"vocab_size", p.vocab},
      {"vocab_size_per_layer_input", p.vocab},
      {"hidden_size", p.hidden},
      {"hidden_size_per_layer_input", p.ple_dim},
      {"intermediate_size", p.intermediate},
      {"use_double_wide_mlp", p.double_wide},
      {"num_hidden_layers", p.layers},
      {"num_attention_heads", p.heads},
      {"num_key_value_heads", p.kv_heads},
      {"num_global_key_value_heads", nullptr},
      {"head_dim", p.head_dim},
      {"global_head_dim", p.global_head_dim},
      {"num_kv_shared_layers", p.kv_shared},
      {"layer_types", types},
      {"sliding_window", p.window},
      {"rope_parameters",
       {{"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 10000.0}}},
        {"full_attention", {{"rope_type", "proportional"}, {"partial_rotary_factor", 0.25}, {"rope_theta", 1000000.0}}}}},
      {"max_position_embeddings", 131072},
      {"rms_norm_eps", 1e-06},
      {"hidden_activation", "gelu_pytorch_tanh"},
      {"final_logit_softcapping", 30.0},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"attention_k_eq_v", false},
      {"enable_moe_block", false},
      {"use_bidirectional_attention", nullptr},
      {"use_cache", true},
      {"initializer_range", 0.02},
      {"tie_word_embeddings", true},
      {"pad_token_id", 0},
      {"bos_token_id", 2},
      {"eos_token_id", 1},
      {"dtype", "bfloat16"},
  };
}

nlohmann::ordered_json full_config(const Preset& p) {
  return {
      {"architectures", {"Gemma4ForConditionalGeneration"}},
      {"model_type", "gemma4"},
      {"text_config", text_config(p)},
      {"vision_config", {{"model_type", "gemma4_vision"}, {"hidden_size", 16}, {"num_hidden_layers", 1}}},
      {"audio_config", {{"model_type", "gemma4_audio"}, {"hidden_size", 16}, {"num_hidden_layers", 1}}},
      {"boi_token_id", 255999}, {"eoi_token_id", 258882}, {"image_token_id", 258880},
      {"video_token_id", 258884}, {"boa_token_id", 256000}, {"eoa_token_id", 258883},
      {"eoa_token_index", 258883}, {"audio_token_id", 258881},
      {"eos_token_id", {1, 106}}, {"pad_token_id", 0}, {"bos_token_id", 2},
      {"tie_word_embeddings", true}, {"dtype", "bfloat16"},
  };
}

// How a tensor's values are drawn: uniform in [lo, hi).
struct Tensor {
  std::string name;
  std::vector<int64_t> shape;
  float lo, hi;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

std::vector<Tensor> tensor_list(const Preset& p) {
  std::vector<Tensor> out;
  auto linear = [&](const std::string& name, int64_t rows, int64_t cols) {
    const float a = std::sqrt(3.0f / float(cols));  // std 1/sqrt(fan_in)
    out.push_back({name, {rows, cols}, -a, a});
  };
  auto norm = [&](const std::string& name, int64_t n, float lo = 0.8f, float hi = 1.2f) {
    out.push_back({name, {n}, lo, hi});
  };
  const int64_t H = p.hidden, L = p.layers, P = p.ple_dim;
  linear(kText + "embed_tokens.weight", p.vocab, H);
  {
    const float a = std::sqrt(3.0f / float(P));
    out.push_back({kText + "embed_tokens_per_layer.weight", {p.vocab, L * P}, -a, a});
  }
  linear(kText + "per_layer_model_projection.weight", L * P, H);
  norm(kText + "per_layer_projection_norm.weight", P);
  norm(kText + "norm.weight", H, 2.0f, 4.0f);
  const int first_shared = p.layers - p.kv_shared;
  for (int i = 0; i < p.layers; ++i) {
    const int64_t D = is_full(p, i) ? p.global_head_dim : p.head_dim;
    const int64_t F = int64_t(p.intermediate) * (p.double_wide && i >= first_shared ? 2 : 1);
    const std::string b = kText + "layers." + std::to_string(i) + ".";
    norm(b + "input_layernorm.weight", H);
    linear(b + "self_attn.q_proj.weight", p.heads * D, H);
    // Gemma 4 does not scale q.k by 1/sqrt(D); small q/k norm weights keep the attention logits
    // near unit spread at any head size (std ~ 0.4^2 * sqrt(32) for D = 32), as trained weights
    // do. Larger logits make a random model chaotic: float32 rounding then decides greedy ties.
    const float qk = std::sqrt(32.0f / float(D));
    norm(b + "self_attn.q_norm.weight", D, 0.3f * qk, 0.5f * qk);
    linear(b + "self_attn.k_proj.weight", p.kv_heads * D, H);  // present but unused on shared layers
    linear(b + "self_attn.v_proj.weight", p.kv_heads * D, H);
    norm(b + "self_attn.k_norm.weight", D, 0.3f * qk, 0.5f * qk);
    linear(b + "self_attn.o_proj.weight", H, p.heads * D);
    norm(b + "post_attention_layernorm.weight", H);
    norm(b + "pre_feedforward_layernorm.weight", H);
    linear(b + "mlp.gate_proj.weight", F, H);
    linear(b + "mlp.up_proj.weight", F, H);
    linear(b + "mlp.down_proj.weight", H, F);
    norm(b + "post_feedforward_layernorm.weight", H);
    linear(b + "per_layer_input_gate.weight", P, H);
    linear(b + "per_layer_projection.weight", H, P);
    norm(b + "post_per_layer_input_norm.weight", H);
    out.push_back({b + "layer_scalar", {1}, 0.1f, 1.0f});
  }
  linear("model.vision_tower.patch_embedder.input_proj.weight", 16, 48);
  linear("model.vision_tower.encoder.layers.0.self_attn.q_proj.linear.weight", 16, 16);
  linear("model.embed_vision.embedding_projection.weight", H, 16);
  linear("model.embed_audio.embedding_projection.weight", H, 16);
  return out;
}

// Counter-based random numbers (splitmix64 of seed, tensor and index), so any slice of any
// tensor can be generated independently and in parallel, always with the same values.
inline uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t name_hash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

void fill_bf16(const Tensor& t, uint64_t key, int64_t first, int64_t count, uint16_t* out) {
  const double scale = 1.0 / 9007199254740992.0;  // 2^-53
  for (int64_t i = 0; i < count; ++i) {
    const double u = double(mix(key + uint64_t(first + i)) >> 11) * scale;
    out[i] = f32_to_bf16(float(t.lo + (t.hi - t.lo) * u));
  }
}

void write_json(const std::string& path, const nlohmann::ordered_json& j) {
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  if (!out) fail("{}: cannot write", path);
}

}  // namespace

std::vector<std::string> synth_preset_names() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.push_back(p.name);
  return names;
}

void synthesize_checkpoint(const SynthOptions& options) {
  const Preset& p = find_preset(options.preset);
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(options.out_dir, ec);
  if (ec) fail("{}: cannot create folder: {}", options.out_dir, ec.message());

  std::vector<Tensor> tensors = tensor_list(p);
  uint64_t total_bytes = 0;
  for (const Tensor& t : tensors) total_bytes += uint64_t(t.numel()) * 2;

  // Balance shards by size in list order, then sort each shard by name as save_pretrained does.
  std::vector<std::vector<const Tensor*>> shards(size_t(p.shards));
  uint64_t running = 0;
  for (const Tensor& t : tensors) {
    size_t s = std::min(shards.size() - 1, size_t(double(running) / double(total_bytes) * double(p.shards)));
    shards[s].push_back(&t);
    running += uint64_t(t.numel()) * 2;
  }
  std::erase_if(shards, [](const auto& s) { return s.empty(); });

  ThreadPool pool(0);
  Progress progress("synth " + options.preset, options.show_progress ? total_bytes : 0);
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  std::map<std::string, std::string> sorted_map;
  constexpr int64_t kChunk = 8 << 20;  // values per write
  std::vector<uint16_t> buffer(static_cast<size_t>(kChunk));
  for (size_t s = 0; s < shards.size(); ++s) {
    auto& shard = shards[s];
    std::sort(shard.begin(), shard.end(), [](auto* a, auto* b) { return a->name < b->name; });
    const std::string file = fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards.size());
    std::vector<TensorSpec> specs;
    for (const Tensor* t : shard) {
      specs.push_back({t->name, DType::BF16, t->shape});
      sorted_map[t->name] = file;
    }
    SafetensorsWriter writer(options.out_dir + "/" + file, specs);
    for (const Tensor* t : shard) {
      const uint64_t key = mix(options.seed ^ name_hash(t->name)) << 20;
      for (int64_t first = 0; first < t->numel(); first += kChunk) {
        const int64_t count = std::min(kChunk, t->numel() - first);
        pool.parallel_for(count, [&](int64_t b, int64_t e) { fill_bf16(*t, key, first + b, e - b, buffer.data() + b); }, 4096);
        writer.write(buffer.data(), size_t(count) * 2);
        if (options.show_progress) progress.advance(uint64_t(count) * 2);
      }
    }
    writer.finish();
  }
  progress.finish();
  for (auto& [name, file] : sorted_map) weight_map[name] = file;

  write_json(options.out_dir + "/model.safetensors.index.json",
             {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}});
  write_json(options.out_dir + "/config.json", full_config(p));
  write_json(options.out_dir + "/generation_config.json",
             {{"bos_token_id", 2}, {"pad_token_id", 0}, {"eos_token_id", {1, 106, 50}}, {"do_sample", true},
              {"temperature", 1.0}, {"top_k", 64}, {"top_p", 0.95}});
  if (!options.tokenizer_json.empty()) {
    fs::copy_file(options.tokenizer_json, options.out_dir + "/tokenizer.json", fs::copy_options::overwrite_existing, ec);
    if (ec) fail("{}: cannot copy into {}: {}", options.tokenizer_json, options.out_dir, ec.message());
  }
}

}  // namespace tandem
