#pragma once
// Internals of the paged attention: the unit of work (rows of one sequence against one KV head over
// a key range) and the running softmax state each query keeps. One item kernel per instruction set.
#include "kernels/cpu/kernels.h"
#include "kernels/ops.h"

namespace tandem::cpu::attention {

constexpr int kRowTile = 8;     // query rows per work item
constexpr int kMaxHeads = 64;   // query heads per KV head; config.h refuses larger groups (kMaxQueryHeadsPerKvHead)

struct WorkItem {
  int seq;        // index into batch.sequences
  int kv_head;    // local KV head
  int row_begin;  // rows of the sequence, relative to its first_row
  int row_end;
  int key_begin;  // key positions [key_begin, key_end) this item covers
  int key_end;
  int split;      // -1: writes the output directly; else index of its partial-state slot
};

// Running softmax state of one (row, head): max score, sum of exponentials, weighted value sum.
struct State {
  float max;
  float sum;
  float* acc;
};

// The local query heads that read `kv_head`; returns how many.
int heads_of(const AttentionBatch& b, int kv_head, int* heads);

// The item's queries, row-major over (row, query head of the KV head): where each query vector is
// and the key positions [lo, hi] it sees within the item (lo > hi: none).
struct ItemQueries {
  int count;
  const float* q[kRowTile * kMaxHeads];
  int lo[kRowTile * kMaxHeads];
  int hi[kRowTile * kMaxHeads];
};

// Fills `out` for the item and resets states[0, out.count) (max -inf, sum 0, acc zero).
void item_queries(const AttentionBatch& b, const WorkItem& item, State* states, ItemQueries& out);

// Whether query position p sees key position j.
inline bool visible(const AttentionBatch& b, int p, int j) { return j <= p && (b.window == 0 || j > p - b.window); }

// Floats of scratch an item kernel may use (per thread), for items of up to max_queries queries:
// a copy of every query and two more vectors of head_dim, and a few floats per head.
inline int64_t item_scratch_floats(int head_dim, int max_queries) {
  return (int64_t(max_queries) + 2) * head_dim + 16 * kMaxHeads;
}

// Fills states[r * n_heads + i] for the item's rows r and heads i (accumulators unnormalized).
// `scratch` holds at least item_scratch_floats(head_dim, the item's queries) floats.
using ItemKernel = void (*)(const KernelTable& k, const AttentionBatch& b, const WorkItem& item, State* states,
                            float* scratch);

void generic_item(const KernelTable& k, const AttentionBatch& b, const WorkItem& item, State* states, float* scratch);
// AVX-512, for KV blocks of 16 keys and head sizes divisible by 16; nullptr-free: check with
// avx512_item_supported() first.
void avx512_item(const KernelTable& k, const AttentionBatch& b, const WorkItem& item, State* states, float* scratch);
bool avx512_item_supported(const KvLayerView& kv);
// AVX2 + FMA (also on AVX-512 CPUs for layouts the AVX-512 kernel does not take), for KV blocks of
// 16 keys and head sizes divisible by 8.
void avx2_item(const KernelTable& k, const AttentionBatch& b, const WorkItem& item, State* states, float* scratch);
bool avx2_item_supported(const KvLayerView& kv);

}  // namespace tandem::cpu::attention
