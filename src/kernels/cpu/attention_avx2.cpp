// The AVX2 attention item kernel: attention_avx512.cpp's algorithm (read that first) at 8 lanes.
// A block's 16 transposed keys are two registers per dimension, so 4 queries share each pass over
// a block's keys (8 score accumulators); the masked max, the exponentials and their sum run on the
// block's 16 scores as two vectors.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>

#include "kernels/cpu/attention_item.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma")
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "kernels/cpu/attention_blocks.h"

namespace tandem::cpu::attention {

namespace {

constexpr int kQueries = 4;  // queries sharing a pass over the keys

// exp(x) for x <= 0, as in attention_avx512.cpp, with 2^n put into the exponent bits. Inputs are
// clamped at -86 so that the exponent stays normal (exp(-86) ~ 4e-38: nothing next to the block's
// maximum, whose weight is 1).
inline __m256 exp_nonpositive(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-86.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187045e-06f), r);
  __m256 p = _mm256_set1_ps(1.0f / 720.0f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i scale = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
  return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), scale));
}

template <KvDType T>
inline __m256 load8(const void* base, int64_t offset);
template <>
inline __m256 load8<KvDType::F32>(const void* base, int64_t offset) {
  return _mm256_loadu_ps(static_cast<const float*>(base) + offset);
}
template <>
inline __m256 load8<KvDType::BF16>(const void* base, int64_t offset) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + offset));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// 8 floats for attention_blocks.h.
struct Lanes {
  using type = __m256;
  static constexpr int kWidth = 8;
  static constexpr bool kBf16Pairs = false;
  static __m256 load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
  static __m256 set1(float f) { return _mm256_set1_ps(f); }
  static __m256 mul(__m256 a, __m256 b) { return _mm256_mul_ps(a, b); }
  static __m256 fmadd(__m256 a, __m256 b, __m256 c) { return _mm256_fmadd_ps(a, b, c); }
  template <KvDType T>
  static __m256 load_kv(const void* base, int64_t offset) { return load8<T>(base, offset); }
};

// Lanes [first, last] of a block's 16 (half h: lanes 8h..8h+7) as an all-ones mask.
inline __m256 lane_mask(int first, int last, int h) {
  const __m256i lane = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(8 * h));
  const __m256i in = _mm256_andnot_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32(first), lane),
                                         _mm256_cmpgt_epi32(_mm256_set1_epi32(last + 1), lane));
  return _mm256_castsi256_ps(in);
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The scores of a chunk's QC queries against one block's 16 keys (two vectors per query): each
// dimension's keys loaded once for all of them. QC is a template argument so that the loop carries
// no per-query tests and the query pointers stay in registers (with both, decode at 4096 keys
// scored and summed 10-20% faster on one Zen 3 core; the sums are the same).
template <KvDType T, int QC>
void block_scores(const KvLayerView& kv, const ItemQueries& queries, int q0, const ChunkBlock& cb,
                  __m256 (&out)[kQueries][2]) {
  const float* q[QC];
  __m256 s[QC][2];  // not `out`: __m256 may alias the query floats, and its sums would go through memory
#pragma GCC unroll 4
  for (int c = 0; c < QC; ++c) {
    q[c] = queries.q[q0 + c];
    s[c][0] = s[c][1] = _mm256_setzero_ps();
  }
  const int D = kv.head_dim;
  const char* keys = element_address<T>(kv.keys, cb.k0);
  for (int d = 0; d < D; ++d, keys += kBlock * kvsize<T>()) {
    if (cb.prefetch_next) _mm_prefetch(cb.next_keys + int64_t(d) * kBlock * kvsize<T>(), _MM_HINT_T1);
    const __m256 keys_lo = load8<T>(keys, 0);
    const __m256 keys_hi = load8<T>(keys, 8);
#pragma GCC unroll 4
    for (int c = 0; c < QC; ++c) {
      const __m256 qd = _mm256_broadcast_ss(q[c] + d);
      s[c][0] = _mm256_fmadd_ps(qd, keys_lo, s[c][0]);
      s[c][1] = _mm256_fmadd_ps(qd, keys_hi, s[c][1]);
    }
  }
#pragma GCC unroll 4
  for (int c = 0; c < QC; ++c) {
    out[c][0] = s[c][0];
    out[c][1] = s[c][1];
  }
}

template <KvDType T>
void run(const AttentionBatch& b, const WorkItem& item, State* states) {
  const KvLayerView& kv = b.kv;
  const int D = kv.head_dim;
  ItemQueries queries;
  item_queries(b, item, states, queries);
  alignas(32) float scores[kBlock];
  BlockWeights<kQueries> bw;
  bw.rescaled = false;  // raise_max rescales at once
  auto& weights = bw.w;
  for_each_chunk_block<T, kQueries>(b, item, queries, [&](const QueryChunk& ch, const ChunkBlock& cb) {
    const int q0 = ch.q0, qc = ch.qc;
    __m256 s[kQueries][2];
    with_query_count<kQueries>(qc, [&](auto n) { block_scores<T, n()>(kv, queries, q0, cb, s); });
    for (int c = 0; c < qc; ++c) {
      int first, last;
      visible_slots(queries, q0 + c, cb, first, last);
      if (first > last) {
        std::memset(weights[c], 0, sizeof weights[c]);
        continue;
      }
      _mm256_store_ps(scores, s[c][0]);
      _mm256_store_ps(scores + 8, s[c][1]);
      float block_max = scores[first];
      for (int j = first + 1; j <= last; ++j) block_max = scores[j] > block_max ? scores[j] : block_max;
      State& st = states[q0 + c];
      raise_max<Lanes>(st, block_max, D);
      const __m256 m = _mm256_set1_ps(st.max);
      const __m256 e0 = _mm256_and_ps(lane_mask(first, last, 0), exp_nonpositive(_mm256_sub_ps(s[c][0], m)));
      const __m256 e1 = _mm256_and_ps(lane_mask(first, last, 1), exp_nonpositive(_mm256_sub_ps(s[c][1], m)));
      st.sum += hsum(_mm256_add_ps(e0, e1));
      _mm256_store_ps(weights[c], e0);
      _mm256_store_ps(weights[c] + 8, e1);
    }
    add_weighted_values<Lanes, T, kQueries>(kv, ch, cb, bw, states);
  });
}

}  // namespace

bool avx2_item_supported(const KvLayerView& kv) { return kv.block_size == kBlock && kv.head_dim % 8 == 0; }

void avx2_item(const KernelTable&, const AttentionBatch& b, const WorkItem& item, State* states, float*) {
  if (b.kv.dtype == KvDType::F32) run<KvDType::F32>(b, item, states);
  else run<KvDType::BF16>(b, item, states);
}

}  // namespace tandem::cpu::attention

#pragma GCC diagnostic pop
#pragma GCC pop_options
