#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>
#include <tuple>

#include "core/error.h"
#include "io/checkpoint.h"

namespace tandem {

namespace {

using nlohmann::json;

// Reads typed fields of one JSON object, naming file and field in every error.
class Fields {
 public:
  Fields(const json& object, std::string source, std::string prefix)
      : object_(object), source_(std::move(source)), prefix_(std::move(prefix)) {}

  bool has(const char* key) const { return object_.contains(key) && !object_[key].is_null(); }
  const json& raw(const char* key) const { return object_[key]; }

  int required_int(const char* key, int min_value = 1) const {
    if (!has(key)) fail("{}: {}{} is missing", source_, prefix_, key);
    return checked_int(key, min_value);
  }
  int optional_int(const char* key, int fallback, int min_value = 0) const {
    return has(key) ? checked_int(key, min_value) : fallback;
  }
  double optional_number(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    if (!object_[key].is_number()) fail("{}: {}{} must be a number", source_, prefix_, key);
    return object_[key].get<double>();
  }
  bool optional_bool(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!object_[key].is_boolean()) fail("{}: {}{} must be true or false", source_, prefix_, key);
    return object_[key].get<bool>();
  }
  std::string optional_string(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    if (!object_[key].is_string()) fail("{}: {}{} must be a string", source_, prefix_, key);
    return object_[key].get<std::string>();
  }
  // An int or a list of ints (eos_token_id comes in both forms).
  std::vector<int> optional_int_list(const char* key) const {
    std::vector<int> out;
    if (!has(key)) return out;
    const json& v = object_[key];
    if (v.is_number_integer()) return {v.get<int>()};
    if (!v.is_array()) fail("{}: {}{} must be an integer or a list of integers", source_, prefix_, key);
    for (const auto& e : v) {
      if (!e.is_number_integer()) fail("{}: {}{} must contain integers", source_, prefix_, key);
      out.push_back(e.get<int>());
    }
    return out;
  }
  [[noreturn]] void invalid(const char* key, const std::string& why) const {
    fail("{}: {}{} {}", source_, prefix_, key, why);
  }

 private:
  int checked_int(const char* key, int min_value) const {
    const json& v = object_[key];
    if (!v.is_number_integer()) fail("{}: {}{} must be an integer", source_, prefix_, key);
    const long long value = v.get<long long>();
    if (value < min_value || value > (1ll << 30))
      fail("{}: {}{} = {} is out of range", source_, prefix_, key, value);
    return int(value);
  }
  const json& object_;
  std::string source_, prefix_;
};

RopeConfig read_rope(const Fields& f, const json& params, const std::string& source, const char* name,
                     RopeConfig fallback) {
  if (params.is_null() || !params.contains(name)) return fallback;
  Fields rope(params[name], source, std::string("rope_parameters.") + name + ".");
  RopeConfig r;
  r.type = rope.optional_string("rope_type", "default");
  r.theta = rope.optional_number("rope_theta", fallback.theta);
  r.partial_rotary_factor = rope.optional_number("partial_rotary_factor", 1.0);
  r.factor = rope.optional_number("factor", 1.0);
  if (r.factor <= 0) rope.invalid("factor", "must be positive");
  if (r.type != "default" && r.type != "proportional")
    rope.invalid("rope_type", "= \"" + r.type + "\" is not supported (default, proportional)");
  if (r.theta <= 0) rope.invalid("rope_theta", "must be positive");
  if (r.partial_rotary_factor <= 0 || r.partial_rotary_factor > 1)
    rope.invalid("partial_rotary_factor", "must be in (0, 1]");
  if (r.type == "default") r.partial_rotary_factor = 1.0;  // HF's default RoPE ignores it
  return r;
}

}  // namespace

const char* attention_kind_name(AttentionKind kind) {
  return kind == AttentionKind::Sliding ? "sliding" : "full";
}

int Gemma4Config::max_head_dim() const {
  int d = 0;
  for (const auto& l : layers) d = std::max(d, l.head_dim);
  return d;
}

int Gemma4Config::max_mlp_width() const {
  int w = 0;
  for (const auto& l : layers) w = std::max(w, l.mlp_width);
  return w;
}

