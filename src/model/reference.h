#pragma once
// The float32 reference forward pass of the Gemma 4 text decoder: plain loops over plain arrays,
// one function per step of the model, readable top to bottom. It is never optimized; every fast
// path is tested against it. Weights are widened from the checkpoint row by row as they are used.
#include <cstdint>
#include <span>
#include <vector>

#include "core/thread_pool.h"
#include "model/config.h"
#include "model/sequence_model.h"
#include "model/weights.h"

namespace tandem {

class ReferenceModel final : public SequenceModel {
 public:
  // `weights` must be bound for a single rank. `pool` (optional) splits matrix rows over threads.
  ReferenceModel(const Gemma4Config& config, const ModelWeights& weights, ThreadPool* pool = nullptr);

  // Runs `tokens` at positions position(), position()+1, ... through the model, extending the KV
  // cache. Returns soft-capped logits, one row of vocab_size per token (or only for the last token
  // when all_positions is false).
  std::vector<std::vector<float>> forward(std::span<const int32_t> tokens, bool all_positions = true) override;

  int position() const override { return position_; }
  void reset() override;

 private:
  struct Cache {  // one row of kv_heads * head_dim floats per position, for layers that own K/V
    std::vector<float> keys, values;
  };

  void embed(std::span<const int32_t> tokens, std::vector<std::vector<float>>& x,
             std::vector<std::vector<float>>& per_layer_inputs) const;
  void attention_block(int layer, std::vector<std::vector<float>>& h);
  void mlp_block(int layer, std::vector<std::vector<float>>& h) const;
  void per_layer_input_block(int layer, std::vector<std::vector<float>>& h,
                             const std::vector<std::vector<float>>& per_layer_inputs) const;
  std::vector<float> logits(const std::vector<float>& hidden) const;
  void matvec(const WeightMatrix& w, const float* x, float* out) const;

  const Gemma4Config& config_;
  const ModelWeights& weights_;
  ThreadPool* pool_;
  std::vector<std::vector<float>> inv_freq_;  // per layer
  std::vector<Cache> cache_;                  // per layer (empty for KV-shared layers)
  int position_ = 0;
  int chunk_start_ = 0;
};

}  // namespace tandem
