// CpuOps hands a norm or a gate to the pool only above a size (small ones run on the calling
// thread): on either side of it, and on pools of 1-3 threads, every row gets exactly what the
// kernel gives it called on that row alone, with strided rows and gate rows split between the
// threads inside a row.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/kernels.h"

namespace tandem::test {
namespace {

std::vector<float> random_values(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> value(-3.0f, 3.0f);
  std::vector<float> v(n);
  for (float& x : v) x = value(rng);
  return v;
}

TEST(CpuOps, NormsGiveEveryRowItsOwnResultOnAnyPool) {
  const cpu::KernelTable& k = cpu::active_kernels();
  std::mt19937 rng(21);
  constexpr int64_t kDim = 2560, kStride = 2600;
  const std::vector<float> weight = random_values(kDim, rng);
  for (int64_t rows : {8, 26, 40})  // 20480 values: serial; 66560 and 102400: pooled
    for (int threads : {1, 2, 3}) {
      const std::vector<float> x = random_values(size_t(rows * kStride), rng);
      std::vector<float> expected(size_t(rows * kDim)), got(size_t(rows * kDim), -1.0f);
      for (int64_t r = 0; r < rows; ++r) k.rms_norm(&expected[size_t(r * kDim)], &x[size_t(r * kStride)], weight.data(), kDim, 1e-6f);
      ThreadPool pool(threads);
      cpu::CpuOps ops(pool, k);
      ops.rms_norm(got.data(), kDim, x.data(), kStride, rows, kDim, weight.data(), 1e-6f);
      ASSERT_EQ(got, expected) << rows << " rows on " << threads << " threads";
    }
}

TEST(CpuOps, GatesGiveEveryValueItsOwnResultOnAnyPool) {
  const cpu::KernelTable& k = cpu::active_kernels();
  std::mt19937 rng(22);
  // 1000 values a row: the pool's runs of 256 values start and end inside rows.
  constexpr int64_t kWidth = 1000, kGateStride = 1024, kUpStride = 1016;
  for (int64_t rows : {8, 70, 131})  // 8000 values: serial; 70000 and 131000: pooled
    for (int threads : {1, 2, 3}) {
      const std::vector<float> gate = random_values(size_t(rows * kGateStride), rng);
      const std::vector<float> up = random_values(size_t(rows * kUpStride), rng);
      std::vector<float> expected = gate, got = gate;
      for (int64_t r = 0; r < rows; ++r) k.gelu_gate(&expected[size_t(r * kGateStride)], &up[size_t(r * kUpStride)], kWidth);
      ThreadPool pool(threads);
      cpu::CpuOps ops(pool, k);
      ops.gelu_gate(got.data(), kGateStride, up.data(), kUpStride, rows, kWidth);
      ASSERT_EQ(got, expected) << rows << " rows on " << threads << " threads";
    }
}


// store_kv spreads the (row, KV head) pairs of all sequences over the pool: each lands in its own
// slot of its own sequence's blocks, keys transposed and values in runs, whatever the pool size.
// Sequences of 1, 0, 5 and 21 rows (one starting mid-block, one from a later logical block as a
// sliding layer's does), 3 KV heads of 40 dimensions (a short last value run), f32 and bf16;
// nothing else in the pool is written, and an empty step writes nothing.
TEST(CpuOps, StoreKvPutsEveryRowAndHeadInItsSlot) {
  std::mt19937 rng(23);
  constexpr int kHeads = 3, kDim = 40, kBlock = 16, kBlocks = 8;
  struct Seq {
    int rows, first_position, first_logical_block;
    std::vector<int32_t> blocks;
  };
  const std::vector<Seq> seqs = {{1, 37, 0, {5, 2, 7}}, {0, 3, 0, {1}}, {5, 14, 0, {0, 3}}, {21, 40, 2, {6, 1, 4}}};
  int rows = 0;
  for (const Seq& s : seqs) rows += s.rows;
  const int64_t stride = kHeads * kDim + 3;
  const std::vector<float> k = random_values(size_t(rows * stride), rng), v = random_values(size_t(rows * stride), rng);
  for (KvDType dtype : {KvDType::F32, KvDType::BF16})
    for (int threads : {1, 2, 3}) {
      const size_t element = kv_dtype_size(dtype);
      std::vector<uint8_t> keys(size_t(kBlocks) * kHeads * kBlock * kDim * element, 0xff), values = keys;
      KvLayerView view;
      view.keys = keys.data();
      view.values = values.data();
      view.dtype = dtype;
      view.head_stride = int64_t(kBlock) * kDim;
      view.block_stride = kHeads * view.head_stride;
      view.block_size = kBlock;
      view.head_dim = kDim;
      view.kv_heads = kHeads;
      std::vector<std::vector<int32_t>> positions;
      std::vector<KvSequence> sequences;
      for (const Seq& s : seqs) {
        positions.emplace_back();
        for (int r = 0; r < s.rows; ++r) positions.back().push_back(s.first_position + r);
      }
      int first_row = 0;
      for (size_t i = 0; i < seqs.size(); ++i) {
        sequences.push_back({first_row, seqs[i].rows, positions[i].data(), seqs[i].blocks.data(),
                             seqs[i].first_logical_block});
        first_row += seqs[i].rows;
      }
      ThreadPool pool(threads);
      cpu::CpuOps ops(pool);
      ops.store_kv(view, {}, k.data(), stride, v.data(), stride);
      ASSERT_TRUE(std::all_of(keys.begin(), keys.end(), [](uint8_t b) { return b == 0xff; }));
      ops.store_kv(view, sequences, k.data(), stride, v.data(), stride);
      auto stored = [&](const std::vector<uint8_t>& pool_bytes, int64_t offset) {
        if (dtype == KvDType::F32) return reinterpret_cast<const float*>(pool_bytes.data())[offset];
        return bf16_to_f32(reinterpret_cast<const uint16_t*>(pool_bytes.data())[offset]);
      };
      auto expected = [&](float x) { return dtype == KvDType::F32 ? x : bf16_to_f32(f32_to_bf16(x)); };
      std::vector<bool> key_written(keys.size() / element), value_written(values.size() / element);
      for (const KvSequence& seq : sequences)
        for (int r = 0; r < seq.rows; ++r) {
          const int p = seq.positions[r];
          const int64_t block = seq.blocks[p / kBlock - seq.first_logical_block];
          for (int g = 0; g < kHeads; ++g)
            for (int d = 0; d < kDim; ++d) {
              const int64_t src = int64_t(seq.first_row + r) * stride + g * kDim + d;
              key_written[size_t(view.key_offset(block, g, p % kBlock, d))] = true;
              value_written[size_t(view.value_offset(block, g, p % kBlock, d))] = true;
              ASSERT_EQ(stored(keys, view.key_offset(block, g, p % kBlock, d)), expected(k[size_t(src)]))
                  << "row " << seq.first_row + r << " head " << g << " dim " << d << " on " << threads << " threads";
              ASSERT_EQ(stored(values, view.value_offset(block, g, p % kBlock, d)), expected(v[size_t(src)]))
                  << "row " << seq.first_row + r << " head " << g << " dim " << d << " on " << threads << " threads";
            }
        }
      for (size_t e = 0; e < key_written.size(); ++e)
        for (size_t b = 0; b < element; ++b) {
          ASSERT_TRUE(key_written[e] || keys[e * element + b] == 0xff) << "key element " << e << " written";
          ASSERT_TRUE(value_written[e] || values[e * element + b] == 0xff) << "value element " << e << " written";
        }
    }
}

}  // namespace
}  // namespace tandem::test
