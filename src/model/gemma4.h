#pragma once
// The fast Gemma 4 forward pass, written once over the ops interface for any batch, any
// tensor-parallel rank and any backend. One call runs one engine step: prefill chunks of some
// sequences and single decode tokens of others, all through the same batched matmuls, each
// sequence attending over its own paged KV cache.
//
// Two exact shortcuts: once the last layer that writes the cache has stored its K/V (E4B: layer
// 23 of 42; the others share caches), only the rows whose logits are wanted are computed; and the
// LM head runs only for those rows.
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/ops.h"
#include "model/config.h"
#include "model/gathered_rows.h"
#include "model/kv_cache.h"
#include "model/weights.h"
#include "parallel/communicator.h"

namespace tandem {

struct StepSequence {
  KvSequenceBlocks* kv = nullptr;  // blocks reserved for the new tokens; kv->length advances
  std::span<const int32_t> tokens; // new tokens, at positions kv->length, kv->length + 1, ...
  int logit_rows = 1;              // logits for this many of the last tokens (0: a non-final chunk)
};

class Gemma4Model {
 public:
  Gemma4Model(const Gemma4Config& config, const ModelWeights& weights, Ops& ops, Communicator& comm, KvCache& cache,
              int max_step_tokens, int max_logit_rows);

  // Runs one step. Logit rows come out in batch order (each sequence's wanted rows, in position
  // order), each holding this rank's slice of the vocabulary.
  void forward(std::span<const StepSequence> batch);

  int logit_rows() const { return logit_rows_; }
  // Per logit row, 1 where its final hidden state held a NaN or Inf (non-finite weights, or an
  // overflow): its logits are garbage. Rows are independent, so the other rows stand.
  std::span<const uint8_t> non_finite_rows() const { return {non_finite_rows_.data(), size_t(logit_rows_)}; }
  const float* logits(int row) const { return logits_.data() + size_t(row) * size_t(vocab_local_); }
  int64_t vocab_first() const { return weights_.lm_head_first; }
  int64_t vocab_local() const { return vocab_local_; }
  int max_step_tokens() const { return max_tokens_; }
  const Gemma4Config& config() const { return config_; }
  KvCache& cache() { return cache_; }

 private:
  struct Row {
    int32_t position;
    int32_t sequence;
  };
  void prepare_rows(std::span<const StepSequence> batch);
  void per_layer_inputs();
  void rope_tables();
  void attention_block(int layer);
  void mlp_block(int layer);
  void per_layer_input_block(int layer);
  void keep_only_logit_rows();
  void compute_logits();
  std::vector<KvSequence>& sequences_for(int layer);

  const Gemma4Config& config_;
  const ModelWeights& weights_;
  Ops& ops_;
  Communicator& comm_;
  KvCache& cache_;
  int max_tokens_;
  int max_logit_rows_;
  int64_t vocab_local_;
  std::vector<std::vector<float>> inv_freq_;  // per attention kind (sliding, full)
  GatheredRows ple_rows_;

  // Per-step state; buffers are sized once for max_step_tokens.
  std::span<const StepSequence> batch_;
  int rows_ = 0;             // rows currently flowing through the layers
  int wanted_rows_ = 0;      // rows whose logits the step's sequences asked for
  bool compacted_ = false;
  std::vector<int32_t> ids_, positions_;
  std::vector<int32_t> row_sequence_;
  std::vector<int32_t> seq_first_row_, seq_rows_;
  std::vector<KvSequence> kv_sequences_;
  std::vector<float> x_, normed_, scratch_h_, q_, k_, v_, attn_, gate_, up_, ple_, ple_tokens_, ple_gate_;
  std::vector<float> cos_[2], sin_[2];
  std::vector<float> logits_;
  std::vector<uint8_t> non_finite_rows_;
  int logit_rows_ = 0;
};

}  // namespace tandem
