// The AVX-512 attention item kernel for KV blocks of 16 keys. Keys are stored transposed within a
// block, so one dimension of the block's 16 keys is one register: the scores of a query against a
// whole block take head_dim FMAs with the query element broadcast, no horizontal sums. The online
// softmax then runs per block (one max, one rescale), and the values are accumulated 16 dimensions
// at a time for up to 8 queries sharing each loaded value vector.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/attention_item.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma")
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace tandem::cpu::attention {

namespace {

constexpr int kBlock = 16;

// Local helpers rather than std::min/max: templates instantiated under the AVX-512 target pragma
// could be emitted as weak symbols and picked by the linker for code that runs on any CPU.
inline int imin(int a, int b) { return a < b ? a : b; }
inline int imax(int a, int b) { return a > b ? a : b; }
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

template <KvDType T>
constexpr int64_t kvsize() {
  return T == KvDType::F32 ? 4 : 2;
}
template <KvDType T>
const char* element_address(const void* base, int64_t offset) {
  return static_cast<const char*>(base) + offset * kvsize<T>();
}

template <KvDType T>
void run(const AttentionBatch& b, const WorkItem& item, State* states) {
  const KvSequence& seq = b.sequences[size_t(item.seq)];
  const KvLayerView& kv = b.kv;
  const int D = kv.head_dim;
  ItemQueries queries;
  item_queries(b, item, states, queries);
  alignas(64) float weights[kQueries][kBlock];
  for (int q0 = 0; q0 < queries.count; q0 += kQueries) {
    const int qc = imin(kQueries, queries.count - q0);
    int chunk_lo = item.key_end, chunk_hi = -1;
    for (int c = 0; c < qc; ++c) {
      chunk_lo = imin(chunk_lo, queries.lo[q0 + c]);
      chunk_hi = imax(chunk_hi, queries.hi[q0 + c]);
    }
    const int last_blk = chunk_hi / kBlock;
    for (int blk = chunk_lo / kBlock; chunk_hi >= chunk_lo && blk <= last_blk; ++blk) {
      const int64_t phys = seq.blocks[blk - seq.first_logical_block];
      const int64_t k0 = kv.key_offset(phys, item.kv_head, 0, 0);
      const int64_t v0 = kv.value_offset(phys, item.kv_head, 0);
      // The next block's keys and values stream into L2 while this one is scored and summed, at
      // the offsets read here (blocks are pages of the cache, not one run the hardware follows).
      const int64_t next_phys = blk < last_blk ? seq.blocks[blk + 1 - seq.first_logical_block] : phys;
      const char* next_keys = element_address<T>(kv.keys, kv.key_offset(next_phys, item.kv_head, 0, 0));
      const char* next_values = element_address<T>(kv.values, kv.value_offset(next_phys, item.kv_head, 0));
      const bool prefetch_next = blk < last_blk;
      __m512 s[kQueries];
      for (int c = 0; c < kQueries; ++c) s[c] = _mm512_setzero_ps();
      for (int d = 0; d < D; ++d) {
        if (prefetch_next) _mm_prefetch(next_keys + int64_t(d) * kBlock * kvsize<T>(), _MM_HINT_T1);
        const __m512 keys = load16<T>(kv.keys, k0 + int64_t(d) * kBlock);
#pragma GCC unroll 8
        for (int c = 0; c < kQueries; ++c)
          if (c < qc) s[c] = _mm512_fmadd_ps(_mm512_set1_ps(queries.q[q0 + c][d]), keys, s[c]);
      }
      const int base = blk * kBlock;
      for (int c = 0; c < qc; ++c) {
        const int first = imax(queries.lo[q0 + c] - base, 0), last = imin(queries.hi[q0 + c] - base, kBlock - 1);
        if (first > last) {
          std::memset(weights[c], 0, sizeof weights[c]);
          continue;
        }
        const __mmask16 mask = __mmask16(((1u << (last + 1)) - 1) & ~((1u << first) - 1));
        State& st = states[q0 + c];
        const float block_max = _mm512_mask_reduce_max_ps(mask, s[c]);
        if (block_max > st.max) {
          const float rescale = std::exp(st.max - block_max);  // 0 on the first visible block
          st.sum *= rescale;
          const __m512 r = _mm512_set1_ps(rescale);
          for (int d = 0; d < D; d += 16) _mm512_storeu_ps(st.acc + d, _mm512_mul_ps(_mm512_loadu_ps(st.acc + d), r));
          st.max = block_max;
        }
        const __m512 e = _mm512_maskz_mov_ps(mask, exp_nonpositive(_mm512_sub_ps(s[c], _mm512_set1_ps(st.max))));
        st.sum += _mm512_reduce_add_ps(e);
        _mm512_store_ps(weights[c], e);
      }
      // Only slots some query of the chunk can see: the others may hold another sequence's
      // leftovers (blocks are reused uncleared), and 0 x NaN would still be NaN.
      const int slot_lo = imax(chunk_lo - base, 0), slot_hi = imin(chunk_hi - base, kBlock - 1);
      for (int d = 0; d < D; d += 16) {
        __m512 acc[kQueries];
        for (int c = 0; c < qc; ++c) acc[c] = _mm512_loadu_ps(states[q0 + c].acc + d);
        for (int slot = slot_lo; slot <= slot_hi; ++slot) {
          if (prefetch_next) _mm_prefetch(next_values + (int64_t(slot) * D + d) * kvsize<T>(), _MM_HINT_T1);
          const __m512 v = load16<T>(kv.values, v0 + int64_t(slot) * D + d);
#pragma GCC unroll 8
          for (int c = 0; c < kQueries; ++c)
            if (c < qc) acc[c] = _mm512_fmadd_ps(_mm512_set1_ps(weights[c][slot]), v, acc[c]);
        }
        for (int c = 0; c < qc; ++c) _mm512_storeu_ps(states[q0 + c].acc + d, acc[c]);
      }
    }
  }
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
