#pragma once
// What the blocked item kernels (attention_avx512.cpp, attention_avx2.cpp) share: an item's queries
// in chunks, the KV blocks any query of a chunk sees, and the weighted value sums over such a
// block, written once over each file's vector of kWidth floats (its Lanes: type,
// load, store, set1, mul, fmadd, load_kv<T>). Include inside the including file's target pragma,
// after every standard header: the anonymous namespace gives each file its own copy, compiled for
// its instruction set, so the linker never mixes them.
#include <xmmintrin.h>

#include <cmath>
#include <cstdint>
#include <utility>  // also included by every includer before its target pragma

#include "kernels/cpu/attention_item.h"

namespace tandem::cpu::attention {
namespace {

constexpr int kBlock = 16;  // keys per KV block these kernels take

// Local helpers rather than std::min/max: templates instantiated under a target pragma could be
// emitted as weak symbols and picked by the linker for code that runs on any CPU.
inline int imin(int a, int b) { return a < b ? a : b; }
inline int imax(int a, int b) { return a > b ? a : b; }

template <KvDType T>
constexpr int64_t kvsize() {
  return T == KvDType::F32 ? 4 : 2;
}
template <KvDType T>
const char* element_address(const void* base, int64_t offset) {
  return static_cast<const char*>(base) + offset * kvsize<T>();
}

// The chunk of queries [q0, q0 + qc) of an item, and the KV blocks [first_blk, last_blk] (logical;
// none when first_blk > last_blk) that one of them sees.
struct QueryChunk {
  int q0, qc;
  int key_lo, key_hi;  // the keys some query of the chunk sees
  int first_blk, last_blk;
};

template <int Q>
QueryChunk query_chunk(const WorkItem& item, const ItemQueries& queries, int q0) {
  QueryChunk ch;
  ch.q0 = q0;
  ch.qc = imin(Q, queries.count - q0);
  ch.key_lo = item.key_end;
  ch.key_hi = -1;
  for (int c = 0; c < ch.qc; ++c) {
    if (queries.lo[q0 + c] > queries.hi[q0 + c]) continue;  // sees no key: widens nothing
    ch.key_lo = imin(ch.key_lo, queries.lo[q0 + c]);
    ch.key_hi = imax(ch.key_hi, queries.hi[q0 + c]);
  }
  ch.first_blk = ch.key_lo / kBlock;
  ch.last_blk = ch.key_hi >= ch.key_lo ? ch.key_hi / kBlock : ch.first_blk - 1;
  return ch;
}

// Logical block blk as a chunk sees it.
struct ChunkBlock {
  int base;                // the block's first key position
  int64_t k0, v0;          // element offsets of its keys and values (the item's KV head)
  const char* next_keys;   // the next block's keys and values, to prefetch (this block's if none)
  const char* next_values;
  bool prefetch_next;
  int slot_lo, slot_hi;    // the slots some query of the chunk sees
};

// next_blk: the block to prefetch while this one is worked on (< 0: none).
template <KvDType T>
ChunkBlock chunk_block(const AttentionBatch& b, const WorkItem& item, const QueryChunk& ch, int blk, int next_blk) {
  const KvSequence& seq = b.sequences[size_t(item.seq)];
  const KvLayerView& kv = b.kv;
  ChunkBlock cb;
  const int64_t phys = seq.blocks[blk - seq.first_logical_block];
  cb.k0 = kv.key_offset(phys, item.kv_head, 0, 0);
  cb.v0 = kv.value_offset(phys, item.kv_head, 0, 0);
  // The next block's keys and values stream into L2 while this one is scored and summed, at the
  // offsets read here (blocks are pages of the cache: a fresh sequence's are one run per KV head,
  // a reused cache's anywhere).
  cb.prefetch_next = next_blk >= 0;
  const int64_t next_phys = cb.prefetch_next ? seq.blocks[next_blk - seq.first_logical_block] : phys;
  cb.next_keys = element_address<T>(kv.keys, kv.key_offset(next_phys, item.kv_head, 0, 0));
  cb.next_values = element_address<T>(kv.values, kv.value_offset(next_phys, item.kv_head, 0, 0));
  cb.base = blk * kBlock;
  cb.slot_lo = imax(ch.key_lo - cb.base, 0);
  cb.slot_hi = imin(ch.key_hi - cb.base, kBlock - 1);
  return cb;
}

// Calls step(chunk, block) for every query chunk of Q queries and every KV block it sees, in passes
// over kBlocksPerPass blocks: each chunk in turn takes the pass's blocks, so its queries and sums
// stay in L1 over them while the blocks' keys and values, read from memory once, stay in L2 for
// every chunk of the item. Chunk by chunk over the whole key range, a prefill item (8 rows x 4
// query heads) read its keys and values 8 times over (`attention_bench Prefill` at 32768 keys on
// two Zen 3 cores: f32 44-62 -> 124-126 GFLOP/s, bf16 81-85 -> 117-129; docs/kernels.md). Each
// query still meets its blocks in order, so its sums are the same either way. Each block is
// prefetched once, while the first chunk to reach it works on the block before (`prefetched` only
// grows: a later chunk's rows sit at later positions, so it never starts before an earlier one).
constexpr int kBlocksPerPass = 4;

// The item's chunks of Q queries that see some key, and the blocks [first_blk, last_blk] any sees.
template <int Q>
struct ItemChunks {
  static constexpr int kMax = (kRowTile * kMaxHeads + Q - 1) / Q;
  QueryChunk chunks[kMax];
  int count = 0, first_blk = 0, last_blk = -1;

