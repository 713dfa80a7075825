#pragma once
// Which slice of each tensor a tensor-parallel rank holds. Column-parallel: q, k, v, gate, up
// (rows of the [out, in] matrices). Row-parallel: o and down (columns), followed by an all-reduce.
// K/V heads are split across ranks, or replicated when there are more ranks than KV heads; each
// rank keeps the model's query-to-KV-head grouping. The LM head is split by vocabulary rows.
#include "model/config.h"

namespace tandem {

struct HeadShard {
  int q_first = 0, q_count = 0;    // query heads of this rank
  int kv_first = 0, kv_count = 0;  // KV heads of this rank
  int group = 1;                   // query heads per KV head (the model's grouping)
  // The local KV head that local query head `h` reads.
  int kv_of(int h) const { return (q_first + h) / group - kv_first; }
};

struct ShardPlan {
  int rank = 0;
  int size = 1;

  // Errors naming the config field when the model can't be split `size` ways.
  void validate(const Gemma4Config& config) const;
  HeadShard heads(const LayerConfig& layer, int num_heads) const;
  std::pair<int64_t, int64_t> mlp_range(int64_t width) const;   // [first, count)
  std::pair<int64_t, int64_t> vocab_range(int64_t vocab) const;  // [first, count)
};

}  // namespace tandem
