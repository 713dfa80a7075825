#include "model/shard_plan.h"

#include "core/error.h"

namespace tandem {

void ShardPlan::validate(const Gemma4Config& c) const {
  if (size < 1 || rank < 0 || rank >= size) fail("invalid tensor-parallel rank {} of {}", rank, size);
  if (c.vocab_size % size) fail("{}: a vocabulary of {} can't be split evenly over {} ranks", c.source, c.vocab_size, size);
  for (size_t i = 0; i < c.layers.size(); ++i) {
    const LayerConfig& l = c.layers[i];
    const bool splits_kv = size <= l.num_kv_heads;
    if (splits_kv ? l.num_kv_heads % size : size % l.num_kv_heads)
      fail("{}: layer {} has {} KV heads, which can't be split or replicated over {} ranks", c.source, i,
           l.num_kv_heads, size);
    if (c.num_heads % size)
      fail("{}: {} attention heads can't be split over {} ranks", c.source, c.num_heads, size);
    if (l.mlp_width % size) fail("{}: MLP width {} can't be split over {} ranks", c.source, l.mlp_width, size);
  }
}

HeadShard ShardPlan::heads(const LayerConfig& layer, int num_heads) const {
  HeadShard s;
  s.group = num_heads / layer.num_kv_heads;
  s.q_count = num_heads / size;
  s.q_first = rank * s.q_count;
  if (size <= layer.num_kv_heads) {
    s.kv_count = layer.num_kv_heads / size;
    s.kv_first = rank * s.kv_count;
  } else {  // more ranks than KV heads: every rank holds a copy of the one KV head its queries use
    s.kv_count = 1;
    s.kv_first = s.q_first / s.group;
  }
  return s;
}

std::pair<int64_t, int64_t> ShardPlan::mlp_range(int64_t width) const {
  const int64_t count = width / size;
  return {rank * count, count};
}

std::pair<int64_t, int64_t> ShardPlan::vocab_range(int64_t vocab) const {
  const int64_t base = vocab / size, extra = vocab % size;
  const int64_t first = rank * base + std::min<int64_t>(rank, extra);
  return {first, base + (rank < extra ? 1 : 0)};
}

}  // namespace tandem
