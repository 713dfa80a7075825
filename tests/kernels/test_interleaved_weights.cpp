// WeightLayout::Interleaved (Q8/Q4 and BF16/F16): the rearrangement keeps every value
// (row_to_float reads it back through an independent index computation), codes land where
// kernels/weight.h says, and every ISA table multiplies interleaved weights as accurately as plain
// ones (tables without an interleaved kernel fall back to the scalar one).
#include <gtest/gtest.h>

#include <cstring>
#include <initializer_list>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/prefetch_tuning.h"
#include "matrix_factory.h"

namespace tandem::test {
namespace {

// The plain matrix with its scales right after its codes, in one buffer, as the resident loader
// places them (the interleaved layout needs that).
OwnedMatrix packed_copy(const OwnedMatrix& plain) {
  const WeightMatrix& v = plain.view;
  OwnedMatrix m;
  m.view = v;
  const size_t codes = size_t(v.rows * v.row_stride), scales = v.scales ? size_t(v.rows * v.scale_stride) : 0;
  m.data.assign(codes + scales, 0);
  std::memcpy(m.data.data(), v.data, codes);
  if (v.scales) std::memcpy(m.data.data() + codes, v.scales, scales);
  m.view.data = m.data.data();
  m.view.scales = v.scales ? m.data.data() + codes : nullptr;
  return m;
}

OwnedMatrix interleaved_copy(const OwnedMatrix& plain) {
  const OwnedMatrix packed = packed_copy(plain);
  OwnedMatrix m = packed;
  interleave_row_groups(packed.view, packed.view.data, packed.view.scales, m.data.data(), 0,
                        interleaved_group_count(packed.view));
  m.view.data = m.data.data();
  if (m.view.scales) m.view.scales = m.data.data() + m.view.rows * m.view.row_stride;
  m.view.layout = WeightLayout::Interleaved;
  return m;
}

TEST(InterleavedWeights, RowsReadBackUnchanged) {
  std::mt19937 rng(5);
  for (WeightFormat f : {WeightFormat::Q8, WeightFormat::Q4})
    for (int64_t cols : {512, 1536}) {
      const OwnedMatrix plain = random_matrix(f, 7, cols, false, rng);
      ASSERT_FALSE(can_interleave(plain.view)) << "scales apart from the codes";
      ASSERT_TRUE(can_interleave(packed_copy(plain).view));
      const OwnedMatrix inter = interleaved_copy(plain);
      std::vector<float> a(static_cast<size_t>(cols)), b(static_cast<size_t>(cols));
      for (int64_t r = 0; r < 7; ++r) {
        plain.view.row_to_float(r, a.data());
        inter.view.row_to_float(r, b.data());
        ASSERT_EQ(a, b) << weight_format_name(f) << " cols " << cols << " row " << r;
      }
      EXPECT_NE(plain.data, inter.data) << "the bytes should have moved";
    }
  for (WeightFormat f : {WeightFormat::BF16, WeightFormat::F16})
    for (int64_t cols : {32, 96, 512}) {
      const OwnedMatrix plain = random_matrix(f, 7, cols, false, rng);
      ASSERT_TRUE(can_interleave(plain.view));
      const OwnedMatrix inter = interleaved_copy(plain);
      std::vector<float> a(static_cast<size_t>(cols)), b(static_cast<size_t>(cols));
      for (int64_t r = 0; r < 7; ++r) {
        plain.view.row_to_float(r, a.data());
        inter.view.row_to_float(r, b.data());
        ASSERT_EQ(a, b) << weight_format_name(f) << " cols " << cols << " row " << r;
      }
      if (cols > 32) {
        EXPECT_NE(plain.data, inter.data) << "the bytes should have moved";
      }
    }
}

TEST(InterleavedWeights, FloatRowGroupsAlternateVectors) {
  ASSERT_EQ(kInterleaveRows, 4) << "the offsets below are worked out for groups of 4 rows";
  std::mt19937 rng(10);
  // 6 rows of 96 bf16 (192 bytes, three 64-byte vectors each): a group of 4 rows, then one of 2.
  const OwnedMatrix plain = random_matrix(WeightFormat::BF16, 6, 96, false, rng);
  const OwnedMatrix inter = interleaved_copy(plain);
  auto value = [](const std::vector<uint8_t>& bytes, size_t at) { return uint16_t(bytes[at] | bytes[at + 1] << 8); };
  // Row 2, column 33: vector 1 of row 2 of the first group -> 64 * (1 * 4 + 2) + 2 * 1.
  EXPECT_EQ(value(inter.data, 64 * 6 + 2), value(plain.data, 2 * 192 + 2 * 33));
  // Row 5, column 70: vector 2 of row 1 of the group at row 4 (2 rows, 768 bytes in) -> 768 +
  // 64 * (2 * 2 + 1) + 2 * 6.
  EXPECT_EQ(value(inter.data, 768 + 64 * 5 + 12), value(plain.data, 5 * 192 + 2 * 70));
  // Row 0's second vector follows the group's first vectors of rows 0-3.
  EXPECT_EQ(value(inter.data, 256), value(plain.data, 64));
  const WeightMatrix tail = inter.view.slice_rows(4, 2);
  EXPECT_EQ(tail.scales, nullptr);
  std::vector<float> a(96), b(96);
  inter.view.row_to_float(5, a.data());
  tail.row_to_float(1, b.data());
  EXPECT_EQ(a, b);
  EXPECT_THROW(inter.view.slice_rows(2, 4), Error);
}

TEST(InterleavedWeights, CodesSitWhereTheLayoutSays) {
  std::mt19937 rng(6);
  // One row: chunk ch starts at ch * (codes per chunk + 32 bytes of scales).
  const OwnedMatrix q8 = random_matrix(WeightFormat::Q8, 1, 1024, false, rng);
  const OwnedMatrix q8i = interleaved_copy(q8);
  // Column 512 + 32 * 3 + 4 * 6 + 2: chunk 1, block 3, vector 6, byte 2 -> 544 + 64 * 6 + 4 * 3 + 2.
  const int64_t c8 = 512 + 32 * 3 + 4 * 6 + 2;
  EXPECT_EQ(q8i.data[size_t(544 + 64 * 6 + 4 * 3 + 2)], uint8_t(int(int8_t(q8.data[size_t(c8)])) + 128));
  // Block 3 of chunk 1's scales: after its 512 bytes of codes.
  EXPECT_EQ(q8i.data[size_t(544 + 512 + 2 * 3)], q8.scales[size_t(2 * (16 + 3))]);

  const OwnedMatrix q4 = random_matrix(WeightFormat::Q4, 1, 1024, false, rng);
  const OwnedMatrix q4i = interleaved_copy(q4);
  auto nibble = [&](int64_t c) { return c % 2 ? q4.data[size_t(c / 2)] >> 4 : q4.data[size_t(c / 2)] & 0xf; };
  // Column 32 * 5 + 4 * 1 + 3 (vector 1: low nibble of byte 64 * 1 + 4 * 5 + 3).
  EXPECT_EQ(q4i.data[size_t(64 + 20 + 3)] & 0xf, nibble(32 * 5 + 4 + 3));
  // Column 512 + 32 * 15 + 4 * 7 (vector 7: high nibble of byte 288 + 64 * 3 + 4 * 15).
  EXPECT_EQ(q4i.data[size_t(288 + 64 * 3 + 60)] >> 4, nibble(512 + 32 * 15 + 28));
  EXPECT_EQ(q4i.data[size_t(288 + 256 + 2 * 15 + 1)], q4.scales[size_t(2 * (16 + 15) + 1)]);
}

TEST(InterleavedWeights, RowGroupsAlternateVectorsAndScales) {
  ASSERT_EQ(kInterleaveRows, 4) << "the offsets below are worked out for groups of 4 rows";
  std::mt19937 rng(9);
  // 22 rows of 1024 Q8 columns (1024 + 64 bytes of codes and scales per row): five groups of 4
  // rows and a last one of 2. A group's chunks take (rows in it) x 544 bytes each.
  const OwnedMatrix q8 = random_matrix(WeightFormat::Q8, 22, 1024, false, rng);
  const OwnedMatrix q8i = interleaved_copy(q8);
  auto code = [&](int64_t r, int64_t c) { return uint8_t(int(int8_t(q8.data[size_t(r * 1024 + c)])) + 128); };
  auto scale_byte = [&](int64_t r, int64_t b) { return q8.scales[size_t(r * 64 + b)]; };
  // Row 17: row 1 of the group at row 16. Column 512 + 32 * 3 + 4 * 6 + 2: chunk 1, vector 6,
  // block 3, byte 2.
  const size_t chunk17 = size_t(16 * 1088 + 4 * 544);
  EXPECT_EQ(q8i.data[chunk17 + 64 * (6 * 4 + 1) + 4 * 3 + 2], code(17, 512 + 32 * 3 + 4 * 6 + 2));
  // Its scales for chunk 1 follow the chunk's 8 x 4 vectors; block 3 of them (f16, two bytes).
  EXPECT_EQ(q8i.data[chunk17 + 64 * 8 * 4 + 32 * 1 + 2 * 3], scale_byte(17, 2 * (16 + 3)));
  EXPECT_EQ(q8i.data[chunk17 + 64 * 8 * 4 + 32 * 1 + 2 * 3 + 1], scale_byte(17, 2 * (16 + 3) + 1));
  // Row 21: row 1 of the last group (2 rows, at row 20); chunk 1 starts 2 x 544 bytes in.
  const size_t chunk21 = size_t(20 * 1088 + 2 * 544);
  EXPECT_EQ(q8i.data[chunk21 + 64 * (6 * 2 + 1) + 4 * 3 + 2], code(21, 512 + 32 * 3 + 4 * 6 + 2));
  EXPECT_EQ(q8i.data[chunk21 + 64 * 8 * 2 + 32 * 1], scale_byte(21, 2 * 16));
  // Row 6: row 2 of the group at row 4; vector 2 of chunk 0 holds columns 8-11 of each block.
  EXPECT_EQ(q8i.data[size_t(4 * 1088 + 64 * (2 * 4 + 2))], code(6, 8));
  // A row slice keeps whole groups, and reads the same rows.
  const WeightMatrix tail = q8i.view.slice_rows(16, 6);
  std::vector<float> a(1024), b(1024);
  for (int64_t r : {17, 21}) {
    q8i.view.row_to_float(r, a.data());
    tail.row_to_float(r - 16, b.data());
    EXPECT_EQ(a, b) << "row " << r;
  }
  EXPECT_THROW(q8i.view.slice_rows(2, 4), Error);
  EXPECT_THROW(q8i.view.slice_rows(0, 6), Error);
}

TEST(InterleavedWeights, OnlyWholeChunksOfPackedRowsAndNoColumnSlices) {
  std::mt19937 rng(7);
  EXPECT_TRUE(can_interleave(random_matrix(WeightFormat::BF16, 2, 512, false, rng).view));
  EXPECT_FALSE(can_interleave(random_matrix(WeightFormat::BF16, 2, 48, false, rng).view));
  EXPECT_FALSE(can_interleave(random_matrix(WeightFormat::BF16, 2, 512, true, rng).view)) << "a column slice";
  EXPECT_FALSE(can_interleave(random_matrix(WeightFormat::F32, 2, 512, false, rng).view));
  EXPECT_FALSE(can_interleave(random_matrix(WeightFormat::Q8, 2, 256, false, rng).view));
  EXPECT_FALSE(can_interleave(random_matrix(WeightFormat::Q4, 2, 544, false, rng).view));
  const OwnedMatrix inter = interleaved_copy(random_matrix(WeightFormat::Q4, 2, 512, false, rng));
  EXPECT_FALSE(can_interleave(inter.view));
  EXPECT_THROW(inter.view.slice_cols(0, 256), Error);
  const cpu::KernelTable& k = cpu::active_kernels();
  EXPECT_EQ(cpu::preferred_layout(random_matrix(WeightFormat::BF16, 2, 512, false, rng).view),
            k.interleaved_float ? WeightLayout::Interleaved : WeightLayout::Plain);
  EXPECT_EQ(cpu::preferred_layout(random_matrix(WeightFormat::BF16, 2, 48, false, rng).view), WeightLayout::Plain);
  EXPECT_EQ(cpu::preferred_layout(random_matrix(WeightFormat::Q8, 2, 256, false, rng).view), WeightLayout::Plain);
  const WeightLayout q8_512 = cpu::preferred_layout(packed_copy(random_matrix(WeightFormat::Q8, 2, 512, false, rng)).view);
  EXPECT_EQ(q8_512, k.interleaved_q8 ? WeightLayout::Interleaved : WeightLayout::Plain);
}

// y from cpu::matmul (threaded) and from matmul_rows on a row range that starts and (past 4 rows)
// ends inside a row group, against the double reference.
void check(const cpu::KernelTable& k, ThreadPool& pool, const WeightMatrix& w, int64_t n, std::mt19937& rng,
           const std::string& what) {
  const int64_t x_stride = w.cols + 16, y_stride = w.rows + 3;
  const std::vector<float> x = random_vector(size_t(n * x_stride), rng);
  std::vector<float> y(size_t(n * y_stride), -1.0f), y_rows(size_t(n * y_stride), -1.0f);
  cpu::matmul(pool, k, w, x.data(), x_stride, n, y.data(), y_stride);
  const int64_t r0 = w.rows / 3, r1 = w.rows > 4 ? w.rows - 1 : w.rows;
  k.matmul_rows(w, r0, r1, x.data(), x_stride, n, y_rows.data(), y_stride);
  std::vector<float> row(size_t(w.cols));
  int failures = 0;
  for (int64_t r = 0; r < w.rows; ++r) {
    w.row_to_float(r, row.data());
    for (int64_t i = 0; i < n; ++i) {
      const Expected e = expected_dot(row, x.data() + i * x_stride, w.cols, true);
      const float got = y[size_t(i * y_stride + r)], got_rows = y_rows[size_t(i * y_stride + r)];
      if (!(std::fabs(got - e.value) <= e.tolerance) && failures++ < 5)
        ADD_FAILURE() << what << " matmul: row " << r << " token " << i << ": " << got << " vs " << e.value;
      const bool in_range = r >= r0 && r < r1;
      if (in_range && !(std::fabs(got_rows - e.value) <= e.tolerance) && failures++ < 5)
        ADD_FAILURE() << what << " matmul_rows: row " << r << " token " << i << ": " << got_rows << " vs " << e.value;
      if (!in_range && got_rows != -1.0f && failures++ < 5) ADD_FAILURE() << what << ": row " << r << " written";
    }
  }
}

class InterleavedMatmul : public ::testing::TestWithParam<Isa> {};

// Every format x rows x cols x token count, interleaved, on the parameter's ISA.
void check_every_shape(Isa isa, std::initializer_list<WeightFormat> formats, std::initializer_list<int64_t> cols_list,
                       std::initializer_list<int64_t> token_counts, unsigned seed) {
  const cpu::KernelTable& k = cpu::kernels_for(isa);
  ThreadPool pool(2);
  std::mt19937 rng(seed);
  for (WeightFormat f : formats)
    for (int64_t rows : {1, 5, 19, 70})
      for (int64_t cols : cols_list)
        for (int64_t n : token_counts) {
          const OwnedMatrix m = interleaved_copy(random_matrix(f, rows, cols, false, rng));
          check(k, pool, m.view, n, rng,
                std::string(isa_name(isa)) + " " + std::string(weight_format_name(f)) + " " + std::to_string(rows) +
                    "x" + std::to_string(cols) + " n=" + std::to_string(n));
        }
}

TEST_P(InterleavedMatmul, MatchesTheReferenceForEveryTokenCount) {
  if (!isa_supported(GetParam())) GTEST_SKIP() << "not supported by this CPU";
  check_every_shape(GetParam(), {WeightFormat::Q8, WeightFormat::Q4}, {512, 1536}, {1, 2, 3, 7, 8, 9, 15, 16, 25}, 8);
}

// BF16/F16: decode tiles (1-2 tokens), batch tiles (3-47) and the prefill panels (48+).
TEST_P(InterleavedMatmul, FloatMatchesTheReferenceForEveryTokenCount) {
  if (!isa_supported(GetParam())) GTEST_SKIP() << "not supported by this CPU";
  check_every_shape(GetParam(), {WeightFormat::BF16, WeightFormat::F16}, {32, 96, 512},
                    {1, 2, 3, 5, 8, 15, 16, 47, 48, 53}, 11);
}

// Enough columns and tokens for the prefill loop nests to split columns into several chunks.
TEST_P(InterleavedMatmul, PrefillBlocking) {
  if (!isa_supported(GetParam())) GTEST_SKIP() << "not supported by this CPU";
  const cpu::KernelTable& k = cpu::kernels_for(GetParam());
  ThreadPool pool(2);
  std::mt19937 rng(9);
  for (WeightFormat f : {WeightFormat::Q8, WeightFormat::Q4, WeightFormat::BF16})
    for (int64_t n : {30, 70}) {
      const OwnedMatrix m = interleaved_copy(random_matrix(f, 37, 5120, false, rng));
      check(k, pool, m.view, n, rng, std::string(weight_format_name(f)) + " prefill n=" + std::to_string(n));
    }
}

// Long prefills of narrow matrices: more rows than one row block and more tokens than one token
// block of the AMX prefill (256 rows, 512 tokens), a short last row group, and matmul_rows over a
// range that starts inside the first block and ends inside the last group.
TEST_P(InterleavedMatmul, PrefillOverSeveralRowAndTokenBlocks) {
  if (!isa_supported(GetParam())) GTEST_SKIP() << "not supported by this CPU";
  const cpu::KernelTable& k = cpu::kernels_for(GetParam());
  ThreadPool pool(2);
  std::mt19937 rng(16);
  for (WeightFormat f : {WeightFormat::BF16, WeightFormat::Q8}) {
    const OwnedMatrix m = interleaved_copy(random_matrix(f, 602, f == WeightFormat::BF16 ? 64 : 512, false, rng));
    check(k, pool, m.view, 530, rng, std::string(weight_format_name(f)) + " 602 rows, 530 tokens");
  }
}

// Batched decode walks a row group's columns in blocks (several, the last one short, at 4608
// columns), and from 8 tokens on at that width runs each block over passes of up to 8 row groups
// (70 rows: two passes through matmul_rows' 23-69): the reference's values for every token, and on
// any table exactly what each token gets when it is multiplied alone, since a dot product adds its
// chunks (Q8/Q4) or vectors (BF16/F16) in the same order for any token count.
// A token's result in a batch does not depend on the batch: it is bit for bit the one it gets in a
// batch of two with another token, and the one it gets alone where one token takes the batches'
// kernel. The AMX table multiplies BF16 batches on tiles and one token with FMAs (faster from
// DRAM), so there one token alone differs in the last bits (each within check()'s tolerance).
TEST_P(InterleavedMatmul, BatchedDecodeGivesEachTokenItsOwnResult) {
  if (!isa_supported(GetParam())) GTEST_SKIP() << "not supported by this CPU";
  const cpu::KernelTable& k = cpu::kernels_for(GetParam());
  ThreadPool pool(2);
  std::mt19937 rng(12);
  constexpr int64_t kCols = 4608;
  const bool avx512_vnni_tiles = k.isa >= Isa::Avx512 && cpu_features().avx512_vnni;
  // Both shapes of the AVX-512 Q8/Q4 batch tiles, whichever this CPU takes, and for batches of up
  // to 48 tokens, as Intel CPUs take them (48: the most tiles a group's sums hold). BF16/F16
  // batches of 5 and 8 go to the streams on one side and to the batch tiles on the other.
  for (bool wide_batch_tiles : {false, true}) {
    cpu::detail::PrefetchTuning tuning = cpu::detail::prefetch_tuning();
    tuning.wide_batch_tiles = wide_batch_tiles;
    tuning.float_stream_tokens = wide_batch_tiles ? cpu::kMatvecStreamTokens : 2;
    tuning.q8_batch_tile_tokens = tuning.q4_batch_tile_tokens = 48;
    const cpu::detail::ScopedPrefetchTuning scoped(tuning);
    for (WeightFormat f : {WeightFormat::Q8, WeightFormat::Q4, WeightFormat::BF16, WeightFormat::F16})
      for (int64_t rows : {6, 37, 70}) {
        const OwnedMatrix m = interleaved_copy(random_matrix(f, rows, kCols, false, rng));
        const bool tiles_for_batches_only = k.isa == Isa::Avx512Amx && f == WeightFormat::BF16;
        for (int64_t n : {2, 5, 8, 11, 15, 16, 27, 48}) {
          // From 16 tokens on only the AVX-512 VNNI Q8/Q4 tiles are asked to keep batches (the
          // tuning above); elsewhere such batches may take the prefill's kernels.
          if (n > 15 && !(avx512_vnni_tiles && is_quantized(f))) continue;
          const std::string what = std::string(weight_format_name(f)) + " " + std::to_string(rows) + " rows n=" +
                                   std::to_string(n) + (wide_batch_tiles ? " (2 x 8 tiles)" : " (4 x 4 tiles)");
          check(k, pool, m.view, n, rng, what);
          const std::vector<float> x = random_vector(size_t(n * kCols), rng);
          std::vector<float> batched(size_t(n * rows)), pair_x(size_t(2 * kCols)), paired(size_t(2 * rows)),
              alone(static_cast<size_t>(rows));
          cpu::matmul(pool, k, m.view, x.data(), kCols, n, batched.data(), rows);
          for (int64_t i = 0; i < n; ++i) {
            // Token i second, after the token that follows it in the batch.
            std::copy_n(x.begin() + ((i + 1) % n) * kCols, kCols, pair_x.begin());
            std::copy_n(x.begin() + i * kCols, kCols, pair_x.begin() + kCols);
            cpu::matmul(pool, k, m.view, pair_x.data(), kCols, 2, paired.data(), rows);
            cpu::matmul(pool, k, m.view, x.data() + i * kCols, kCols, 1, alone.data(), rows);
            for (int64_t r = 0; r < rows; ++r) {
              ASSERT_EQ(batched[size_t(i * rows + r)], paired[size_t(rows + r)])
                  << what << ": token " << i << " row " << r;
              if (!tiles_for_batches_only) {
                ASSERT_EQ(batched[size_t(i * rows + r)], alone[size_t(r)]) << what << ": token " << i << " row " << r;
              }
            }
          }
        }
      }
  }
}

// Every float32 bit of the activations counts, on every path: with one power-of-two weight per
// row, each product and so each result is exact, and must come back bit for bit. (The AMX table
// splits activations into three bf16 parts for its tiles; two parts would lose the last 8 bits,
// yet stay within check()'s tolerance.)
TEST_P(InterleavedMatmul, BF16MultipliesEveryBitOfTheActivations) {
  if (!isa_supported(GetParam())) GTEST_SKIP() << "not supported by this CPU";
  const cpu::KernelTable& k = cpu::kernels_for(GetParam());
  ThreadPool pool(2);
  std::mt19937 rng(15);
  constexpr int64_t kRows = 37, kCols = 4608;
  OwnedMatrix plain = random_matrix(WeightFormat::BF16, kRows, kCols, false, rng);
  std::fill(plain.data.begin(), plain.data.end(), uint8_t(0));
  auto column_of = [](int64_t r) { return (r * 131 + 7) % kCols; };
  auto weight_of = [](int64_t r) { return std::ldexp(1.0f, int(r % 5) - 2); };
  for (int64_t r = 0; r < kRows; ++r) {
    const uint16_t h = f32_to_bf16(weight_of(r));
    std::memcpy(plain.data.data() + r * plain.view.row_stride + 2 * column_of(r), &h, 2);
  }
  const OwnedMatrix m = interleaved_copy(plain);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-12, 12);
  for (int64_t n : {1, 2, 5, 8, 11, 15, 16, 17, 40}) {
    std::vector<float> x(size_t(n * kCols)), y(size_t(n * kRows));
    for (float& v : x) v = std::ldexp(mantissa(rng), exponent(rng));
    cpu::matmul(pool, k, m.view, x.data(), kCols, n, y.data(), kRows);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t r = 0; r < kRows; ++r)
        ASSERT_EQ(y[size_t(i * kRows + r)], weight_of(r) * x[size_t(i * kCols + column_of(r))])
            << isa_name(GetParam()) << " n=" << n << " token " << i << " row " << r;
  }
}