  ItemChunks(const WorkItem& item, const ItemQueries& queries) {
    for (int q0 = 0; q0 < queries.count; q0 += Q) {
      const QueryChunk ch = query_chunk<Q>(item, queries, q0);
      if (ch.first_blk > ch.last_blk) continue;  // sees no key: its state stays empty
      first_blk = count == 0 ? ch.first_blk : imin(first_blk, ch.first_blk);
      last_blk = count == 0 ? ch.last_blk : imax(last_blk, ch.last_blk);
      chunks[count++] = ch;
    }
  }
};

template <KvDType T, int Q, class Step>
void for_each_chunk_block(const AttentionBatch& b, const WorkItem& item, const ItemQueries& queries, Step&& step) {
  const ItemChunks<Q> c(item, queries);
  int prefetched = c.first_blk;  // blocks up to this one are on their way
  for (int p0 = c.first_blk; p0 <= c.last_blk; p0 += kBlocksPerPass) {
    const int p1 = imin(p0 + kBlocksPerPass - 1, c.last_blk);
    for (int i = 0; i < c.count; ++i) {
      const int lo = imax(p0, c.chunks[i].first_blk), hi = imin(p1, c.chunks[i].last_blk);
      for (int blk = lo; blk <= hi; ++blk) {
        const bool prefetch_next = blk + 1 > prefetched && blk < c.last_blk;
        if (prefetch_next) prefetched = blk + 1;
        step(c.chunks[i], chunk_block<T>(b, item, c.chunks[i], blk, prefetch_next ? blk + 1 : -1));
      }
    }
  }
}

// As for_each_chunk_block, but step(chunk, blocks, n) takes each chunk's blocks of a pass together
// (n <= kBlocksPerPass, in order), so that a kernel can score several blocks in one walk over the
// dimensions. Each block prefetches the one a pass later instead of the next: the next ones are
// the ones being read.
template <KvDType T, int Q, class Step>
void for_each_chunk_pass(const AttentionBatch& b, const WorkItem& item, const ItemQueries& queries, Step&& step) {
  const ItemChunks<Q> c(item, queries);
  int prefetched = imin(c.first_blk + kBlocksPerPass - 1, c.last_blk);
  for (int p0 = c.first_blk; p0 <= c.last_blk; p0 += kBlocksPerPass) {
    const int p1 = imin(p0 + kBlocksPerPass - 1, c.last_blk);
    for (int i = 0; i < c.count; ++i) {
      const int lo = imax(p0, c.chunks[i].first_blk), hi = imin(p1, c.chunks[i].last_blk);
      if (lo > hi) continue;
      ChunkBlock blocks[kBlocksPerPass];
      for (int blk = lo; blk <= hi; ++blk) {
        const int next = blk + kBlocksPerPass;
        const bool prefetch_next = next > prefetched && next <= c.last_blk;
        blocks[blk - lo] = chunk_block<T>(b, item, c.chunks[i], blk, prefetch_next ? next : -1);
      }
      for (int blk = lo; blk <= hi; ++blk) prefetched = imax(prefetched, imin(blk + kBlocksPerPass, c.last_blk));
      step(c.chunks[i], blocks, hi - lo + 1);
    }
  }
}

// A query's running value sum scaled by r (its softmax max moved up).
template <class V>
void scale_values(float* acc, int head_dim, float r) {
  const typename V::type rv = V::set1(r);
  for (int d = 0; d < head_dim; d += V::kWidth) V::store(acc + d, V::mul(V::load(acc + d), rv));
}

// The slots [first, last] of the chunk's block that query q sees (first > last: none).
inline void visible_slots(const ItemQueries& queries, int q, const ChunkBlock& cb, int& first, int& last) {
  first = imax(queries.lo[q] - cb.base, 0);
  last = imin(queries.hi[q] - cb.base, kBlock - 1);
}

// Raises a query's running softmax max to block_max where that is higher, rescaling its sum.
// Returns the factor its value sums take before this block's values are added (1: unchanged).
inline float raise_max_of_sum(State& st, float block_max) {
  if (!(block_max > st.max)) return 1.0f;  // a NaN max leaves the state as it is
  const float rescale = std::exp(st.max - block_max);  // 0 on the first visible block
  st.sum *= rescale;
  st.max = block_max;
  return rescale;
}

// raise_max_of_sum, with the value sums rescaled at once.
template <class V>
void raise_max(State& st, float block_max, int head_dim) {
  const float rescale = raise_max_of_sum(st, block_max);
  if (rescale != 1.0f) scale_values<V>(st.acc, head_dim, rescale);
}

// A block's softmax weights for a chunk's (up to Q) queries, and the factor each query's value
// sums take before they are added (set where `rescaled`; raise_max_of_sum).
template <int Q>
struct BlockWeights {
  alignas(64) float w[Q][kBlock];
  float rescale[Q];
  bool rescaled;
};

// states[q0 + c].acc += w[c][slot] x the slot's value over the chunk's visible slots of each of
// the n_blocks blocks in turn (each rescaled first where it says so), for each query c of the
// chunk: N vectors of kWidth dimensions at a time, each value vector loaded once for all of them
// and the sums kept in registers over the blocks. Several vectors give each query independent
// chains of fused multiply-adds over the slots: with one, a decode's four chains waited on the
// FMA latency and summed at half the FMA rate. Each dimension still adds its slots and blocks in
// order, rescaled where a block raised the max, so the sums are those of one block at a time.
// The chunk's query count QC is a template argument: with a run-time count GCC kept the sums on
// the stack. Only slots some query of the chunk can see: the others may hold another sequence's
// leftovers (blocks are reused uncleared), and 0 x NaN would still be NaN. kFullRuns: the step's
// vectors lie in full value runs (KvLayerView), whose slot stride is a constant (with it read
// from memory, bf16 decode ran ~15% slower). ahead: bytes ahead in each block's values (continuing
// into the next block's) whose lines are prefetched into L1 beside the loads; 0: the next block's
// lines at the same place, into L2.
template <class V, KvDType T, int QC, int N, bool kFullRuns, int Q>
void add_weighted_values_at(const KvLayerView& kv, const QueryChunk& ch, const ChunkBlock* cbs, int n_blocks,
                            const BlockWeights<Q>* bw, State* states, int d, int64_t ahead) {
  float* acc_of[QC];
  typename V::type acc[QC][N];
#pragma GCC unroll 8
  for (int c = 0; c < QC; ++c) {
    acc_of[c] = states[ch.q0 + c].acc + d;
#pragma GCC unroll 4
    for (int n = 0; n < N; ++n) acc[c][n] = V::load(acc_of[c] + n * V::kWidth);
  }
  // Vector n of a slot sits at at[n] + slot * width[n] from the block's start: kWidth divides
  // the run and the head size, so a vector never straddles two runs.
  constexpr int kRun = KvLayerView::value_run_of(T);
  int64_t at[N];
  int width[N];
#pragma GCC unroll 4
  for (int n = 0; n < N; ++n) {
    at[n] = kv.value_offset(0, 0, 0, d + n * V::kWidth);
    width[n] = kFullRuns ? kRun : kv.value_run_width(d + n * V::kWidth);
  }
  // Lanes that read a full bf16 run as its even and odd dimensions (V::kBf16Pairs, load_bf16_pair)
  // keep the sums in that order too, and put them back in order when the item is done; a step
  // over full runs starts at a run, so vectors n and n + 1 are a run's two halves.
  constexpr bool kPairs = V::kBf16Pairs && T == KvDType::BF16 && kFullRuns && N % 2 == 0;
  // Each 64-byte line of the next block once where vectors are narrower than a line.
  constexpr int kVectorsPerLine = 64 / (V::kWidth * int(kvsize<T>())) > 1 ? 64 / (V::kWidth * int(kvsize<T>())) : 1;
  // One (block, KV head)'s values are block_size * head_dim elements in a row.
  const int64_t block_bytes = int64_t(kv.head_dim) * kBlock * kvsize<T>();
  for (int j = 0; j < n_blocks; ++j) {
    const ChunkBlock& cb = cbs[j];
    const BlockWeights<Q>& b = bw[j];
    const char* own = element_address<T>(kv.values, cb.v0);
    if (b.rescaled)
#pragma GCC unroll 8
      for (int c = 0; c < QC; ++c) {
        const typename V::type r = V::set1(b.rescale[c]);
#pragma GCC unroll 4
        for (int n = 0; n < N; ++n) acc[c][n] = V::mul(acc[c][n], r);
      }
    for (int slot = cb.slot_lo; slot <= cb.slot_hi; ++slot) {
      if (ahead > 0) {
#pragma GCC unroll 4
        for (int n = 0; n < N; n += kVectorsPerLine) {
          const int64_t to = (at[n] + int64_t(slot) * width[n]) * kvsize<T>() + ahead;
          _mm_prefetch(to < block_bytes ? own + to : cb.next_values + (to - block_bytes), _MM_HINT_T0);
        }
      } else if (cb.prefetch_next) {
#pragma GCC unroll 4
        for (int n = 0; n < N; n += kVectorsPerLine)
          _mm_prefetch(cb.next_values + (at[n] + int64_t(slot) * width[n]) * kvsize<T>(), _MM_HINT_T1);
      }
      typename V::type v[N];
      if constexpr (kPairs) {
#pragma GCC unroll 4
        for (int n = 0; n < N; n += 2)
          V::load_bf16_pair(kv.values, cb.v0 + at[n] + int64_t(slot) * width[n], v[n], v[n + 1]);
      } else {
#pragma GCC unroll 4
        for (int n = 0; n < N; ++n)
          v[n] = V::template load_kv<T>(kv.values, cb.v0 + at[n] + int64_t(slot) * width[n]);
      }
#pragma GCC unroll 8
      for (int c = 0; c < QC; ++c) {
        const typename V::type w = V::set1(b.w[c][slot]);
#pragma GCC unroll 4
        for (int n = 0; n < N; ++n) acc[c][n] = V::fmadd(w, v[n], acc[c][n]);
      }
    }
  }
#pragma GCC unroll 8
  for (int c = 0; c < QC; ++c)
#pragma GCC unroll 4
    for (int n = 0; n < N; ++n) V::store(acc_of[c] + n * V::kWidth, acc[c][n]);
}

// Over the whole head: kMaxStep vectors of dimensions per pass over the slots where the head size
// allows (each query keeps that many sums in registers), then 2, then 1.
template <class V, KvDType T, int QC, int kMaxStep, int Q>
void add_weighted_values_of(const KvLayerView& kv, const QueryChunk& ch, const ChunkBlock* cbs, int n_blocks,
                            const BlockWeights<Q>* bw, State* states, int64_t ahead = 0) {
  const int D = kv.head_dim, full_runs = D / KvLayerView::value_run_of(T) * KvLayerView::value_run_of(T);
  int d = 0;
  if constexpr (kMaxStep > 2)
    for (; d + kMaxStep * V::kWidth <= full_runs; d += kMaxStep * V::kWidth)
      add_weighted_values_at<V, T, QC, kMaxStep, true>(kv, ch, cbs, n_blocks, bw, states, d, ahead);
  constexpr int kStep = 2 * V::kWidth;
  for (; d + kStep <= full_runs; d += kStep)
    add_weighted_values_at<V, T, QC, 2, true>(kv, ch, cbs, n_blocks, bw, states, d, ahead);
  for (; d + kStep <= D; d += kStep)
    add_weighted_values_at<V, T, QC, 2, false>(kv, ch, cbs, n_blocks, bw, states, d, ahead);
  if (d < D) add_weighted_values_at<V, T, QC, 1, false>(kv, ch, cbs, n_blocks, bw, states, d, ahead);
}

// Calls f(std::integral_constant<int, qc>{}) for a chunk's query count qc in [1, Q]: the kernels'
// loops over a chunk's queries take the count as a template argument.
template <int Q, class F>
void with_query_count(int qc, F&& f) {
  [&]<int... I>(std::integer_sequence<int, I...>) {
    ((qc == I + 1 ? f(std::integral_constant<int, I + 1>{}) : void()), ...);
  }(std::make_integer_sequence<int, Q>{});
}

// One block for a chunk of up to Q queries, its value sums already rescaled.
template <class V, KvDType T, int Q>
void add_weighted_values(const KvLayerView& kv, const QueryChunk& ch, const ChunkBlock& cb, const BlockWeights<Q>& bw,
                         State* states) {
  with_query_count<Q>(ch.qc, [&](auto qc) { add_weighted_values_of<V, T, qc(), 2>(kv, ch, &cb, 1, &bw, states); });
}

}  // namespace
}  // namespace tandem::cpu::attention
