#include "model/weights.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <set>

#include "core/dtype.h"
#include "core/error.h"

namespace tandem {

namespace {

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

class Binder {
 public:
  Binder(const CheckpointFiles& files, const Gemma4Config& config, std::string prefix)
      : files_(files), config_(config), prefix_(std::move(prefix)) {}

  const TensorInfo& tensor(const std::string& name, const std::vector<int64_t>& expected) const {
    const TensorInfo* t = files_.find(prefix_ + name);
    if (!t) fail("{}: missing tensor '{}'", files_.dir(), prefix_ + name);
    used_.insert(t->name);
    if (t->shape != expected)
      fail("{}: tensor '{}' has shape {}, but {} implies {}", t->file, t->name, t->shape_string(),
           config_.source, shape_string(expected));
    return *t;
  }

  // A [rows, cols] matrix: plain float tensors, or int8/4-bit ones with a `_scale` companion.
  WeightMatrix matrix(const std::string& name, int64_t rows, int64_t cols) const {
    const TensorInfo* t = files_.find(prefix_ + name);
    if (!t) fail("{}: missing tensor '{}'", files_.dir(), prefix_ + name);
    WeightMatrix m;
    m.rows = rows;
    m.cols = cols;
    m.data = t->data;
    switch (t->dtype) {
      case DType::F32: m.format = WeightFormat::F32; break;
      case DType::F16: m.format = WeightFormat::F16; break;
      case DType::BF16: m.format = WeightFormat::BF16; break;
      case DType::I8: m.format = WeightFormat::Q8; break;
      case DType::U8: m.format = WeightFormat::Q4; break;
      default:
        fail("{}: tensor '{}' has dtype {}, expected BF16, F16, F32 or a quantized pair", t->file, t->name,
             dtype_name(t->dtype));
    }
    m.row_stride = row_bytes(m.format, cols);
    tensor(name, {rows, m.row_stride / int64_t(dtype_size(t->dtype))});
    if (is_quantized(m.format)) {
      if (cols % kQuantBlock)
        fail("{}: tensor '{}' is quantized but has {} columns, not a multiple of {}", t->file, t->name, cols,
             kQuantBlock);
      const TensorInfo& s = tensor(name + "_scale", {rows, cols / kQuantBlock});
      if (s.dtype != DType::F16)
        fail("{}: tensor '{}' must be F16, not {}", s.file, s.name, dtype_name(s.dtype));
      m.scales = s.data;
      m.scale_stride = scale_row_bytes(m.format, cols);
      refuse_non_finite_scales(s);
    }
    return m;
  }

  // This rank's columns [first, first + count) of a row-parallel matrix (o, down).
  WeightMatrix column_shard(const std::string& name, int64_t rows, int64_t cols, int64_t first, int64_t count) const {
    const WeightMatrix m = matrix(name, rows, cols);
    if (is_quantized(m.format) && (first % kQuantBlock || (count % kQuantBlock && first + count != cols))) {
      const TensorInfo* t = files_.find(prefix_ + name);
      fail("{}: tensor '{}' is quantized in blocks of {} columns, but this rank's share of its {} columns is "
           "[{}, {}), which splits a block: run fewer ranks, or from the bf16 checkpoint",
           t->file, t->name, kQuantBlock, cols, first, first + count);
    }
    return m.slice_cols(first, count);
  }

  NormWeight vector(const std::string& name, int64_t n) const {
    const TensorInfo& t = tensor(name, {n});
    NormWeight w(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      w[size_t(i)] = element(t, i);
      if (!std::isfinite(w[size_t(i)]))
        fail("{}: tensor '{}' holds a non-finite value ({}) at index {}", t.file, t.name, w[size_t(i)], i);
    }
    return w;
  }

