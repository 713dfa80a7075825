#pragma once
// Binds the tensors of a Gemma 4 checkpoint to the model: finds the text weights (under
// `model.language_model.` or `model.`), checks every shape against the config, and hands out
// zero-copy views of this rank's slices. Vision/audio tensors and the unused k/v projections of
// KV-shared layers are never touched.
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "kernels/weight.h"
#include "model/config.h"
#include "model/shard_plan.h"

namespace tandem {

using NormWeight = std::vector<float>;

// "model.language_model." (multimodal checkpoints) or "model." (text-only exports); Error if neither.
std::string text_weight_prefix(const CheckpointFiles& files);

struct LayerWeights {
  NormWeight input_norm, post_attention_norm, pre_feedforward_norm, post_feedforward_norm;
  WeightMatrix q_proj, k_proj, v_proj, o_proj;  // k/v empty on KV-shared layers
  NormWeight q_norm, k_norm;                    // k_norm empty on KV-shared layers
  WeightMatrix gate_proj, up_proj, down_proj;
  WeightMatrix ple_gate, ple_projection;  // per_layer_input_gate [P, H], per_layer_projection [H, P]
  NormWeight post_ple_norm;
  float layer_scalar = 1.0f;
  HeadShard heads;  // this rank's heads
};

struct ModelWeights {
  std::string prefix;        // "model.language_model." or "model."
  WeightMatrix embed;        // [vocab, H], full (every rank embeds every token)
  WeightMatrix lm_head;      // this rank's vocabulary rows of the same tensor
  int64_t lm_head_first = 0; // first vocabulary id of lm_head
  WeightMatrix ple_table;    // [ple_vocab, L*P]
  const MappedFile* ple_table_file = nullptr;  // the mapping ple_table lies in (rows are pread: gathered_rows.h)
  WeightMatrix ple_model_projection;  // [L*P, H]
  NormWeight ple_projection_norm;     // [P]
  NormWeight final_norm;              // [H]
  std::vector<LayerWeights> layers;

  static ModelWeights bind(const CheckpointFiles& files, const Gemma4Config& config,
                           const ShardPlan& plan = {});
  size_t streamed_bytes_per_token() const;  // every matrix once, plus one PLE row
  std::vector<ByteRange> streamed_ranges() const;  // the memory of those matrices (not the PLE rows)
};

}  // namespace tandem