// A soft-capped target gets, bitwise, its matmul's results through k.softcap: one token through
// the row-group streams (BF16 on AVX-512) or the tiles, batches, prefill panels, on pools of 1-3
// threads, in a group beside an uncapped matrix, with more rows than one soft-capped piece.
TEST_P(InterleavedMatmul, SoftcappedTargetsGiveTheMatmulThenTheSoftcap) {
  if (!isa_supported(GetParam())) GTEST_SKIP() << "not supported by this CPU";
  const cpu::KernelTable& k = cpu::kernels_for(GetParam());
  std::mt19937 rng(15);
  constexpr int64_t kCols = 512, kRows = cpu::kSoftcapPieceRows + 203;
  constexpr float kCap = 2.5f;  // most results are past the cap's linear part
  for (WeightFormat f : {WeightFormat::BF16, WeightFormat::Q4}) {
    const OwnedMatrix capped = interleaved_copy(random_matrix(f, kRows, kCols, false, rng));
    const OwnedMatrix plain = interleaved_copy(random_matrix(f, 70, kCols, false, rng));
    for (int64_t n : {1, 3, 20}) {
      const std::string what = std::string(isa_name(GetParam())) + " " + std::string(weight_format_name(f)) +
                               " n=" + std::to_string(n);
      const std::vector<float> x = random_vector(size_t(n * kCols), rng);
      ThreadPool one(1);
      std::vector<float> expected(size_t(n * kRows)), expected_plain(size_t(n * 70));
      cpu::matmul(one, k, capped.view, x.data(), kCols, n, expected.data(), kRows);
      for (int64_t i = 0; i < n; ++i) k.softcap(&expected[size_t(i * kRows)], kRows, kCap);
      cpu::matmul(one, k, plain.view, x.data(), kCols, n, expected_plain.data(), 70);
      size_t past_linear = 0;
      for (float v : expected) past_linear += std::fabs(v) > 0.5f * kCap;
      ASSERT_GT(past_linear, expected.size() / 4) << what;
      for (int threads : {1, 2, 3}) {
        ThreadPool pool(threads);
        std::vector<float> got(expected.size(), -1.0f), got_plain(expected_plain.size(), -1.0f);
        const MatmulTarget targets[] = {{&plain.view, got_plain.data(), 70}, {&capped.view, got.data(), kRows, kCap}};
        cpu::matmul_group(pool, k, targets, x.data(), kCols, n);
        EXPECT_EQ(got, expected) << what << " threads=" << threads;
        EXPECT_EQ(got_plain, expected_plain) << what << " threads=" << threads;
      }
    }
  }
}