  // A NaN or Inf f16 scale (exponent bits all set) makes its whole block garbage, which the integer
  // kernels would carry into plausible-looking logits. Scales are 1/16 (Q8) to 1/8 (Q4) of the codes,
  // so reading them all costs little next to the load.
  static void refuse_non_finite_scales(const TensorInfo& s) {
    // Four scales a word: a lane's exponent bits plus 0x0400 reach bit 15 only when all are set.
    constexpr uint64_t kExponents = 0x7c007c007c007c00ull, kOne = 0x0400040004000400ull, kTop = 0x8000800080008000ull;
    const size_t count = s.nbytes / 2, words = count / 4;
    size_t first_bad = count;
    for (size_t i = 0; i < words && first_bad == count; ++i) {
      uint64_t w;
      std::memcpy(&w, s.data + 8 * i, 8);
      if (((w & kExponents) + kOne) & kTop) first_bad = 4 * i;
    }
    for (size_t i = first_bad == count ? 4 * words : first_bad; i < count; ++i) {
      uint16_t h;
      std::memcpy(&h, s.data + 2 * i, 2);
      if ((h & 0x7c00) == 0x7c00)
        fail("{}: tensor '{}' holds a non-finite scale (f16 0x{:04x}) at row {}, block {}", s.file, s.name, h,
             i / size_t(s.shape[1]), i % size_t(s.shape[1]));
    }
  }

  // Text-model tensors the config leaves no place for: a layer past num_hidden_layers, PLE tensors
  // with hidden_size_per_layer_input 0, an unknown weight in a layer. Ignoring them would run another
  // model than the checkpoint holds, so they are refused. KV-shared layers' k/v (never read) may stay.
  void refuse_unused_text_tensors() const {
    for (const auto& file : files_.files())
      for (const TensorInfo& t : file->tensors()) {
        if (used_.count(t.name) || !t.name.starts_with(prefix_)) continue;
        const std::string rest = t.name.substr(prefix_.size());
        if (rest.starts_with("embed_tokens_per_layer.") || rest.starts_with("per_layer_model_projection.") ||
            rest.starts_with("per_layer_projection_norm."))
          fail("{}: tensor '{}' is a per-layer-input (PLE) weight, but {} sets hidden_size_per_layer_input to 0",
               t.file, t.name, config_.source);
        if (!rest.starts_with("layers.")) continue;  // outside the decoder layers: not the text model's
        const size_t dot = rest.find('.', 7);
        const int64_t layer = std::strtoll(rest.substr(7, dot - 7).c_str(), nullptr, 10);
        if (layer >= config_.num_layers)
          fail("{}: tensor '{}' is for layer {}, but {} has {} layers", t.file, t.name, layer, config_.source,
               config_.num_layers);
        const std::string what = dot == std::string::npos ? rest : rest.substr(dot + 1);
        const bool shared_kv = what.starts_with("self_attn.k_proj.") || what.starts_with("self_attn.v_proj.") ||
                               what.starts_with("self_attn.k_norm.");
        if (shared_kv && config_.layers[size_t(layer)].shares_kv) continue;
        fail("{}: tensor '{}' is not a weight of the Gemma 4 layer {} describes; refusing it rather than "
             "running without it",
             t.file, t.name, config_.source);
      }
  }

  static float element(const TensorInfo& t, int64_t i) {
    uint16_t h;
    switch (t.dtype) {
      case DType::F32: {
        float f;
        std::memcpy(&f, t.data + 4 * i, 4);
        return f;
      }
      case DType::BF16: std::memcpy(&h, t.data + 2 * i, 2); return bf16_to_f32(h);
      case DType::F16: std::memcpy(&h, t.data + 2 * i, 2); return f16_to_f32(h);
      default: fail("{}: tensor '{}' has dtype {}, expected BF16, F16 or F32", t.file, t.name, dtype_name(t.dtype));
    }
  }

