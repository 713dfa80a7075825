#include "model/gemma4.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "model/rope.h"

namespace tandem {

namespace {
int kind_index(AttentionKind kind) { return kind == AttentionKind::Sliding ? 0 : 1; }
}  // namespace

Gemma4Model::Gemma4Model(const Gemma4Config& config, const ModelWeights& weights, Ops& ops, Communicator& comm,
                         KvCache& cache, int max_step_tokens, int max_logit_rows)
    : config_(config),
      weights_(weights),
      ops_(ops),
      comm_(comm),
      cache_(cache),
      max_tokens_(max_step_tokens),
      max_logit_rows_(max_logit_rows),
      vocab_local_(weights.lm_head.rows),
      ple_rows_(weights.ple_table, weights.ple_table_file) {
  if (max_step_tokens < 1 || max_logit_rows < 1) fail("a step must hold at least one token and one logit row");
  const int64_t T = max_step_tokens, H = config.hidden_size, LP = int64_t(config.num_layers) * config.ple_dim;
  int64_t q_width = 0, kv_width = 0, mlp_width = 0, half_dim[2] = {0, 0};
  for (size_t i = 0; i < config.layers.size(); ++i) {
    const LayerConfig& l = config.layers[i];
    const LayerWeights& w = weights.layers[i];
    q_width = std::max<int64_t>(q_width, int64_t(w.heads.q_count) * l.head_dim);
    kv_width = std::max<int64_t>(kv_width, int64_t(w.heads.kv_count) * l.head_dim);
    mlp_width = std::max<int64_t>(mlp_width, w.gate_proj.rows);
    half_dim[kind_index(l.kind)] = std::max<int64_t>(half_dim[kind_index(l.kind)], l.head_dim / 2);
  }
  inv_freq_.push_back(rope_inv_freq(config.rope_sliding, int(half_dim[0] * 2 > 0 ? half_dim[0] * 2 : 2)));
  inv_freq_.push_back(rope_inv_freq(config.rope_full, int(half_dim[1] * 2 > 0 ? half_dim[1] * 2 : 2)));
  for (size_t i = 0; i < config.layers.size(); ++i)  // one RoPE table per kind: every layer of a kind shares D
    if (config.layers[i].head_dim / 2 != half_dim[kind_index(config.layers[i].kind)])
      fail("{}: layers of one attention kind with different head sizes are not supported", config.source);

  ids_.resize(size_t(T));
  positions_.resize(size_t(T));
  row_sequence_.resize(size_t(T));
  for (auto* b : {&x_, &normed_, &scratch_h_}) b->resize(size_t(T * H));
  q_.resize(size_t(T * q_width));
  attn_.resize(size_t(T * q_width));
  k_.resize(size_t(T * kv_width));
  v_.resize(size_t(T * kv_width));
  gate_.resize(size_t(T * mlp_width));
  up_.resize(size_t(T * mlp_width));
  ple_.resize(size_t(T * LP));
  ple_tokens_.resize(size_t(T * LP));
  ple_gate_.resize(size_t(T * config.ple_dim));
  for (int k = 0; k < 2; ++k) {
    cos_[k].resize(size_t(T * half_dim[k]));
    sin_[k].resize(size_t(T * half_dim[k]));
  }
  logits_.resize(size_t(max_logit_rows) * size_t(vocab_local_));
}

void Gemma4Model::forward(std::span<const StepSequence> batch) {
  batch_ = batch;
  prepare_rows(batch);
  const float embed_scale = float(std::sqrt(double(config_.hidden_size)));
  ops_.embed(weights_.embed, ids_.data(), rows_, embed_scale, x_.data(), config_.hidden_size);
  per_layer_inputs();
  rope_tables();
  for (int i = 0; i < config_.num_layers && rows_ > 0; ++i) {
    attention_block(i);
    if (rows_ == 0) break;  // the last cache-writing layer kept no rows: no logits wanted
    mlp_block(i);
    if (config_.ple_dim > 0) per_layer_input_block(i);
    ops_.scale(x_.data(), int64_t(rows_) * config_.hidden_size, weights_.layers[size_t(i)].layer_scalar);
  }
  compute_logits();
  for (const StepSequence& s : batch) {
    s.kv->length += int(s.tokens.size());
    cache_.trim_window(*s.kv);
  }
}

void Gemma4Model::prepare_rows(std::span<const StepSequence> batch) {
  int total = 0, logit_rows = 0;
  for (const StepSequence& s : batch) {
    if (s.logit_rows < 0 || s.logit_rows > int(s.tokens.size())) fail("a sequence asked for more logit rows than tokens");
    total += int(s.tokens.size());
    logit_rows += s.logit_rows;
  }
  if (total > max_tokens_) fail("step of {} tokens exceeds the limit of {}", total, max_tokens_);
  if (logit_rows > max_logit_rows_) fail("step wants {} logit rows, the limit is {}", logit_rows, max_logit_rows_);
  seq_first_row_.assign(batch.size(), 0);
  seq_rows_.assign(batch.size(), 0);
  int row = 0;
  for (size_t s = 0; s < batch.size(); ++s) {
    const StepSequence& seq = batch[s];
    if (cache_.options().full_blocks > 0 &&
        int64_t(seq.kv->full.size()) < cache_.full_blocks_for(seq.kv->length + int(seq.tokens.size())))
      fail("KV blocks were not reserved for a sequence of this step");
    seq_first_row_[s] = row;
    seq_rows_[s] = int(seq.tokens.size());
    for (size_t i = 0; i < seq.tokens.size(); ++i, ++row) {
      const int32_t id = seq.tokens[i];
      if (id < 0 || id >= config_.vocab_size) fail("token id {} is outside the vocabulary (0..{})", id, config_.vocab_size - 1);
      ids_[size_t(row)] = id;
      positions_[size_t(row)] = seq.kv->length + int32_t(i);
      row_sequence_[size_t(row)] = int32_t(s);
    }
  }
  rows_ = total;
  wanted_rows_ = logit_rows;
  compacted_ = false;
}

// ple = (rms_norm(W_plm x0 * H^-0.5) + PLE_table[t] * sqrt(P)) * 2^-0.5, for all layers at once.
void Gemma4Model::per_layer_inputs() {
  const int64_t P = config_.ple_dim, LP = int64_t(config_.num_layers) * P, T = rows_;
  if (P == 0 || T == 0) return;
  ops_.matmul(weights_.ple_model_projection, x_.data(), config_.hidden_size, T, ple_.data(), LP);
  ops_.scale(ple_.data(), T * LP, float(1.0 / std::sqrt(double(config_.hidden_size))));
  ops_.rms_norm(ple_.data(), P, ple_.data(), P, T * config_.num_layers, P, weights_.ple_projection_norm.data(),
                config_.rms_norm_eps);
  const GatheredRows::View rows = ple_rows_.gather(ids_.data(), T);
  ops_.embed(*rows.matrix, rows.ids, T, float(std::sqrt(double(P))), ple_tokens_.data(), LP);
  ops_.add(ple_.data(), ple_tokens_.data(), T * LP);
  ops_.scale(ple_.data(), T * LP, float(M_SQRT1_2));
}

void Gemma4Model::rope_tables() {
  for (int k = 0; k < 2; ++k) {
    const std::vector<float>& inv = inv_freq_[size_t(k)];
    const size_t half = inv.size();
    for (int r = 0; r < rows_; ++r)
      for (size_t d = 0; d < half; ++d) {
        const float angle = float(positions_[size_t(r)]) * inv[d];
        cos_[k][size_t(r) * half + d] = std::cos(angle);
        sin_[k][size_t(r) * half + d] = std::sin(angle);
      }
  }
}

std::vector<KvSequence>& Gemma4Model::sequences_for(int layer) {
  kv_sequences_.clear();
  for (size_t s = 0; s < batch_.size(); ++s) {
    if (seq_rows_[s] == 0) continue;
    KvSequence v = cache_.sequence_view(layer, *batch_[s].kv);
    v.first_row = seq_first_row_[s];
    v.rows = seq_rows_[s];
    v.positions = positions_.data() + seq_first_row_[s];
    kv_sequences_.push_back(v);
  }
  return kv_sequences_;
}

// h += post_norm(o_proj(attention(rope(q_norm(q)), K, V))), with K/V from this layer or its donor.
//
// The last layer that writes the cache stores every row's K/V, then carries on with only the rows
// whose logits are wanted (keep_only_logit_rows): the layers after it write no cache, so the other
// rows' hidden states would never be read again. Its queries, attention, output projection, MLP
// and PLE block then run for those rows alone (E4B: 1 of 24 cache-writing layers, ~4% of a long
// prefill's multiply-adds; a non-final prefill chunk skips them entirely).
void Gemma4Model::attention_block(int layer) {
  const LayerConfig& lc = config_.layers[size_t(layer)];
  const LayerWeights& lw = weights_.layers[size_t(layer)];
  const int64_t H = config_.hidden_size, D = lc.head_dim;
  const int qn = lw.heads.q_count, kvn = lw.heads.kv_count, kind = kind_index(lc.kind);
  const float eps = config_.rms_norm_eps;
  const bool trim = !lc.shares_kv && layer == config_.first_kv_shared_layer() - 1 && wanted_rows_ < rows_;

  ops_.rms_norm(normed_.data(), H, x_.data(), H, rows_, H, lw.input_norm.data(), eps);
  const MatmulTarget qkv[] = {{&lw.q_proj, q_.data(), qn * D}, {&lw.k_proj, k_.data(), kvn * D},
                               {&lw.v_proj, v_.data(), kvn * D}};
  if (lc.shares_kv) {
    ops_.matmul(lw.q_proj, normed_.data(), H, rows_, q_.data(), qn * D);
  } else {
    ops_.matmuls(std::span(qkv).subspan(trim ? 1 : 0), normed_.data(), H, rows_);
    const int64_t T = rows_;
    ops_.rms_norm(k_.data(), D, k_.data(), D, T * kvn, D, lw.k_norm.data(), eps);
    ops_.rope(k_.data(), kvn * D, T, kvn, int(D), cos_[kind].data(), sin_[kind].data());
    ops_.rms_norm(v_.data(), D, v_.data(), D, T * kvn, D, nullptr, eps);
    const KvLayerView view = cache_.layer_view(layer);
    ops_.store_kv(view, sequences_for(layer), k_.data(), kvn * D, v_.data(), kvn * D);
    if (trim) {
      keep_only_logit_rows();
      if (rows_ == 0) return;
      ops_.rms_norm(normed_.data(), H, x_.data(), H, rows_, H, lw.input_norm.data(), eps);
      ops_.matmul(lw.q_proj, normed_.data(), H, rows_, q_.data(), qn * D);
    }
  }
  const int64_t T = rows_;
  ops_.rms_norm(q_.data(), D, q_.data(), D, T * qn, D, lw.q_norm.data(), eps);
  ops_.rope(q_.data(), qn * D, T, qn, int(D), cos_[kind].data(), sin_[kind].data());

  AttentionBatch b;
  b.q = q_.data();
  b.q_stride = qn * D;
  b.out = attn_.data();
  b.out_stride = qn * D;
  b.q_heads = qn;
  b.q_first = lw.heads.q_first;
  b.kv_first = lw.heads.kv_first;
  b.group = lw.heads.group;
  b.window = lc.kind == AttentionKind::Sliding ? config_.sliding_window : 0;
  b.kv = cache_.layer_view(lc.kv_layer);
  b.sequences = sequences_for(layer);
  ops_.attention(b);

  ops_.matmul(lw.o_proj, attn_.data(), qn * D, T, scratch_h_.data(), H);
  comm_.all_reduce_sum(scratch_h_.data(), size_t(T * H));
  ops_.rms_norm(scratch_h_.data(), H, scratch_h_.data(), H, T, H, lw.post_attention_norm.data(), eps);
  ops_.add(x_.data(), scratch_h_.data(), T * H);
}

// h += post_norm(down(gelu_tanh(gate(x)) * up(x))), x = pre_norm(h).
void Gemma4Model::mlp_block(int layer) {
  const LayerWeights& lw = weights_.layers[size_t(layer)];
  const int64_t T = rows_, H = config_.hidden_size, F = lw.gate_proj.rows;
  const float eps = config_.rms_norm_eps;
  ops_.rms_norm(normed_.data(), H, x_.data(), H, T, H, lw.pre_feedforward_norm.data(), eps);
  const MatmulTarget gate_up[] = {{&lw.gate_proj, gate_.data(), F}, {&lw.up_proj, up_.data(), F}};
  ops_.matmuls(gate_up, normed_.data(), H, T);
  ops_.gelu_gate(gate_.data(), F, up_.data(), F, T, F);
  ops_.matmul(lw.down_proj, gate_.data(), F, T, scratch_h_.data(), H);
  comm_.all_reduce_sum(scratch_h_.data(), size_t(T * H));
  ops_.rms_norm(scratch_h_.data(), H, scratch_h_.data(), H, T, H, lw.post_feedforward_norm.data(), eps);
  ops_.add(x_.data(), scratch_h_.data(), T * H);
}

// h += post_norm(projection(gelu_tanh(gate(h)) * ple[layer])); the gate reads the raw stream.
void Gemma4Model::per_layer_input_block(int layer) {
  const LayerWeights& lw = weights_.layers[size_t(layer)];
  const int64_t T = rows_, H = config_.hidden_size, P = config_.ple_dim, LP = int64_t(config_.num_layers) * P;
  ops_.matmul(lw.ple_gate, x_.data(), H, T, ple_gate_.data(), P);
  ops_.gelu_gate(ple_gate_.data(), P, ple_.data() + int64_t(layer) * P, LP, T, P);
  ops_.matmul(lw.ple_projection, ple_gate_.data(), P, T, scratch_h_.data(), H);
  ops_.rms_norm(scratch_h_.data(), H, scratch_h_.data(), H, T, H, lw.post_ple_norm.data(), config_.rms_norm_eps);
  ops_.add(x_.data(), scratch_h_.data(), T * H);
}

// Drops the rows whose logits nobody wants. Exact once the last cache-writing layer has stored its
// K/V: the layers after it write no cache, and a row's hidden state depends only on itself and the
// (complete) caches.
void Gemma4Model::keep_only_logit_rows() {
  if (compacted_) return;
  compacted_ = true;
  const int64_t H = config_.hidden_size, LP = int64_t(config_.num_layers) * config_.ple_dim;
  int out = 0;
  for (size_t s = 0; s < batch_.size(); ++s) {
    const int keep = batch_[s].logit_rows;
    const int from = seq_first_row_[s] + seq_rows_[s] - keep;
    if (from != out) {
      std::memmove(x_.data() + out * H, x_.data() + int64_t(from) * H, size_t(keep * H) * sizeof(float));
      if (LP) std::memmove(ple_.data() + out * LP, ple_.data() + int64_t(from) * LP, size_t(keep * LP) * sizeof(float));
      std::memmove(positions_.data() + out, positions_.data() + from, size_t(keep) * sizeof(int32_t));
      std::memmove(row_sequence_.data() + out, row_sequence_.data() + from, size_t(keep) * sizeof(int32_t));
    }
    seq_first_row_[s] = out;
    seq_rows_[s] = keep;
    out += keep;
  }
  if (out == rows_) return;  // every row stays where it was: the RoPE tables hold
  rows_ = out;
  rope_tables();
}

// Final norm, the vocabulary slice of the tied LM head, then the soft-cap.
void Gemma4Model::compute_logits() {
  keep_only_logit_rows();
  logit_rows_ = rows_;
  if (rows_ == 0) return;
  const int64_t H = config_.hidden_size;
  ops_.rms_norm(normed_.data(), H, x_.data(), H, rows_, H, weights_.final_norm.data(), config_.rms_norm_eps);
  // A NaN or Inf here comes from the weights (a corrupt checkpoint) or an overflow; the soft-cap and
  // the sampler would turn it into plausible tokens (every logit -cap, token 0), so its row is marked
  // for the caller to refuse.
  non_finite_rows_.assign(size_t(rows_), 0);
  for (int r = 0; r < rows_; ++r) {
    const float* h = normed_.data() + int64_t(r) * H;
    non_finite_rows_[size_t(r)] = !std::all_of(h, h + H, [](float v) { return std::isfinite(v); });
  }
  const MatmulTarget lm_head{&weights_.lm_head, logits_.data(), vocab_local_, config_.final_logit_softcap};
  ops_.matmuls(std::span(&lm_head, 1), normed_.data(), H, rows_);
}

}  // namespace tandem
