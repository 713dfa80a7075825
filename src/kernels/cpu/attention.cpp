#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"

namespace tandem::cpu {

namespace {

constexpr int kRowTile = 8;
constexpr int64_t kMinKeysPerSplit = 256;

struct WorkItem {
  int seq;        // index into batch.sequences
  int kv_head;    // local KV head
  int row_begin;  // rows of the sequence, relative to its first_row
  int row_end;
  int key_begin;  // key positions [key_begin, key_end) this item covers (all visible when not split)
  int key_end;
  int split;      // -1: writes the output directly; else index of its partial-state slot
};

// Running softmax state of one (row, head): max score, sum of exponentials, weighted value sum.
struct State {
  float max;
  float sum;
  float* acc;
};

// The local query heads that read `kv_head`.
int heads_of(const AttentionBatch& b, int kv_head, int* heads) {
  int n = 0;
  for (int h = 0; h < b.q_heads; ++h)
    if ((b.q_first + h) / b.group - b.kv_first == kv_head) heads[n++] = h;
  return n;
}

const float* key_or_value(const KvLayerView& kv, const void* base, int64_t block, int kv_head, int slot,
                          float* widened) {
  const int64_t offset = block * kv.block_stride + int64_t(kv_head) * kv.head_stride + int64_t(slot) * kv.head_dim;
  if (kv.dtype == KvDType::F32) return static_cast<const float*>(base) + offset;
  const uint16_t* src = static_cast<const uint16_t*>(base) + offset;
  for (int d = 0; d < kv.head_dim; ++d) widened[d] = bf16_to_f32(src[d]);
  return widened;
}

// Processes one work item; `states` has rows * heads entries (row-major), each acc of head_dim.
void run_item(const KernelTable& k, const AttentionBatch& b, const WorkItem& item, State* states, float* widened_k,
              float* widened_v) {
  const KvSequence& seq = b.sequences[size_t(item.seq)];
  const KvLayerView& kv = b.kv;
  const int D = kv.head_dim;
  int heads[64];
  const int n_heads = heads_of(b, item.kv_head, heads);
  const int rows = item.row_end - item.row_begin;
  for (int i = 0; i < rows * n_heads; ++i) {
    states[i].max = -INFINITY;
    states[i].sum = 0.0f;
    std::memset(states[i].acc, 0, size_t(D) * sizeof(float));
  }
  for (int j = item.key_begin; j < item.key_end; ++j) {
    const int64_t block = seq.blocks[j / kv.block_size - seq.first_logical_block];
    const int slot = j % kv.block_size;
    const float* key = key_or_value(kv, kv.keys, block, item.kv_head, slot, widened_k);
    const float* value = nullptr;
    for (int r = 0; r < rows; ++r) {
      const int p = seq.positions[item.row_begin + r];
      if (j > p || (b.window > 0 && j <= p - b.window)) continue;
      if (!value) value = key_or_value(kv, kv.values, block, item.kv_head, slot, widened_v);
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

void write_output(const KernelTable& k, const AttentionBatch& b, const WorkItem& item, const State* states) {
  const KvSequence& seq = b.sequences[size_t(item.seq)];
  const int D = b.kv.head_dim;
  int heads[64];
  const int n_heads = heads_of(b, item.kv_head, heads);
  for (int r = 0; r < item.row_end - item.row_begin; ++r) {
    const int64_t row = seq.first_row + item.row_begin + r;
    for (int i = 0; i < n_heads; ++i) {
      const State& s = states[r * n_heads + i];
      float* out = b.out + row * b.out_stride + int64_t(heads[i]) * D;
      std::memcpy(out, s.acc, size_t(D) * sizeof(float));
      k.scale(out, D, s.sum > 0 ? 1.0f / s.sum : 0.0f);
    }
  }
}

}  // namespace

void paged_attention(ThreadPool& pool, const KernelTable& k, const AttentionBatch& b, std::vector<float>& scratch) {
  const int D = b.kv.head_dim;
  int heads[64];
  int max_heads = 0;
  for (int g = 0; g < b.kv.kv_heads; ++g) max_heads = std::max(max_heads, heads_of(b, g, heads));

  std::vector<WorkItem> items;  // small; sized by batch shape, not tokens
  for (int s = 0; s < int(b.sequences.size()); ++s) {
    const KvSequence& seq = b.sequences[size_t(s)];
    for (int g = 0; g < b.kv.kv_heads; ++g)
      for (int r = 0; r < seq.rows; r += kRowTile) {
        const int r_end = std::min(seq.rows, r + kRowTile);
        const int last = seq.positions[r_end - 1];
        const int first = b.window > 0 ? std::max(0, seq.positions[r] - b.window + 1) : 0;
        items.push_back({s, g, r, r_end, first, last + 1, -1});
      }
  }
  // Too few items to keep every thread busy (single-sequence decode): split long key ranges.
  const int threads = pool.size();
  int n_splits_total = 0;
  std::vector<WorkItem> split_items;
  if (int(items.size()) < threads) {
    std::vector<WorkItem> kept;
    for (size_t i = 0; i < items.size(); ++i) {
      const WorkItem& it = items[i];
      const int64_t keys = it.key_end - it.key_begin;
      const int parts = int(std::min<int64_t>((threads + int(items.size()) - 1) / int(items.size()),
                                              keys / kMinKeysPerSplit));
      if (it.row_end - it.row_begin != 1 || parts < 2) {
        kept.push_back(it);
        continue;
      }
      for (int p = 0; p < parts; ++p) {
        WorkItem part = it;
        part.key_begin = it.key_begin + int(keys * p / parts);
        part.key_end = it.key_begin + int(keys * (p + 1) / parts);
        part.split = n_splits_total++;
        split_items.push_back(part);
      }
    }
    items = std::move(kept);
    items.insert(items.end(), split_items.begin(), split_items.end());
  }

  // Scratch: per thread, states for one item; per split slot, its states kept for the merge.
  const size_t state_floats = size_t(kRowTile) * max_heads * D;
  const size_t per_thread = state_floats + 2 * size_t(D);
  const size_t per_split = size_t(max_heads) * (D + 2);
  const size_t needed = per_thread * threads + per_split * n_splits_total;
  if (scratch.size() < needed) scratch.resize(needed);
  float* split_base = scratch.data() + per_thread * threads;

  pool.run([&](int t, int nt) {
    float* base = scratch.data() + per_thread * t;
    State states[kRowTile * 64];
    for (int i = 0; i < kRowTile * max_heads; ++i) states[i].acc = base + size_t(i) * D;
    float* widened_k = base + state_floats;
    float* widened_v = widened_k + D;
    for (size_t i = size_t(t); i < items.size(); i += size_t(nt)) {
      const WorkItem& item = items[i];
      run_item(k, b, item, states, widened_k, widened_v);
      if (item.split < 0) {
        write_output(k, b, item, states);
      } else {  // keep (max, sum, acc) per head for the merge
        const int n_heads = heads_of(b, item.kv_head, heads);
        float* slot = split_base + per_split * size_t(item.split);
        for (int h = 0; h < n_heads; ++h) {
          slot[h * (D + 2)] = states[h].max;
          slot[h * (D + 2) + 1] = states[h].sum;
          std::memcpy(slot + h * (D + 2) + 2, states[h].acc, size_t(D) * sizeof(float));
        }
      }
    }
  });

  // Merge split partial states: consecutive split slots with the same (seq, kv_head) belong together.
  for (size_t i = 0; i < items.size();) {
    if (items[i].split < 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < items.size() && items[j].split >= 0 && items[j].seq == items[i].seq &&
           items[j].kv_head == items[i].kv_head)
      ++j;
    const WorkItem& first = items[i];
    const int n_heads = heads_of(b, first.kv_head, heads);
    const KvSequence& seq = b.sequences[size_t(first.seq)];
    const int64_t row = seq.first_row + first.row_begin;
    for (int h = 0; h < n_heads; ++h) {
      float max = -INFINITY;
      for (size_t s = i; s < j; ++s) max = std::max(max, split_base[per_split * size_t(items[s].split) + h * (D + 2)]);
      float* out = b.out + row * b.out_stride + int64_t(heads[h]) * D;
      std::memset(out, 0, size_t(D) * sizeof(float));
      float sum = 0.0f;
      for (size_t s = i; s < j; ++s) {
        const float* slot = split_base + per_split * size_t(items[s].split) + h * (D + 2);
        if (slot[1] == 0.0f) continue;
        const float w = std::exp(slot[0] - max);
        sum += slot[1] * w;
        k.axpy(out, w, slot + 2, D);
      }
      k.scale(out, D, sum > 0 ? 1.0f / sum : 0.0f);
    }
    i = j;
  }
}

}  // namespace tandem::cpu