 private:
  const CheckpointFiles& files_;
  const Gemma4Config& config_;
  std::string prefix_;
  mutable std::set<std::string> used_;
};

}  // namespace

std::string text_weight_prefix(const CheckpointFiles& files) {
  for (const char* prefix : {"model.language_model.", "model."})
    if (files.find(std::string(prefix) + "embed_tokens.weight")) return prefix;
  fail("{}: no Gemma 4 text weights (neither model.language_model.embed_tokens.weight nor "
       "model.embed_tokens.weight)",
       files.dir());
}

ModelWeights ModelWeights::bind(const CheckpointFiles& files, const Gemma4Config& c, const ShardPlan& plan) {
  plan.validate(c);
  ModelWeights w;
  w.prefix = text_weight_prefix(files);
  Binder b(files, c, w.prefix);
  const int64_t H = c.hidden_size, L = c.num_layers, P = c.ple_dim;

  w.embed = b.matrix("embed_tokens.weight", c.vocab_size, H);
  auto [vocab_first, vocab_count] = plan.vocab_range(c.vocab_size);
  w.lm_head = w.embed.slice_rows(vocab_first, vocab_count);
  w.lm_head_first = vocab_first;
  w.final_norm = b.vector("norm.weight", H);
  if (P > 0) {
    w.ple_table = b.matrix("embed_tokens_per_layer.weight", c.ple_vocab_size, L * P);
    w.ple_table_file = files.mapping_of(w.ple_table.data);
    w.ple_model_projection = b.matrix("per_layer_model_projection.weight", L * P, H);
    w.ple_projection_norm = b.vector("per_layer_projection_norm.weight", P);
  }

  w.layers.resize(size_t(L));
  for (int i = 0; i < L; ++i) {
    const LayerConfig& lc = c.layers[size_t(i)];
    LayerWeights& lw = w.layers[size_t(i)];
    const std::string p = "layers." + std::to_string(i) + ".";
    const int64_t D = lc.head_dim, F = lc.mlp_width;
    lw.heads = plan.heads(lc, c.num_heads);
    const HeadShard& hs = lw.heads;

    lw.input_norm = b.vector(p + "input_layernorm.weight", H);
    lw.post_attention_norm = b.vector(p + "post_attention_layernorm.weight", H);
    lw.pre_feedforward_norm = b.vector(p + "pre_feedforward_layernorm.weight", H);
    lw.post_feedforward_norm = b.vector(p + "post_feedforward_layernorm.weight", H);
    lw.q_proj = b.matrix(p + "self_attn.q_proj.weight", c.num_heads * D, H).slice_rows(hs.q_first * D, hs.q_count * D);
    lw.q_norm = b.vector(p + "self_attn.q_norm.weight", D);
    if (!lc.shares_kv) {
      lw.k_proj = b.matrix(p + "self_attn.k_proj.weight", lc.num_kv_heads * D, H)
                      .slice_rows(hs.kv_first * D, hs.kv_count * D);
      lw.v_proj = b.matrix(p + "self_attn.v_proj.weight", lc.num_kv_heads * D, H)
                      .slice_rows(hs.kv_first * D, hs.kv_count * D);
      lw.k_norm = b.vector(p + "self_attn.k_norm.weight", D);
    }
    lw.o_proj = b.column_shard(p + "self_attn.o_proj.weight", H, c.num_heads * D, hs.q_first * D, hs.q_count * D);
    auto [f_first, f_count] = plan.mlp_range(F);
    lw.gate_proj = b.matrix(p + "mlp.gate_proj.weight", F, H).slice_rows(f_first, f_count);
    lw.up_proj = b.matrix(p + "mlp.up_proj.weight", F, H).slice_rows(f_first, f_count);
    lw.down_proj = b.column_shard(p + "mlp.down_proj.weight", H, F, f_first, f_count);
    if (P > 0) {
      lw.ple_gate = b.matrix(p + "per_layer_input_gate.weight", P, H);
      lw.ple_projection = b.matrix(p + "per_layer_projection.weight", H, P);
      lw.post_ple_norm = b.vector(p + "post_per_layer_input_norm.weight", H);
    }
    lw.layer_scalar = b.vector(p + "layer_scalar", 1)[0];
  }
  b.refuse_unused_text_tensors();
  return w;
}

std::vector<ByteRange> ModelWeights::streamed_ranges() const {
  std::vector<ByteRange> ranges;
  lm_head.append_ranges(ranges);
  ple_model_projection.append_ranges(ranges);
  for (const auto& l : layers)
    for (const WeightMatrix* m : {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.gate_proj, &l.up_proj,
                                  &l.down_proj, &l.ple_gate, &l.ple_projection})
      m->append_ranges(ranges);
  return ranges;
}

size_t ModelWeights::streamed_bytes_per_token() const {
  size_t n = lm_head.streamed_bytes() + ple_model_projection.streamed_bytes();
  if (!ple_table.empty()) n += ple_table.streamed_bytes() / size_t(ple_table.rows);
  for (const auto& l : layers)
    for (const WeightMatrix* m : {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.gate_proj, &l.up_proj,
                                  &l.down_proj, &l.ple_gate, &l.ple_projection})
      n += m->streamed_bytes();
  return n;
}

}  // namespace tandem
