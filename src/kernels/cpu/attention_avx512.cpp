// The AVX-512 attention item kernel for KV blocks of 16 keys. Keys are stored transposed within a
// block, so one dimension of the block's 16 keys is one register: the scores of a query against a
// whole block take head_dim FMAs with the query element broadcast, no horizontal sums, and up to
// four blocks are scored in one walk over the dimensions. The online softmax then runs per block
// (one max, one rescale), and each pass's values are added with the sums in registers across its
// blocks, 64 dimensions at a time for up to 4 queries (32 for up to 8) sharing each loaded value
// vector. Every sum adds in the order of one block at a time, so the results do not depend on
// how blocks are grouped.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>

#include "kernels/cpu/attention_item.h"
#include "kernels/cpu/prefetch_tuning.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma")
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "kernels/cpu/attention_blocks.h"

namespace tandem::cpu::attention {

namespace {

constexpr int kQueries = 8;  // queries sharing a pass over the keys

// exp(x) for x <= 0 (scores minus their running max): 2^n * p(r), r = x - n ln2 in [-ln2/2, ln2/2],
// p a degree-6 polynomial; relative error ~2e-7. Very negative inputs give 0.
inline __m512 exp_nonpositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

template <KvDType T>
inline __m512 load16(const void* base, int64_t offset);
template <>
inline __m512 load16<KvDType::F32>(const void* base, int64_t offset) {
  return _mm512_loadu_ps(static_cast<const float*>(base) + offset);
}
template <>
inline __m512 load16<KvDType::BF16>(const void* base, int64_t offset) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(base) + offset));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// 16 floats for attention_blocks.h.
struct Lanes {
  using type = __m512;
  static constexpr int kWidth = 16;
  static __m512 load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
  static __m512 set1(float f) { return _mm512_set1_ps(f); }
  static __m512 mul(__m512 a, __m512 b) { return _mm512_mul_ps(a, b); }
  static __m512 fmadd(__m512 a, __m512 b, __m512 c) { return _mm512_fmadd_ps(a, b, c); }
  template <KvDType T>
  static __m512 load_kv(const void* base, int64_t offset) { return load16<T>(base, offset); }
  // A run of 32 bf16 values as floats: its even dimensions and its odd ones, from one load by a
  // shift and a mask (in dimension order it takes two widening shuffles and two shifts).
  static constexpr bool kBf16Pairs = true;
  static void load_bf16_pair(const void* base, int64_t offset, __m512& even, __m512& odd) {
    const __m512i v = _mm512_loadu_si512(static_cast<const uint16_t*>(base) + offset);
    even = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    odd = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(int(0xffff0000u))));
  }
};

// The value sums of a bf16 cache's full runs back in dimension order from the even-then-odd
// order Lanes::load_bf16_pair leaves them in.
void bf16_pairs_in_order(const KvLayerView& kv, State* states, int count) {
  const int full_runs = kv.head_dim / 32 * 32;
  const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  for (int i = 0; i < count; ++i)
    for (int d = 0; d < full_runs; d += 32) {
      float* acc = states[i].acc + d;
      const __m512 even = _mm512_loadu_ps(acc), odd = _mm512_loadu_ps(acc + 16);
      _mm512_storeu_ps(acc, _mm512_permutex2var_ps(even, lo, odd));
      _mm512_storeu_ps(acc + 16, _mm512_permutex2var_ps(even, hi, odd));
    }
}

// The scores of a chunk's QC queries against NB blocks' 16 keys each: per dimension, each block's
// keys loaded once and each query element broadcast once for all of them. Several blocks give the
// loop NB x QC independent sums (one block left a decode's 4 queries waiting on the FMA latency)
// and fewer loads per FMA; each score still adds its dimensions in order, so the sums are those of
// one block at a time. qt: the chunk's queries dimension by dimension (QC floats each), one
// pointer for all of them. QC and NB are template arguments, so that the sums stay in registers.
// ahead: bytes ahead in each block's keys (continuing into the next block's) whose lines are
// prefetched into L1 beside the loads; 0: the next block's lines at the same place, into L2
// (kPrefetch: some block has a next one).
template <KvDType T, int QC, int NB, bool kPrefetch>
void group_scores_of(const KvLayerView& kv, const float* qt, const ChunkBlock* cbs, int64_t ahead,
                     __m512 (*out)[kQueries]) {
  __m512 s[NB][QC];
  const char* keys[NB];
  const char* next[NB];  // a block without a next one touches its own lines again: cheaper than a test
#pragma GCC unroll 4
  for (int j = 0; j < NB; ++j) {
    keys[j] = element_address<T>(kv.keys, cbs[j].k0);
    next[j] = cbs[j].prefetch_next ? cbs[j].next_keys : keys[j];
#pragma GCC unroll 8
    for (int c = 0; c < QC; ++c) s[j][c] = _mm512_setzero_ps();
  }
  constexpr int64_t kLine = kBlock * kvsize<T>();  // one dimension of a block's keys
  const int64_t end = kv.head_dim * kLine;
  for (int64_t at = 0; at < end; at += kLine, qt += QC) {
    __m512 k[NB];
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) {
      if (ahead > 0) {
        const int64_t to = at + ahead;
        _mm_prefetch(to < end ? keys[j] + to : next[j] + (to - end), _MM_HINT_T0);
      } else if constexpr (kPrefetch) {
        _mm_prefetch(next[j] + at, _MM_HINT_T1);
      }
      k[j] = load16<T>(keys[j] + at, 0);
    }
#pragma GCC unroll 8
    for (int c = 0; c < QC; ++c) {
      const __m512 qd = _mm512_set1_ps(qt[c]);
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) s[j][c] = _mm512_fmadd_ps(qd, k[j], s[j][c]);
    }
  }