// Up to kMatvecStreamTokens tokens over BF16/F16 row groups read runs from several places of a pass
// side by side (KernelTable::matvec_streams): every row gets exactly the sum matmul_rows gives it
// for each token alone, in groups of matrices of any height (short last groups) and output strides
// on pools of 1-3 threads, and from runs that start inside a row group or end inside one.
TEST_P(InterleavedMatmul, StreamsGiveEveryRowAndTokenItsOwnSum) {
  if (!isa_supported(GetParam())) GTEST_SKIP() << "not supported by this CPU";
  const cpu::KernelTable& k = cpu::kernels_for(GetParam());
  std::mt19937 rng(14);
  for (WeightFormat f : {WeightFormat::BF16, WeightFormat::F16})
    for (int64_t cols : {32, 2560}) {
      std::vector<OwnedMatrix> ms;
      for (int64_t rows : {203, 64, 6, 130}) ms.push_back(interleaved_copy(random_matrix(f, rows, cols, false, rng)));
      const std::string what = std::string(isa_name(GetParam())) + " " + std::string(weight_format_name(f)) + " cols " +
                               std::to_string(cols);
      if (GetParam() >= Isa::Avx512) {
        EXPECT_TRUE(k.reads_in_streams(ms[0].view)) << what;
      }
      constexpr int64_t kTokens = cpu::kMatvecStreamTokens;
      const std::vector<float> x = random_vector(size_t(kTokens * cols), rng);
      // expected[i][t * rows + r]: row r of matrix i for token t alone.
      std::vector<std::vector<float>> expected(ms.size());
      std::vector<float> row(static_cast<size_t>(cols));
      for (size_t i = 0; i < ms.size(); ++i) {
        const WeightMatrix& w = ms[i].view;
        const cpu::KernelTable& rows_table = k.reads_layout(w) ? k : cpu::scalar_kernels();
        expected[i].assign(size_t(kTokens * w.rows), -1.0f);
        for (int64_t t = 0; t < kTokens; ++t)
          rows_table.matmul_rows(w, 0, w.rows, x.data() + t * cols, cols, 1, expected[i].data() + t * w.rows, w.rows);
        for (int64_t r = 0; r < w.rows; ++r) {
          w.row_to_float(r, row.data());
          const Expected e = expected_dot(row, x.data(), cols, false);
          ASSERT_NEAR(expected[i][size_t(r)], e.value, e.tolerance) << what << " matrix " << i << " row " << r;
        }
      }
      // Token t's row r of matrix i lands at got[i][t * stride(i) + r]; strides differ per matrix.
      auto stride = [&](size_t i) { return ms[i].view.rows + int64_t(i); };
      std::vector<std::vector<float>> got(ms.size());
      auto expect_rows = [&](int64_t n, auto in_run, const std::string& where) {
        for (size_t i = 0; i < ms.size(); ++i)
          for (int64_t t = 0; t < n; ++t)
            for (int64_t r = 0; r < ms[i].view.rows; ++r)
              ASSERT_EQ(got[i][size_t(t * stride(i) + r)], in_run(i, r) ? expected[i][size_t(t * ms[i].view.rows + r)] : -1.0f)
                  << what << " " << where << " tokens " << n << " matrix " << i << " token " << t << " row " << r;
      };
      for (int64_t n : {int64_t(1), int64_t(2), int64_t(3), kTokens}) {
        std::vector<MatmulTarget> targets;
        for (size_t i = 0; i < ms.size(); ++i) {
          got[i].assign(size_t(n * stride(i)), -1.0f);
          targets.push_back({&ms[i].view, got[i].data(), stride(i)});
        }
        for (int threads : {1, 2, 3}) {
          ThreadPool pool(threads);
          for (auto& g : got) std::fill(g.begin(), g.end(), -1.0f);
          cpu::matmul_group(pool, k, targets, x.data(), cols, n);
          expect_rows(n, [](size_t, int64_t) { return true; }, "threads " + std::to_string(threads));
        }
        if (!k.matvec_streams) continue;
        // Runs that start or end inside a row group, a run of a short last group, and more runs than
        // are read side by side at once.
        const cpu::RowRun runs[] = {{&ms[0].view, 5, 43, got[0].data(), stride(0)},
                                    {&ms[1].view, 0, 6, got[1].data(), stride(1)},
                                    {&ms[2].view, 4, 6, got[2].data(), stride(2)},
                                    {&ms[3].view, 64, 130, got[3].data(), stride(3)},
                                    {&ms[0].view, 96, 203, got[0].data(), stride(0)}};
        static_assert(std::size(runs) > size_t(cpu::kMatvecStreams));
        for (auto& g : got) std::fill(g.begin(), g.end(), -1.0f);
        k.matvec_streams(std::span<const cpu::RowRun>(runs), x.data(), cols, n);
        expect_rows(n, [&](size_t i, int64_t r) {
          for (const cpu::RowRun& run : runs)
            if (run.w == &ms[i].view && r >= run.r0 && r < run.r1) return true;
          return false;
        }, "runs");
      }
    }
}

