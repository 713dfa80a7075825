#include "model/reference.h"

#include <cmath>

#include "core/error.h"
#include "model/gathered_rows.h"
#include "model/rope.h"

namespace tandem {

namespace {

using Rows = std::vector<std::vector<float>>;

// x * (mean(x^2) + eps)^-0.5 * w, with no "+1" on the weight; w == nullptr: no weight (v_norm).
void rms_norm(float* out, const float* x, const float* w, int n, float eps) {
  double sum_squares = 0.0;
  for (int i = 0; i < n; ++i) sum_squares += double(x[i]) * double(x[i]);
  const float scale = std::pow(float(sum_squares / n) + eps, -0.5f);
  for (int i = 0; i < n; ++i) out[i] = x[i] * scale * (w ? w[i] : 1.0f);
}

float gelu_tanh(float x) {
  const float k = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * x * (1.0f + std::tanh(k * (x + 0.044715f * x * x * x)));
}

}  // namespace

ReferenceModel::ReferenceModel(const Gemma4Config& config, const ModelWeights& weights, ThreadPool* pool)
    : config_(config), weights_(weights), pool_(pool) {
  for (const LayerConfig& l : config.layers) {
    inv_freq_.push_back(rope_inv_freq(config.rope(l.kind), l.head_dim));
    if (weights_.layers[inv_freq_.size() - 1].heads.q_count != config.num_heads)
      fail("the reference model needs unsharded weights");
  }
  cache_.resize(config.layers.size());
}

void ReferenceModel::reset() {
  for (Cache& c : cache_) c = Cache{};
  position_ = 0;
}

// out[r] = sum_c W[r, c] * x[c], each row widened to float32 and summed in double.
void ReferenceModel::matvec(const WeightMatrix& w, const float* x, float* out) const {
  auto rows = [&](int64_t begin, int64_t end) {
    std::vector<float> row(size_t(w.cols));
    for (int64_t r = begin; r < end; ++r) {
      w.row_to_float(r, row.data());
      double sum = 0.0;
      for (int64_t c = 0; c < w.cols; ++c) sum += double(row[size_t(c)]) * double(x[c]);
      out[r] = float(sum);
    }
  };
  if (pool_) pool_->parallel_for(w.rows, rows, 16);
  else rows(0, w.rows);
}

std::vector<std::vector<float>> ReferenceModel::forward(std::span<const int32_t> tokens, bool all_positions) {
  if (tokens.empty()) return {};
  for (int32_t t : tokens)
    if (t < 0 || t >= config_.vocab_size) fail("token id {} is outside the vocabulary (0..{})", t, config_.vocab_size - 1);

  Rows h, per_layer_inputs;
  embed(tokens, h, per_layer_inputs);
  chunk_start_ = position_;
  for (int i = 0; i < config_.num_layers; ++i) {
    attention_block(i, h);
    mlp_block(i, h);
    if (config_.ple_dim > 0) per_layer_input_block(i, h, per_layer_inputs);
    for (auto& x : h)
      for (float& v : x) v *= weights_.layers[size_t(i)].layer_scalar;
  }
  position_ += int(tokens.size());

  Rows out;
  for (size_t s = all_positions ? 0 : h.size() - 1; s < h.size(); ++s) out.push_back(logits(h[s]));
  return out;
}

// x0 = E[t] * sqrt(H); the per-layer inputs combine a token-identity row of the PLE table with a
// projection of x0 (see docs/model.md).
void ReferenceModel::embed(std::span<const int32_t> tokens, Rows& x, Rows& per_layer_inputs) const {
  const int H = config_.hidden_size, L = config_.num_layers, P = config_.ple_dim;
  const float embed_scale = float(std::sqrt(double(H)));  // float32(H ** 0.5), as HF
  x.assign(tokens.size(), std::vector<float>(size_t(H)));
  per_layer_inputs.assign(tokens.size(), std::vector<float>(size_t(L) * P));
  for (size_t s = 0; s < tokens.size(); ++s) {
    weights_.embed.row_to_float(tokens[s], x[s].data());
    for (float& v : x[s]) v *= embed_scale;
    if (P == 0) continue;

    std::vector<float> projected(size_t(L) * P), token_rows(size_t(L) * P);
    matvec(weights_.ple_model_projection, x[s].data(), projected.data());
    const float projection_scale = float(1.0 / std::sqrt(double(H)));
    const float ple_scale = float(std::sqrt(double(P)));
    if (tokens[s] >= config_.ple_vocab_size) fail("token id {} is outside the per-layer embedding table", tokens[s]);
    GatheredRows table_row(weights_.ple_table, weights_.ple_table_file);
    const GatheredRows::View row = table_row.gather(&tokens[s], 1);
    row.matrix->row_to_float(row.ids[0], token_rows.data());
    for (int i = 0; i < L; ++i) {
      float* context = projected.data() + size_t(i) * P;
      for (int d = 0; d < P; ++d) context[d] *= projection_scale;
      rms_norm(context, context, weights_.ple_projection_norm.data(), P, config_.rms_norm_eps);
      for (int d = 0; d < P; ++d) {
        const float token_part = token_rows[size_t(i) * P + d] * ple_scale;
        per_layer_inputs[s][size_t(i) * P + d] = (context[d] + token_part) * float(M_SQRT1_2);
      }
    }
  }
}

// h += post_norm(o_proj(attention(input_norm(h)))). Layers that own K/V append this chunk's keys
// and values to their cache first; KV-shared layers read their donor's cache, which by then holds
// the whole chunk too.
void ReferenceModel::attention_block(int layer, Rows& h) {
  const LayerConfig& lc = config_.layers[size_t(layer)];
  const LayerWeights& lw = weights_.layers[size_t(layer)];
  const int H = config_.hidden_size, D = lc.head_dim, heads = config_.num_heads, kv_heads = lc.num_kv_heads;
  const int group = heads / kv_heads;
  const float eps = config_.rms_norm_eps;
  const float* inv_freq = inv_freq_[size_t(layer)].data();
  const size_t S = h.size();

  Rows normed(S, std::vector<float>(size_t(H))), queries(S, std::vector<float>(size_t(heads) * D));
  for (size_t s = 0; s < S; ++s) {
    const int position = chunk_start_ + int(s);
    rms_norm(normed[s].data(), h[s].data(), lw.input_norm.data(), H, eps);
    matvec(lw.q_proj, normed[s].data(), queries[s].data());
    for (int q = 0; q < heads; ++q) {
      float* head = queries[s].data() + size_t(q) * D;
      rms_norm(head, head, lw.q_norm.data(), D, eps);
      apply_rope(head, D, inv_freq, position);
    }
    if (lc.shares_kv) continue;
    std::vector<float> k(size_t(kv_heads) * D), v(size_t(kv_heads) * D);
    matvec(lw.k_proj, normed[s].data(), k.data());
    matvec(lw.v_proj, normed[s].data(), v.data());
    for (int g = 0; g < kv_heads; ++g) {
      rms_norm(&k[size_t(g) * D], &k[size_t(g) * D], lw.k_norm.data(), D, eps);
      apply_rope(&k[size_t(g) * D], D, inv_freq, position);
      rms_norm(&v[size_t(g) * D], &v[size_t(g) * D], nullptr, D, eps);
    }
    Cache& c = cache_[size_t(layer)];
    c.keys.insert(c.keys.end(), k.begin(), k.end());
    c.values.insert(c.values.end(), v.begin(), v.end());
  }

  const Cache& kv = cache_[size_t(lc.kv_layer)];
  const size_t row = size_t(kv_heads) * D;
  for (size_t s = 0; s < S; ++s) {
    const int position = chunk_start_ + int(s);
    // Sliding layers see exactly `sliding_window` keys, the current one included.
    const int first = lc.kind == AttentionKind::Sliding ? std::max(0, position - config_.sliding_window + 1) : 0;
    std::vector<float> attended(size_t(heads) * D, 0.0f);
    for (int q = 0; q < heads; ++q) {
      const float* query = queries[s].data() + size_t(q) * D;
      const int g = q / group;
      std::vector<double> scores;
      double max_score = -INFINITY;
      for (int j = first; j <= position; ++j) {
        const float* key = kv.keys.data() + size_t(j) * row + size_t(g) * D;
        double dot = 0.0;  // Gemma 4 does not scale by 1/sqrt(D): the q/k norms set the scale
        for (int d = 0; d < D; ++d) dot += double(query[d]) * double(key[d]);
        scores.push_back(dot);
        max_score = std::max(max_score, dot);
      }
      double total = 0.0;
      for (double& sc : scores) total += (sc = std::exp(sc - max_score));
      float* out = attended.data() + size_t(q) * D;
      for (int j = first; j <= position; ++j) {
        const float weight = float(scores[size_t(j - first)] / total);
        const float* value = kv.values.data() + size_t(j) * row + size_t(g) * D;
        for (int d = 0; d < D; ++d) out[d] += weight * value[d];
      }
    }
    std::vector<float> projected(static_cast<size_t>(H));
    matvec(lw.o_proj, attended.data(), projected.data());
    rms_norm(projected.data(), projected.data(), lw.post_attention_norm.data(), H, eps);
    for (int i = 0; i < H; ++i) h[s][size_t(i)] += projected[size_t(i)];
  }
}

// h += post_norm(down(gelu_tanh(gate(x)) * up(x))), x = pre_norm(h).
void ReferenceModel::mlp_block(int layer, Rows& h) const {
  const LayerWeights& lw = weights_.layers[size_t(layer)];
  const int H = config_.hidden_size, F = int(lw.gate_proj.rows);
  const float eps = config_.rms_norm_eps;
  std::vector<float> x(static_cast<size_t>(H)), gate(static_cast<size_t>(F)), up(static_cast<size_t>(F)), out(static_cast<size_t>(H));
  for (auto& hs : h) {
    rms_norm(x.data(), hs.data(), lw.pre_feedforward_norm.data(), H, eps);
    matvec(lw.gate_proj, x.data(), gate.data());
    matvec(lw.up_proj, x.data(), up.data());
    for (int f = 0; f < F; ++f) gate[size_t(f)] = gelu_tanh(gate[size_t(f)]) * up[size_t(f)];
    matvec(lw.down_proj, gate.data(), out.data());
    rms_norm(out.data(), out.data(), lw.post_feedforward_norm.data(), H, eps);
    for (int i = 0; i < H; ++i) hs[size_t(i)] += out[size_t(i)];
  }
}

// h += post_norm(projection(gelu_tanh(gate(h)) * per_layer_input)): the gate reads the raw
// residual stream, not a normed copy.
void ReferenceModel::per_layer_input_block(int layer, Rows& h, const Rows& per_layer_inputs) const {
  const LayerWeights& lw = weights_.layers[size_t(layer)];
  const int H = config_.hidden_size, P = config_.ple_dim;
  std::vector<float> gate(static_cast<size_t>(P)), out(static_cast<size_t>(H));
  for (size_t s = 0; s < h.size(); ++s) {
    matvec(lw.ple_gate, h[s].data(), gate.data());
    const float* input = per_layer_inputs[s].data() + size_t(layer) * P;
    for (int d = 0; d < P; ++d) gate[size_t(d)] = gelu_tanh(gate[size_t(d)]) * input[d];
    matvec(lw.ple_projection, gate.data(), out.data());
    rms_norm(out.data(), out.data(), lw.post_ple_norm.data(), H, config_.rms_norm_eps);
    for (int i = 0; i < H; ++i) h[s][size_t(i)] += out[size_t(i)];
  }
}

// Final norm, the tied LM head (the unscaled embedding matrix), then cap * tanh(logit / cap).
std::vector<float> ReferenceModel::logits(const std::vector<float>& hidden) const {
  const int H = config_.hidden_size;
  std::vector<float> x(static_cast<size_t>(H)), out(size_t(config_.vocab_size));
  rms_norm(x.data(), hidden.data(), weights_.final_norm.data(), H, config_.rms_norm_eps);
  matvec(weights_.lm_head, x.data(), out.data());
  if (const float cap = config_.final_logit_softcap; cap > 0)
    for (float& v : out) v = cap * std::tanh(v / cap);
  return out;
}

}  // namespace tandem
