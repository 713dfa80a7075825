// The AVX-512 attention item kernel for KV blocks of 16 keys. Keys are stored transposed within a
// block, so one dimension of the block's 16 keys is one register: the scores of a query against a
// whole block take head_dim FMAs with the query element broadcast, no horizontal sums. The online
// softmax then runs per block (one max, one rescale), and the values are accumulated 32 dimensions
// (a 16-dimension tail) at a time for up to 8 queries sharing each loaded value vector.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>

#include "kernels/cpu/attention_item.h"

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
};

// The scores of a chunk's QC queries against one block's 16 keys: each dimension's keys loaded
// once for all of them, as in attention_avx2.cpp (QC a template argument, the sums in locals).
template <KvDType T, int QC>
void block_scores(const KvLayerView& kv, const ItemQueries& queries, int q0, const ChunkBlock& cb,
                  __m512 (&out)[kQueries]) {
  const float* q[QC];
  __m512 s[QC];
#pragma GCC unroll 8
  for (int c = 0; c < QC; ++c) {
    q[c] = queries.q[q0 + c];
    s[c] = _mm512_setzero_ps();
  }
  const int D = kv.head_dim;
  const char* keys = element_address<T>(kv.keys, cb.k0);
  for (int d = 0; d < D; ++d, keys += kBlock * kvsize<T>()) {
    if (cb.prefetch_next) _mm_prefetch(cb.next_keys + int64_t(d) * kBlock * kvsize<T>(), _MM_HINT_T1);
    const __m512 k = load16<T>(keys, 0);
#pragma GCC unroll 8
    for (int c = 0; c < QC; ++c) s[c] = _mm512_fmadd_ps(_mm512_set1_ps(q[c][d]), k, s[c]);
  }
#pragma GCC unroll 8
  for (int c = 0; c < QC; ++c) out[c] = s[c];
}

template <KvDType T>
void run(const AttentionBatch& b, const WorkItem& item, State* states) {
  const KvLayerView& kv = b.kv;
  const int D = kv.head_dim;
  ItemQueries queries;
  item_queries(b, item, states, queries);
  alignas(64) float weights[kQueries][kBlock];
  for_each_chunk_block<T, kQueries>(b, item, queries, [&](const QueryChunk& ch, const ChunkBlock& cb) {
    const int q0 = ch.q0, qc = ch.qc;
    __m512 s[kQueries];
    with_query_count<kQueries>(qc, [&](auto n) { block_scores<T, n()>(kv, queries, q0, cb, s); });
    for (int c = 0; c < qc; ++c) {
      int first, last;
      visible_slots(queries, q0 + c, cb, first, last);
      if (first > last) {
        std::memset(weights[c], 0, sizeof weights[c]);
        continue;
      }
      const __mmask16 mask = __mmask16(((1u << (last + 1)) - 1) & ~((1u << first) - 1));
      State& st = states[q0 + c];
      raise_max<Lanes>(st, _mm512_mask_reduce_max_ps(mask, s[c]), D);
      const __m512 e = _mm512_maskz_mov_ps(mask, exp_nonpositive(_mm512_sub_ps(s[c], _mm512_set1_ps(st.max))));
      st.sum += _mm512_reduce_add_ps(e);
      _mm512_store_ps(weights[c], e);
    }
    add_weighted_values<Lanes, T, kQueries>(kv, ch, cb, weights, states);
  });
}

}  // namespace

bool avx512_item_supported(const KvLayerView& kv) { return kv.block_size == kBlock && kv.head_dim % 16 == 0; }

void avx512_item(const KernelTable&, const AttentionBatch& b, const WorkItem& item, State* states, float*) {
  if (b.kv.dtype == KvDType::F32) run<KvDType::F32>(b, item, states);
  else run<KvDType::BF16>(b, item, states);
}

}  // namespace tandem::cpu::attention

#pragma GCC diagnostic pop
#pragma GCC pop_options