#pragma GCC unroll 4
  for (int j = 0; j < NB; ++j)
#pragma GCC unroll 8
    for (int c = 0; c < QC; ++c) out[j][c] = s[j][c];
}

template <KvDType T, int QC, int NB>
void group_scores(const KvLayerView& kv, const float* qt, const ChunkBlock* cbs, int64_t ahead,
                  __m512 (*out)[kQueries]) {
  bool prefetch = false;
  for (int j = 0; j < NB; ++j) prefetch |= cbs[j].prefetch_next;
  if (prefetch) group_scores_of<T, QC, NB, true>(kv, qt, cbs, ahead, out);
  else group_scores_of<T, QC, NB, false>(kv, qt, cbs, ahead, out);
}

template <KvDType T>
void run(const AttentionBatch& b, const WorkItem& item, State* states, float* scratch) {
  const KvLayerView& kv = b.kv;
  const int D = kv.head_dim;
  ItemQueries queries;
  item_queries(b, item, states, queries);
  // Every chunk's queries dimension by dimension, once per item (a prefill item's chunks take
  // turns on each pass of blocks).
  float* qt = scratch;
  for (int q0 = 0; q0 < queries.count; q0 += kQueries) {
    const int qc = queries.count - q0 < kQueries ? queries.count - q0 : kQueries;
    for (int c = 0; c < qc; ++c)
      for (int d = 0; d < D; ++d) qt[int64_t(q0) * D + d * qc + c] = queries.q[q0 + c][d];
  }
  auto transposed = [&](const QueryChunk& ch) { return qt + int64_t(ch.q0) * D; };
  // Where prefetch_tuning() says so, the key and value streams of a decode item (one chunk of
  // queries, which reads each block once) prefetch their own lines a fixed number of elements
  // ahead (docs/kernels.md, "Session 43"). Prefill items' chunks read each block in turn, the
  // later ones from cache, and keep the next block's prefetch.
  const int64_t ahead =
      queries.count <= kQueries ? detail::prefetch_tuning().attention_ahead_elements * kvsize<T>() : 0;
  // One block's softmax step for the chunk's queries: their weights for its slots, and the
  // rescales its values wait for (they are added after the pass's scores).
  auto block_weights = [&](const QueryChunk& ch, const ChunkBlock& cb, const __m512* s, BlockWeights<kQueries>& bw) {
    bw.rescaled = false;
    for (int c = 0; c < ch.qc; ++c) {
      int first, last;
      visible_slots(queries, ch.q0 + c, cb, first, last);
      bw.rescale[c] = 1.0f;
      if (first > last) {
        std::memset(bw.w[c], 0, sizeof bw.w[c]);
        continue;
      }
      const __mmask16 mask = __mmask16(((1u << (last + 1)) - 1) & ~((1u << first) - 1));
      State& st = states[ch.q0 + c];
      bw.rescale[c] = raise_max_of_sum(st, _mm512_mask_reduce_max_ps(mask, s[c]));
      bw.rescaled |= bw.rescale[c] != 1.0f;
      const __m512 e = _mm512_maskz_mov_ps(mask, exp_nonpositive(_mm512_sub_ps(s[c], _mm512_set1_ps(st.max))));
      st.sum += _mm512_reduce_add_ps(e);
      _mm512_store_ps(bw.w[c], e);
    }
  };
  BlockWeights<kQueries> bw[kBlocksPerPass];
  for_each_chunk_pass<T, kQueries>(b, item, queries, [&](const QueryChunk& ch, const ChunkBlock* cbs, int n) {
    with_query_count<kQueries>(ch.qc, [&](auto qc) {
      // Blocks per walk over the keys and dimensions per pass over the values: as many as 16 sums
      // in registers allow.
      constexpr int QC = qc(), NB = QC <= 4 ? 4 : 2, kValueStep = QC <= 4 ? 4 : 2;
      __m512 s[kBlocksPerPass][kQueries];
      for (int g = 0; g < n; g += NB)
        with_query_count<NB>(n - g < NB ? n - g : NB,
                             [&](auto m) { group_scores<T, QC, m()>(kv, transposed(ch), cbs + g, ahead, s + g); });
      for (int j = 0; j < n; ++j) block_weights(ch, cbs[j], s[j], bw[j]);
      add_weighted_values_of<Lanes, T, QC, kValueStep>(kv, ch, cbs, n, bw, states, ahead);
    });
  });
  if constexpr (T == KvDType::BF16) bf16_pairs_in_order(kv, states, queries.count);
}

}  // namespace

bool avx512_item_supported(const KvLayerView& kv) { return kv.block_size == kBlock && kv.head_dim % 16 == 0; }

void avx512_item(const KernelTable&, const AttentionBatch& b, const WorkItem& item, State* states, float* scratch) {
  if (b.kv.dtype == KvDType::F32) run<KvDType::F32>(b, item, states, scratch);
  else run<KvDType::BF16>(b, item, states, scratch);
}

}  // namespace tandem::cpu::attention

#pragma GCC diagnostic pop
#pragma GCC pop_options
