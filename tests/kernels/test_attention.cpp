// Paged attention against a plain double-precision softmax over the same keys: every kernel the
// CPU has, causal and sliding windows, several sequences and row tiles, split key ranges for
// long single-row decodes, f32 and bf16 KV, grouped query heads, NaN in the slots never written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/attention.h"

namespace tandem::cpu {
namespace {

struct Case {
  int block_size, head_dim, kv_heads, group, window;
  KvDType dtype;
  std::vector<std::pair<int, int>> sequences;  // (rows, first position) per sequence
  int threads;
};

// head_major: each KV head's blocks side by side, as KvCache lays out its pools; else each block's
// heads side by side. The kernels must read either through KvLayerView's offsets.
void check(const Case& c, const KernelTable& kernels, bool head_major) {
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  const int D = c.head_dim, q_heads = c.kv_heads * c.group;
  int max_pos = 0, total_rows = 0;
  for (auto [rows, first] : c.sequences) {
    max_pos = std::max(max_pos, first + rows);
    total_rows += rows;
  }
  const int blocks_per_seq = (max_pos + c.block_size - 1) / c.block_size;
  const int n_seq = int(c.sequences.size());
  KvLayerView kv;
  kv.dtype = c.dtype;
  kv.block_size = c.block_size;
  kv.head_dim = D;
  kv.kv_heads = c.kv_heads;
  if (head_major) {
    kv.block_stride = int64_t(c.block_size) * D;
    kv.head_stride = kv.block_stride * blocks_per_seq * n_seq;
  } else {
    kv.head_stride = int64_t(c.block_size) * D;
    kv.block_stride = kv.head_stride * c.kv_heads;
  }
  const size_t elems = size_t(c.block_size) * D * c.kv_heads * size_t(blocks_per_seq * n_seq);
  // Slots no position writes hold NaN, as a reused block may hold another sequence's leftovers:
  // no query may read them, even with weight 0.
  std::vector<float> keys_f(elems, NAN), values_f(elems, NAN);
  std::vector<uint16_t> keys_h(elems, 0x7fc0), values_h(elems, 0x7fc0);
  // Logical key value (seq, pos, head, d), kept in float for the expected result (rounded to bf16
  // when the cache is bf16, so both sides see the same numbers).
  auto round = [&](float v) { return c.dtype == KvDType::BF16 ? bf16_to_f32(f32_to_bf16(v)) : v; };
  std::vector<float> key_of(size_t(n_seq) * max_pos * c.kv_heads * D), value_of(key_of.size());
  std::vector<std::vector<int32_t>> tables(static_cast<size_t>(n_seq));
  for (int s = 0; s < n_seq; ++s)
    for (int b = 0; b < blocks_per_seq; ++b) tables[size_t(s)].push_back((b * n_seq + s + 3) % (blocks_per_seq * n_seq));
  for (int s = 0; s < n_seq; ++s)
    for (int p = 0; p < max_pos; ++p)
      for (int g = 0; g < c.kv_heads; ++g)
        for (int d = 0; d < D; ++d) {
          const size_t at = ((size_t(s) * max_pos + p) * c.kv_heads + g) * D + d;
          key_of[at] = round(normal(rng));
          value_of[at] = round(normal(rng));
          const int64_t block = tables[size_t(s)][size_t(p / c.block_size)];
          const int64_t ko = kv.key_offset(block, g, p % c.block_size, d);
          const int64_t vo = kv.value_offset(block, g, p % c.block_size, d);
          keys_f[size_t(ko)] = key_of[at];
          values_f[size_t(vo)] = value_of[at];
          keys_h[size_t(ko)] = f32_to_bf16(key_of[at]);
          values_h[size_t(vo)] = f32_to_bf16(value_of[at]);
        }
  kv.keys = c.dtype == KvDType::F32 ? static_cast<void*>(keys_f.data()) : keys_h.data();
  kv.values = c.dtype == KvDType::F32 ? static_cast<void*>(values_f.data()) : values_h.data();

  std::vector<float> q(size_t(total_rows) * q_heads * D), out(q.size(), -1.0f);
  for (float& v : q) v = normal(rng);
  std::vector<std::vector<int32_t>> positions(static_cast<size_t>(n_seq));
  std::vector<KvSequence> seqs;
  int row = 0;
  for (int s = 0; s < n_seq; ++s) {
    auto [rows, first] = c.sequences[size_t(s)];
    for (int r = 0; r < rows; ++r) positions[size_t(s)].push_back(first + r);
    KvSequence ks;
    ks.first_row = row;
    ks.rows = rows;
    ks.positions = positions[size_t(s)].data();
    ks.blocks = tables[size_t(s)].data();
    seqs.push_back(ks);
    row += rows;
  }
  AttentionBatch b;
  b.q = q.data();
  b.q_stride = int64_t(q_heads) * D;
  b.out = out.data();
  b.out_stride = b.q_stride;
  b.q_heads = q_heads;
  b.group = c.group;
  b.window = c.window;
  b.kv = kv;
  b.sequences = seqs;
  ThreadPool pool(c.threads);
  std::vector<float> scratch;
  paged_attention(pool, kernels, b, scratch);

  for (int s = 0; s < n_seq; ++s)
    for (int r = 0; r < seqs[size_t(s)].rows; ++r) {
      const int p = positions[size_t(s)][size_t(r)];
      const int64_t out_row = seqs[size_t(s)].first_row + r;
      for (int h = 0; h < q_heads; ++h) {
        const int g = h / c.group;
        const float* qv = q.data() + out_row * b.q_stride + h * D;
        std::vector<double> scores;
        const int lo = c.window > 0 ? std::max(0, p - c.window + 1) : 0;
        for (int j = lo; j <= p; ++j) {
          double dot = 0;
          for (int d = 0; d < D; ++d) dot += double(qv[d]) * key_of[((size_t(s) * max_pos + j) * c.kv_heads + g) * D + d];
          scores.push_back(dot);
        }
        const double mx = *std::max_element(scores.begin(), scores.end());
        double total = 0;
        for (double& v : scores) total += (v = std::exp(v - mx));
        for (int d = 0; d < D; ++d) {
          double expected = 0;
          for (int j = lo; j <= p; ++j)
            expected += scores[size_t(j - lo)] / total * value_of[((size_t(s) * max_pos + j) * c.kv_heads + g) * D + d];
          ASSERT_NEAR(out[size_t(out_row * b.q_stride + h * D + d)], expected, 2e-5)
              << isa_name(kernels.isa) << " seq " << s << " pos " << p << " head " << h << " dim " << d;
        }
      }
    }
}

TEST(PagedAttention, MatchesPlainSoftmaxOnEveryIsa) {
  const std::vector<Case> cases = {
      {16, 32, 2, 2, 0, KvDType::F32, {{1, 0}, {20, 5}, {3, 40}}, 2},      // causal, row tiles, several seqs
      {16, 64, 1, 4, 16, KvDType::F32, {{37, 0}, {1, 70}}, 2},             // sliding window, GQA 4
      {16, 48, 2, 1, 7, KvDType::BF16, {{9, 30}}, 1},                      // odd window, bf16 KV
      {16, 32, 1, 2, 0, KvDType::F32, {{1, 900}}, 2},                      // long single-row decode: split keys
      {16, 16, 1, 8, 0, KvDType::BF16, {{1, 700}, {1, 5}}, 3},             // split with 3 threads
      {8, 24, 2, 2, 5, KvDType::F32, {{12, 3}}, 2},                        // other block size: generic path
      // Head size 40: the AVX2 value sums' two-vector steps and their one-vector tail (AVX-512 CPUs
      // run it on the AVX2 kernel too); GQA 3: query chunks of 3 (decode) and 4, 4, 4, 3 (5 rows).
      {16, 40, 1, 3, 0, KvDType::BF16, {{5, 20}, {1, 300}}, 2},
      {16, 40, 2, 3, 9, KvDType::F32, {{1, 50}, {6, 0}}, 2},
      // Rows deep into the context: items of several query chunks walk many blocks in passes.
      {16, 32, 1, 4, 0, KvDType::F32, {{11, 150}}, 2},
      {16, 32, 2, 2, 40, KvDType::BF16, {{10, 200}, {3, 90}}, 2},
      {16, 32, 2, 2, 100, KvDType::BF16, {{10, 300}}, 2},                  // passes from a window's start
      // AVX-512 chunks of 8 queries: 8 + 7 and 3 (GQA 3, f32, head 48: two vectors and a tail), 5.
      {16, 48, 1, 3, 0, KvDType::F32, {{5, 20}, {1, 300}}, 2},
      {16, 48, 1, 5, 0, KvDType::BF16, {{1, 200}, {2, 40}}, 1},
      // AVX-512 passes scored up to 4 blocks at a time with 4 queries (2 with 8), their values
      // added 64 dimensions at a time (bf16: runs read as even and odd halves), a pass cut short
      // at the end (26 blocks) and a window starting inside a pass.
      {16, 128, 2, 4, 0, KvDType::BF16, {{1, 400}, {9, 100}}, 2},
      {16, 64, 2, 4, 37, KvDType::BF16, {{1, 300}, {12, 250}}, 2},
      {16, 64, 1, 4, 0, KvDType::F32, {{1, 250}, {3, 60}}, 1},
  };
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx2Vnni, Isa::Avx512, Isa::Avx512Amx}) {
    if (!isa_supported(isa)) continue;
    for (size_t i = 0; i < cases.size(); ++i)
      for (bool head_major : {false, true}) {
        SCOPED_TRACE(std::string(isa_name(isa)) + ", case " + std::to_string(i) + (head_major ? ", head-major" : ""));
        check(cases[i], kernels_for(isa), head_major);
      }
  }
}