Gemma4Config Gemma4Config::from_json(const json& root, const std::string& source) {
  if (!root.is_object()) fail("{}: not a JSON object", source);
  const bool nested = root.contains("text_config") && root["text_config"].is_object();
  const std::string model_type = root.value("model_type", std::string());
  if (!nested && root.contains("text_config")) fail("{}: text_config must be an object", source);
  if (!nested && model_type == "gemma4") fail("{}: text_config is missing", source);
  const json& text = nested ? root["text_config"] : root;
  const std::string prefix = nested ? "text_config." : "";
  Fields f(text, source, prefix);
  const std::string text_type = f.optional_string("model_type", nested ? "gemma4_text" : model_type);
  if (!text_type.empty() && text_type != "gemma4_text")
    fail("{}: model_type \"{}\" is not a Gemma 4 text model (gemma4 or gemma4_text)", source, text_type);

  Gemma4Config c;
  c.source = source;
  c.hidden_size = f.required_int("hidden_size");
  c.num_layers = f.required_int("num_hidden_layers");
  c.num_heads = f.required_int("num_attention_heads");
  const int num_kv_heads = f.required_int("num_key_value_heads");
  const int head_dim = f.required_int("head_dim");
  c.intermediate_size = f.required_int("intermediate_size");
  c.vocab_size = f.required_int("vocab_size");
  c.ple_dim = f.optional_int("hidden_size_per_layer_input", 256);
  c.ple_vocab_size = c.ple_dim ? f.optional_int("vocab_size_per_layer_input", c.vocab_size, 1) : 0;
  c.double_wide_mlp = f.optional_bool("use_double_wide_mlp", false);
  c.num_kv_shared_layers = f.optional_int("num_kv_shared_layers", 0);
  c.sliding_window = f.optional_int("sliding_window", 512, 1);
  c.max_position_embeddings = f.optional_int("max_position_embeddings", 131072, 1);
  c.rms_norm_eps = float(f.optional_number("rms_norm_eps", 1e-6));
  c.final_logit_softcap = float(f.optional_number("final_logit_softcapping", 0.0));
  if (!(c.rms_norm_eps > 0) || !std::isfinite(c.rms_norm_eps) || c.rms_norm_eps > 1)
    fail("{}: {}rms_norm_eps must be a small positive number, got {}", source, prefix, c.rms_norm_eps);
  if (!(c.final_logit_softcap >= 0) || !std::isfinite(c.final_logit_softcap))
    fail("{}: {}final_logit_softcapping must be 0 (off) or positive, got {}", source, prefix,
         c.final_logit_softcap);
  c.bos_token_id = f.optional_int("bos_token_id", 2);
  c.pad_token_id = f.optional_int("pad_token_id", 0);
  c.eos_token_ids = Fields(root, source, "").optional_int_list("eos_token_id");
  if (c.eos_token_ids.empty()) c.eos_token_ids = f.optional_int_list("eos_token_id");
  for (const auto& [name, id] : {std::pair<const char*, int>{"bos_token_id", c.bos_token_id}, {"pad_token_id", c.pad_token_id}})
    if (id < 0 || id >= c.vocab_size) f.invalid(name, fmt::format("{} is outside the vocabulary (0..{})", id, c.vocab_size - 1));
  for (int id : c.eos_token_ids)
    if (id < 0 || id >= c.vocab_size)
      fail("{}: eos_token_id {} is outside the vocabulary (0..{})", source, id, c.vocab_size - 1);

  if (c.num_heads % num_kv_heads != 0)
    f.invalid("num_attention_heads", "must be a multiple of num_key_value_heads");
  // The attention kernels keep one state per query head of a KV head's group on the stack.
  if (c.num_heads / num_kv_heads > kMaxQueryHeadsPerKvHead)
    f.invalid("num_attention_heads", fmt::format("more than {} query heads per KV head is not supported",
                                                 kMaxQueryHeadsPerKvHead));
  if (c.num_kv_shared_layers >= c.num_layers)
    f.invalid("num_kv_shared_layers", "must leave at least one layer that computes K/V");
  if (f.optional_string("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh")
    f.invalid("hidden_activation", "is not supported (only gelu_pytorch_tanh)");
  if (f.optional_bool("attention_bias", false)) f.invalid("attention_bias", "= true is not supported");
  if (f.optional_bool("attention_k_eq_v", false))
    f.invalid("attention_k_eq_v", "= true (26B/31B models) is not supported");
  if (f.optional_bool("enable_moe_block", false)) f.invalid("enable_moe_block", "= true is not supported");
  if (f.optional_string("use_bidirectional_attention", "") == "all")
    f.invalid("use_bidirectional_attention", "= \"all\" is not supported (text generation is causal)");
  if (!f.optional_bool("tie_word_embeddings", Fields(root, source, "").optional_bool("tie_word_embeddings", true)))
    f.invalid("tie_word_embeddings", "= false is not supported (Gemma 4 ties the LM head)");

  // layer_types: explicit list, or HF's default 5:1 pattern; HF forces the last layer to full.
  std::vector<AttentionKind> kinds(size_t(c.num_layers));
  if (f.has("layer_types")) {
    const json& types = f.raw("layer_types");
    if (!types.is_array() || int(types.size()) != c.num_layers)
      f.invalid("layer_types", "must be a list of num_hidden_layers entries");
    for (int i = 0; i < c.num_layers; ++i) {
      const std::string t = types[size_t(i)].is_string() ? types[size_t(i)].get<std::string>() : "";
      if (t == "sliding_attention") kinds[size_t(i)] = AttentionKind::Sliding;
      else if (t == "full_attention") kinds[size_t(i)] = AttentionKind::Full;
      else f.invalid("layer_types", "has an unknown entry " + types[size_t(i)].dump());
    }
  } else {
    for (int i = 0; i < c.num_layers; ++i)
      kinds[size_t(i)] = (i + 1) % 6 ? AttentionKind::Sliding : AttentionKind::Full;
  }
  kinds.back() = AttentionKind::Full;

  const json rope_params = f.has("rope_parameters") ? f.raw("rope_parameters") : json();
  c.rope_sliding = read_rope(f, rope_params, source, "sliding_attention", {"default", 10000.0, 1.0});
  c.rope_full = read_rope(f, rope_params, source, "full_attention", {"proportional", 1e6, 0.25});

  // Full-attention layers take their head geometry from global_head_dim (older configs) or from
  // per_layer_config overrides keyed by layer index (newer configs).
  const int global_head_dim = f.optional_int("global_head_dim", 512, 1);
  const json per_layer = f.has("per_layer_config") ? f.raw("per_layer_config") : json();
  if (!per_layer.is_null() && !per_layer.is_object()) f.invalid("per_layer_config", "must be an object");

  // Keys are layer indices, zero-padded when saved ("05"); values override head_dim / num_key_value_heads.
  std::map<int, std::pair<int, int>> overrides;  // layer -> (head_dim, num_kv_heads)
  if (per_layer.is_object()) {
    for (auto& [key, value] : per_layer.items()) {
      char* end = nullptr;
      const long layer = std::strtol(key.c_str(), &end, 10);
      if (key.empty() || *end || layer < 0 || layer >= c.num_layers)
        f.invalid("per_layer_config", "has key \"" + key + "\", which is not a layer index");
      Fields o(value, source, prefix + "per_layer_config." + key + ".");
      const int kv = o.optional_int("num_key_value_heads", num_kv_heads, 1);
      if (c.num_heads % kv) o.invalid("num_key_value_heads", "must divide num_attention_heads");
      overrides[int(layer)] = {o.optional_int("head_dim", head_dim, 1), kv};
    }
  }
  const int first_shared = c.first_kv_shared_layer();
  c.layers.resize(size_t(c.num_layers));
  for (int i = 0; i < c.num_layers; ++i) {
    LayerConfig& l = c.layers[size_t(i)];
    l.kind = kinds[size_t(i)];
    l.head_dim = l.kind == AttentionKind::Full ? global_head_dim : head_dim;
    l.num_kv_heads = num_kv_heads;
    if (!per_layer.is_null()) l.head_dim = head_dim;  // per_layer_config replaces global_head_dim
    if (auto it = overrides.find(i); it != overrides.end()) std::tie(l.head_dim, l.num_kv_heads) = it->second;
    l.mlp_width = c.intermediate_size * (c.double_wide_mlp && i >= first_shared ? 2 : 1);
    l.shares_kv = i >= first_shared && c.num_kv_shared_layers > 0;
    l.kv_layer = i;
    if (l.shares_kv) {  // the donor: the last layer of the same kind that computes its own K/V
      int donor = -1;
      for (int j = first_shared - 1; j >= 0 && donor < 0; --j)
        if (kinds[size_t(j)] == l.kind) donor = j;
      if (donor < 0)
        fail("{}: layer {} shares K/V but no earlier layer of kind {} computes any", source, i,
             attention_kind_name(l.kind));
      l.kv_layer = donor;
      const LayerConfig& d = c.layers[size_t(donor)];
      if (d.head_dim != l.head_dim || d.num_kv_heads != l.num_kv_heads)
        fail("{}: layer {} shares K/V with layer {} but their head geometry differs", source, i, donor);
    }
  }
  return c;
}

Gemma4Config Gemma4Config::load(const std::string& model_dir) {
  const std::string path = model_dir + "/config.json";
  std::error_code ec;
  if (!std::filesystem::exists(model_dir, ec)) fail("{}: no such folder", model_dir);
  if (!std::filesystem::is_directory(model_dir, ec)) fail("{}: not a folder (a model is a folder with config.json)", model_dir);
  if (!file_exists(path)) fail("{}: missing config.json", model_dir);
  return from_json(read_json_file(path), path);
}

GenerationConfig GenerationConfig::load(const std::string& model_dir, const Gemma4Config& config) {
  GenerationConfig g;
  const std::string path = model_dir + "/generation_config.json";
  auto file = read_json_file_if_present(path);
  if (file) {
    if (!file->is_object()) fail("{}: not a JSON object", path);
    Fields f(*file, path, "");
    g.stop_token_ids = f.optional_int_list("eos_token_id");
    g.do_sample = f.optional_bool("do_sample", false);
    g.temperature = float(f.optional_number("temperature", 1.0));
    g.top_k = f.optional_int("top_k", 0);
    g.top_p = float(f.optional_number("top_p", 1.0));
    g.min_p = float(f.optional_number("min_p", 0.0));
    g.repetition_penalty = float(f.optional_number("repetition_penalty", 1.0));
  }
  if (g.stop_token_ids.empty()) g.stop_token_ids = config.eos_token_ids;
  std::sort(g.stop_token_ids.begin(), g.stop_token_ids.end());
  g.stop_token_ids.erase(std::unique(g.stop_token_ids.begin(), g.stop_token_ids.end()), g.stop_token_ids.end());
  return g;
}

}  // namespace tandem
