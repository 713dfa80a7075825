#include "kernels/cpu/attention.h"

#include <xmmintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/attention_item.h"

namespace tandem::cpu {

namespace {

using attention::State;
using attention::WorkItem;
using attention::heads_of;
using attention::kMaxHeads;
using attention::kRowTile;

constexpr int64_t kMinKeysPerSplit = 256;

void write_output(const KernelTable& k, const AttentionBatch& b, const WorkItem& item, const State* states) {
  const KvSequence& seq = b.sequences[size_t(item.seq)];
  const int D = b.kv.head_dim;
  int heads[kMaxHeads];
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

// Starts loading the keys and values of the first KV block an item reads, into L2. The item
// kernels prefetch each next block while they work through one, but an item's first block waited
// on DRAM: in a batch of 8 decode sequences at short contexts (a few blocks per item) most of the
// attention's time was those loads. Issued one item ahead, beside the current item's work: E4B
// q4 batches of 8 (contexts 17-137, steps alternated A-B-B-A in one process) ran 2.1-4.7% faster
// against 0.5-1.0% for the harness against itself.
void prefetch_first_block(const AttentionBatch& b, const WorkItem& item) {
  if (item.key_begin >= item.key_end) return;
  const KvSequence& seq = b.sequences[size_t(item.seq)];
  const int64_t block = seq.blocks[item.key_begin / b.kv.block_size - seq.first_logical_block];
  const size_t element = kv_dtype_size(b.kv.dtype);
  // One (block, KV head)'s keys, and its values, are each block_size * head_dim elements in a row.
  const char* keys = static_cast<const char*>(b.kv.keys) + size_t(b.kv.key_offset(block, item.kv_head, 0, 0)) * element;
  const char* values =
      static_cast<const char*>(b.kv.values) + size_t(b.kv.value_offset(block, item.kv_head, 0, 0)) * element;
  const size_t bytes = size_t(b.kv.block_size) * size_t(b.kv.head_dim) * element;
  for (size_t offset = 0; offset < bytes; offset += 64) {
    _mm_prefetch(keys + offset, _MM_HINT_T1);
    _mm_prefetch(values + offset, _MM_HINT_T1);
  }
}

// The widest item kernel this table's CPU runs for the cache's layout.
attention::ItemKernel item_kernel(const KernelTable& k, const KvLayerView& kv) {
  if (k.isa >= Isa::Avx512 && attention::avx512_item_supported(kv)) return attention::avx512_item;
  if (k.isa != Isa::Scalar && attention::avx2_item_supported(kv)) return attention::avx2_item;
  return attention::generic_item;
}

}  // namespace

void paged_attention(ThreadPool& pool, const KernelTable& k, const AttentionBatch& b, std::vector<float>& scratch) {
  const int D = b.kv.head_dim;
  int heads[kMaxHeads];
  int max_heads = 0;
  for (int g = 0; g < b.kv.kv_heads; ++g) max_heads = std::max(max_heads, heads_of(b, g, heads));
  const attention::ItemKernel kernel = item_kernel(k, b.kv);

  // Sized by the batch's shape, not its tokens; kept per calling thread so that steady-state
  // steps allocate nothing. References, so that the pool's threads read the caller's lists.
  thread_local std::vector<WorkItem> t_items, t_kept, t_split_items;
  std::vector<WorkItem>& items = t_items;
  std::vector<WorkItem>& kept = t_kept;
  std::vector<WorkItem>& split_items = t_split_items;
  items.clear();
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
  // Too few items to keep every thread busy (single-sequence decode): split long key ranges and
  // merge the partial softmax states afterwards.
  const int threads = pool.size();
  int n_splits_total = 0;
  if (int(items.size()) < threads) {
    kept.clear();
    split_items.clear();
    for (const WorkItem& it : items) {
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
    items.swap(kept);
    items.insert(items.end(), split_items.begin(), split_items.end());
  }

  // Scratch: per thread, states for one item plus the kernel's own; per split slot, its states.
  const size_t state_floats = size_t(kRowTile) * max_heads * D;
  const size_t per_thread = state_floats + size_t(attention::item_scratch_floats(D, kRowTile * max_heads));
  const size_t per_split = size_t(max_heads) * (D + 2);
  const size_t needed = per_thread * threads + per_split * n_splits_total;
  if (scratch.size() < needed) scratch.resize(needed);
  float* split_base = scratch.data() + per_thread * threads;

  pool.run([&](int t, int nt) {
    float* base = scratch.data() + per_thread * t;
    State states[kRowTile * kMaxHeads];
    for (int i = 0; i < kRowTile * max_heads; ++i) states[i].acc = base + size_t(i) * D;
    float* kernel_scratch = base + state_floats;
    for (size_t i = size_t(t); i < items.size(); i += size_t(nt)) {
      const WorkItem& item = items[i];
      if (i + size_t(nt) < items.size()) prefetch_first_block(b, items[i + size_t(nt)]);
      kernel(k, b, item, states, kernel_scratch);
      if (item.split < 0) {
        write_output(k, b, item, states);
      } else {  // keep (max, sum, acc) per head for the merge
        int item_heads[kMaxHeads];  // per thread: `heads` belongs to the calling thread
        const int n_heads = heads_of(b, item.kv_head, item_heads);
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
