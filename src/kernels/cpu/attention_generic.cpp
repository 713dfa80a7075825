// The portable attention item kernel: one key at a time, through the kernel table's dot and axpy.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "kernels/cpu/attention_item.h"

namespace tandem::cpu::attention {

int heads_of(const AttentionBatch& b, int kv_head, int* heads) {
  int n = 0;
  for (int h = 0; h < b.q_heads; ++h)
    if ((b.q_first + h) / b.group - b.kv_first == kv_head) heads[n++] = h;
  return n;
}

void item_queries(const AttentionBatch& b, const WorkItem& item, State* states, ItemQueries& out) {
  const KvSequence& seq = b.sequences[size_t(item.seq)];
  const int D = b.kv.head_dim;
  int heads[kMaxHeads];
  const int n_heads = heads_of(b, item.kv_head, heads);
  out.count = (item.row_end - item.row_begin) * n_heads;
  for (int r = 0; r < item.row_end - item.row_begin; ++r) {
    const int p = seq.positions[item.row_begin + r];
    const int64_t row = seq.first_row + item.row_begin + r;
    for (int i = 0; i < n_heads; ++i) {
      const int q = r * n_heads + i;
      out.q[q] = b.q + row * b.q_stride + int64_t(heads[i]) * D;
      out.lo[q] = std::max(item.key_begin, b.window > 0 ? p - b.window + 1 : 0);
      out.hi[q] = std::min(p, item.key_end - 1);
      states[q].max = -INFINITY;
      states[q].sum = 0.0f;
      std::memset(states[q].acc, 0, size_t(D) * sizeof(float));
    }
  }
}

namespace {

float element(const KvLayerView& kv, const void* base, int64_t offset) {
  return kv.dtype == KvDType::F32 ? static_cast<const float*>(base)[offset]
                                  : bf16_to_f32(static_cast<const uint16_t*>(base)[offset]);
}

}  // namespace

void generic_item(const KernelTable& k, const AttentionBatch& b, const WorkItem& item, State* states, float* scratch) {
  const KvSequence& seq = b.sequences[size_t(item.seq)];
  const KvLayerView& kv = b.kv;
  const int D = kv.head_dim;
  int heads[kMaxHeads];
  const int n_heads = heads_of(b, item.kv_head, heads);
  const int rows = item.row_end - item.row_begin;
  float* key = scratch;
  float* value = scratch + D;
  for (int i = 0; i < rows * n_heads; ++i) {
    states[i].max = -INFINITY;
    states[i].sum = 0.0f;
    std::memset(states[i].acc, 0, size_t(D) * sizeof(float));
  }
  for (int j = item.key_begin; j < item.key_end; ++j) {
    const int64_t block = seq.blocks[j / kv.block_size - seq.first_logical_block];
    const int slot = j % kv.block_size;
    bool loaded = false;
    for (int r = 0; r < rows; ++r) {
      if (!visible(b, seq.positions[item.row_begin + r], j)) continue;
      if (!loaded) {  // gather the transposed key, widen both to float
        for (int d = 0; d < D; ++d) key[d] = element(kv, kv.keys, kv.key_offset(block, item.kv_head, slot, d));
        for (int d = 0; d < D; ++d) value[d] = element(kv, kv.values, kv.value_offset(block, item.kv_head, slot, d));
        loaded = true;
      }
      const int64_t row = seq.first_row + item.row_begin + r;
      for (int i = 0; i < n_heads; ++i) {
        const float* q = b.q + row * b.q_stride + int64_t(heads[i]) * D;
        const float score = k.dot(q, key, D);  // Gemma 4: no 1/sqrt(D) scaling
        State& s = states[r * n_heads + i];
        if (score > s.max) {
          const float rescale = std::exp(s.max - score);  // exp(-inf) = 0 on the first key
          s.sum *= rescale;
          k.scale(s.acc, D, rescale);
          s.max = score;
        }
        const float weight = std::exp(score - s.max);
        s.sum += weight;
        k.axpy(s.acc, weight, value, D);
      }
    }
  }
}

}  // namespace tandem::cpu::attention