// The value layout the kernels read (KvLayerView): each (slot, dimension) of a block's KV head has
// its own element inside the head's block_size * head_dim, and a run's slots are side by side:
// slot s + 1 follows slot s's dimensions of the run, which are consecutive.
TEST(KvLayerView, ValuesOfABlockFillItInRunsOfSlots) {
  for (KvDType dtype : {KvDType::F32, KvDType::BF16})
    for (int head_dim : {8, 24, 40, 48, 64, 256, 512})
      for (int block_size : {8, 16}) {
        SCOPED_TRACE(std::string(kv_dtype_name(dtype)) + ", head " + std::to_string(head_dim) + ", block " +
                     std::to_string(block_size));
        KvLayerView kv;
        kv.dtype = dtype;
        kv.head_dim = head_dim;
        kv.block_size = block_size;
        kv.kv_heads = 2;
        kv.block_stride = int64_t(block_size) * head_dim;
        kv.head_stride = kv.block_stride * 5;  // head-major, 5 blocks per head
        const int64_t base = kv.value_offset(3, 1, 0, 0);
        ASSERT_EQ(base, 3 * kv.block_stride + kv.head_stride);
        std::vector<int> hits(size_t(block_size) * head_dim, 0);
        for (int s = 0; s < block_size; ++s)
          for (int d = 0; d < head_dim; ++d) {
            const int64_t at = kv.value_offset(3, 1, s, d) - base;
            ASSERT_GE(at, 0);
            ASSERT_LT(at, int64_t(hits.size()));
            ++hits[size_t(at)];
            const int run = kv.value_run(), width = std::min(run, head_dim - d / run * run);
            EXPECT_EQ(kv.value_run_width(d), width);
            if (d % run + 1 < width) {
              EXPECT_EQ(kv.value_offset(3, 1, s, d + 1), kv.value_offset(3, 1, s, d) + 1);
            }
            if (s + 1 < block_size) {
              EXPECT_EQ(kv.value_offset(3, 1, s + 1, d), kv.value_offset(3, 1, s, d) + width);
            }
          }
        for (int h : hits) ASSERT_EQ(h, 1);
        EXPECT_EQ(kv.value_run() * int(kv_dtype_size(dtype)), 64);
      }
}

}  // namespace
}  // namespace tandem::cpu