// RunsGiveEveryRowAndTokenTheBatchsSum on one table under the current prefetch tuning, n tokens at
// a time.
void check_runs(Isa isa, const std::string& tuning, int64_t n) {
  const cpu::KernelTable& k = cpu::kernels_for(isa);
  std::mt19937 rng(23);
  struct Case {
    int64_t rows, cols;
    std::vector<std::pair<int64_t, int64_t>> runs;
  };
  const Case cases[] = {
      {78, 1536, {{0, 78}, {0, 4}, {0, 8}, {4, 16}, {8, 20}, {16, 76}, {12, 78}, {3, 41}, {0, 77}, {64, 78}, {76, 78}}},
      {1126, 512, {{0, 1126}, {0, 1024}, {4, 1030}, {8, 1126}, {3, 900}, {512, 1125}}}};
  // The batch: the n tokens and one more, on the batch tiles (no streams).
  cpu::detail::PrefetchTuning tiles_only = cpu::detail::prefetch_tuning();
  tiles_only.decode_streams = 0;
  tiles_only.quant_stream_tokens = 1;
  for (const auto& [rows, cols, runs] : cases) {
    for (WeightFormat f : {WeightFormat::Q8, WeightFormat::Q4}) {
      const OwnedMatrix m = interleaved_copy(random_matrix(f, rows, cols, false, rng));
      const std::vector<float> x = random_vector(size_t((n + 1) * cols), rng);
      std::vector<float> batch(size_t((n + 1) * rows), -1.0f);
      {
        const cpu::detail::ScopedPrefetchTuning scoped(tiles_only);
        k.matmul_rows(m.view, 0, rows, x.data(), cols, n + 1, batch.data(), rows);
      }
      // Each token's results a few floats past the last row's (y_stride > rows), as in a batch's
      // outputs, which need not be packed.
      const int64_t y_stride = rows + 5;
      for (const auto& [r0, r1] : runs) {
        std::vector<float> y(size_t(n * y_stride), -1.0f);
        k.matmul_rows(m.view, r0, r1, x.data(), cols, n, y.data(), y_stride);
        for (int64_t t = 0; t < n; ++t)
          for (int64_t r = 0; r < y_stride; ++r)
            ASSERT_EQ(y[size_t(t * y_stride + r)], r >= r0 && r < r1 ? batch[size_t(t * rows + r)] : -1.0f)
                << isa_name(isa) << " " << tuning << " " << weight_format_name(f) << " rows [" << r0 << ", " << r1
                << ") token " << t << " of " << n << " row " << r;
      }
    }
  }
}

