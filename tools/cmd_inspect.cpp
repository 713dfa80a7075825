// tandem inspect --model DIR: the config, the layer table and the tensors.
#include <fmt/format.h>

#include <set>

#include "cli_common.h"
#include "commands.h"
#include "model/checkpoint.h"
#include "model/rope.h"

namespace tandem::cli {

namespace {

void inspect(const std::string& model_arg) {
  const std::string dir = resolve_model_dir(model_arg);
  auto ckpt = Gemma4Checkpoint::open(dir);
  const Gemma4Config& c = ckpt->config;
  fmt::print("model: {}\n", dir);
  fmt::print("config: hidden {}, layers {}, heads {}, vocab {}, per-layer input {} (table rows {}), "
             "sliding window {}, KV-shared layers {} (from layer {}), rms eps {}, final softcap {}\n",
             c.hidden_size, c.num_layers, c.num_heads, c.vocab_size, c.ple_dim, c.ple_vocab_size,
             c.sliding_window, c.num_kv_shared_layers, c.first_kv_shared_layer(), c.rms_norm_eps,
             c.final_logit_softcap);
  for (AttentionKind kind : {AttentionKind::Sliding, AttentionKind::Full}) {
    const RopeConfig& r = c.rope(kind);
    fmt::print("rope {}: {} theta {} partial {}\n", attention_kind_name(kind), r.type, r.theta, r.partial_rotary_factor);
  }
  fmt::print("stop tokens: [{}]\n", fmt::join(ckpt->generation.stop_token_ids, ", "));
  fmt::print("weights: prefix '{}', {:.2f} GB streamed per token\n\n", ckpt->weights.prefix,
             ckpt->weights.streamed_bytes_per_token() / 1e9);

  fmt::print("{:>5}  {:<7}  {:>8}  {:>8}  {:>9}  {:>9}  {}\n", "layer", "type", "head_dim", "kv_heads", "kv_source",
             "mlp_width", "layer_scalar");
  for (int i = 0; i < c.num_layers; ++i) {
    const LayerConfig& l = c.layers[size_t(i)];
    fmt::print("{:>5}  {:<7}  {:>8}  {:>8}  {:>9}  {:>9}  {:.4f}\n", i, attention_kind_name(l.kind), l.head_dim,
               l.num_kv_heads, l.shares_kv ? fmt::format("layer {}", l.kv_layer) : std::string("own"), l.mlp_width,
               ckpt->weights.layers[size_t(i)].layer_scalar);
  }

  // Which tensors the model uses; the rest (vision, audio, unused shared-layer k/v) are skipped.
  std::set<std::string> skipped_prefixes;
  fmt::print("\n{:<70}  {:<5}  {:<16}  {}\n", "tensor", "dtype", "shape", "file");
  for (const TensorInfo* t : ckpt->files.tensors()) {
    const bool text = t->name.rfind(ckpt->weights.prefix, 0) == 0;
    std::string note;
    if (!text) {
      note = "  (skipped: not a text weight)";
    } else {
      const std::string rest = t->name.substr(ckpt->weights.prefix.size());
      int layer = -1;
      char what[128] = {0};
      if (std::sscanf(rest.c_str(), "layers.%d.self_attn.%127s", &layer, what) == 2 && layer >= 0 &&
          layer < c.num_layers && c.layers[size_t(layer)].shares_kv &&
          (std::string(what).rfind("k_", 0) == 0 || std::string(what).rfind("v_", 0) == 0))
        note = "  (skipped: KV-shared layer)";
    }
    const auto slash = t->file.find_last_of('/');
    fmt::print("{:<70}  {:<5}  {:<16}  {}{}\n", t->name, dtype_name(t->dtype), t->shape_string(),
               t->file.substr(slash == std::string::npos ? 0 : slash + 1), note);
  }
}

}  // namespace

void register_inspect(CLI::App& app) {
  auto* cmd = app.add_subcommand("inspect", "Show a checkpoint's config, layer table and tensors");
  auto model = std::make_shared<std::string>();
  cmd->add_option("--model", *model, "Model folder (Hugging Face layout); default: the demo model")
      ->check(kNonEmptyPath);
  cmd->callback([model] { inspect(*model); });
}

}  // namespace tandem::cli