// Q8/Q4 row groups, one token or a few: any run of rows (one a thread takes from a pass) gives
// every row and token exactly what a batch on the batch tiles gives it, whether the run's groups
// split into the streams a core reads side by side (matmul_avx512_vnni_interleaved.cpp, on Zen 5
// and Intel, 2 or 4 streams, 1 or 2 tokens; avx2_interleaved_tiles.h, one token, a chunk of each
// stream at a time, or with prefetches a vector at a time) or leave some over: runs of 1-19 whole
// groups, runs that start inside a group, and runs ending in the short last group; and runs of
// 280 groups, which the streams hand to y in several staged pieces.
TEST_P(InterleavedMatmul, RunsGiveEveryRowAndTokenTheBatchsSum) {
  if (!isa_supported(GetParam())) GTEST_SKIP() << "not supported by this CPU";
  for (int64_t avx2_ahead : {0, 2048}) {
    cpu::detail::PrefetchTuning tuning = cpu::detail::prefetch_tuning();
    tuning.avx2_decode_ahead = avx2_ahead;
    const cpu::detail::ScopedPrefetchTuning scoped(tuning);
    ASSERT_NO_FATAL_FAILURE(check_runs(GetParam(), "avx2_decode_ahead " + std::to_string(avx2_ahead), 1));
  }
  for (int streams : {2, 4}) {
    cpu::detail::PrefetchTuning tuning = cpu::detail::prefetch_tuning();
    tuning.decode_streams = streams;
    tuning.quant_stream_tokens = 2;
    const cpu::detail::ScopedPrefetchTuning scoped(tuning);
    for (int64_t n : {1, 2, 3})
      ASSERT_NO_FATAL_FAILURE(check_runs(GetParam(), std::to_string(streams) + " streams", n));
  }
}

// The AVX-VNNI table multiplies bytes with vpdpbusd from unsigned codes and corrections where the
// AVX2 table uses vpmaddubsw on signed ones; both reach each block's exact int32 sum, so every
// result must be the same float: plain and interleaved Q8/Q4 weights (every code, Q8's -128
// included), through the one-token, batch (2-15) and prefill (16+) kernels, last chunks partial.
TEST(AvxVnni, GivesTheAvx2TablesResultsToTheBit) {
  if (!isa_supported(Isa::Avx2Vnni)) GTEST_SKIP() << "no AVX-VNNI on this CPU";
  const cpu::KernelTable& avx2 = cpu::kernels_for(Isa::Avx2);
  const cpu::KernelTable& vnni = cpu::kernels_for(Isa::Avx2Vnni);
  ASSERT_EQ(vnni.isa, Isa::Avx2Vnni);
  ThreadPool pool(2);
  std::mt19937 rng(21);
  for (WeightFormat f : {WeightFormat::Q8, WeightFormat::Q4})
    for (int64_t cols : {160, 512, 1536, 4608})
      for (bool interleaved : {false, true}) {
        if (interleaved && cols % 512) continue;
        const OwnedMatrix plain = random_matrix(f, 37, cols, !interleaved, rng);
        const OwnedMatrix m = interleaved ? interleaved_copy(plain) : OwnedMatrix{};
        const WeightMatrix& w = interleaved ? m.view : plain.view;
        for (int64_t n : {1, 2, 3, 8, 9, 15, 16, 17, 40}) {
          const std::string what = std::string(weight_format_name(f)) + (interleaved ? " interleaved " : " plain ") +
                                   std::to_string(cols) + " cols n=" + std::to_string(n);
          std::vector<float> x = random_vector(size_t(n * cols), rng);
          // Blocks of one sign at full scale, so that codes and corrections reach their extremes.
          for (size_t i = 0; i < x.size(); i += 3) x[i] = (i / kQuantBlock) % 2 ? 50.0f : -50.0f;
          std::vector<float> a(size_t(n * w.rows), -1.0f), b(size_t(n * w.rows), -2.0f);
          cpu::matmul(pool, avx2, w, x.data(), cols, n, a.data(), w.rows);
          cpu::matmul(pool, vnni, w, x.data(), cols, n, b.data(), w.rows);
          ASSERT_EQ(a, b) << what;
        }
      }
}

INSTANTIATE_TEST_SUITE_P(Isas, InterleavedMatmul, ::testing::ValuesIn(all_isas()),
                         [](const auto& info) { return std::string(isa_name(info.param)); });

}  // namespace
}  // namespace tandem::test
