// WeightLayout::Interleaved: the rearrangement keeps every value (row_to_float reads it back
// through an independent index computation), codes land where kernels/weight.h says, and every
// ISA table multiplies interleaved weights as accurately as plain ones (tables without an
// interleaved kernel fall back to the scalar one).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/cpu/kernels.h"
#include "matrix_factory.h"

namespace tandem::test {
namespace {

OwnedMatrix interleaved_copy(const OwnedMatrix& plain) {
  const WeightMatrix& p = plain.view;
  OwnedMatrix m;
  m.data.assign(size_t(interleaved_bytes(p.format, p.rows, p.cols)), 0);
  write_interleaved(p, m.data.data());
  m.view = interleaved_matrix(p.format, p.rows, p.cols, m.data.data());
  return m;
}

TEST(InterleavedWeights, RowsReadBackUnchanged) {
  std::mt19937 rng(5);
  for (WeightFormat f : {WeightFormat::Q8, WeightFormat::Q4})
    for (int64_t cols : {512, 1536}) {
      const OwnedMatrix plain = random_matrix(f, 7, cols, false, rng);
      ASSERT_TRUE(can_interleave(plain.view));
      const OwnedMatrix inter = interleaved_copy(plain);
      std::vector<float> a(static_cast<size_t>(cols)), b(static_cast<size_t>(cols));
      for (int64_t r = 0; r < 7; ++r) {
        plain.view.row_to_float(r, a.data());
        inter.view.row_to_float(r, b.data());
        ASSERT_EQ(a, b) << weight_format_name(f) << " cols " << cols << " row " << r;
      }
      EXPECT_NE(plain.data, inter.data) << "the bytes should have moved";
    }
}

TEST(InterleavedWeights, CodesSitWhereTheLayoutSays) {
  std::mt19937 rng(6);
  // One row: a group of one, so chunk 1 starts after chunk 0's codes and 32 bytes of scales.
  const OwnedMatrix q8 = random_matrix(WeightFormat::Q8, 1, 1024, false, rng);
  const OwnedMatrix q8i = interleaved_copy(q8);
  // Column 512 + 32 * 3 + 4 * 6 + 2: chunk 1, block 3, vector 6, byte 2 -> 544 + 64 * 6 + 4 * 3 + 2.
  const int64_t c8 = 512 + 32 * 3 + 4 * 6 + 2;
  EXPECT_EQ(q8i.data[size_t(544 + 64 * 6 + 4 * 3 + 2)], uint8_t(int(int8_t(q8.data[size_t(c8)])) + 128));
  EXPECT_EQ(std::memcmp(q8i.data.data() + 512, q8.scales.data(), 32), 0);             // chunk 0's scales
  EXPECT_EQ(std::memcmp(q8i.data.data() + 544 + 512, q8.scales.data() + 32, 32), 0);  // chunk 1's

  const OwnedMatrix q4 = random_matrix(WeightFormat::Q4, 1, 1024, false, rng);
  const OwnedMatrix q4i = interleaved_copy(q4);
  auto nibble = [&](int64_t c) { return c % 2 ? q4.data[size_t(c / 2)] >> 4 : q4.data[size_t(c / 2)] & 0xf; };
  // Column 32 * 5 + 4 * 1 + 3 (vector 1: low nibble of byte 64 * 1 + 4 * 5 + 3).
  EXPECT_EQ(q4i.data[size_t(64 + 20 + 3)] & 0xf, nibble(32 * 5 + 4 + 3));
  // Column 512 + 32 * 15 + 4 * 7 (chunk 1 at 256 + 32; vector 7: high nibble of byte 64 * 3 + 4 * 15).
  EXPECT_EQ(q4i.data[size_t(288 + 64 * 3 + 60)] >> 4, nibble(512 + 32 * 15 + 28));
}

TEST(InterleavedWeights, RowGroupsAreOneRangeEach) {
  std::mt19937 rng(10);
  // 10 rows of 1024 Q8 columns (1088 bytes with scales): a group of 8, then a group of 2. Row 9's
  // chunk 1 follows the short group's chunk 0 (2 x 512 codes, 2 x 32 scales) and row 8's codes.
  const OwnedMatrix q8 = random_matrix(WeightFormat::Q8, 10, 1024, false, rng);
  const OwnedMatrix q8i = interleaved_copy(q8);
  ASSERT_EQ(q8i.data.size(), size_t(10 * 1088));
  const size_t chunk1 = 8 * 1088 + 2 * 544, row9 = 9 * 1024;
  EXPECT_EQ(q8i.data[chunk1 + 512], uint8_t(q8.data[row9 + 512] ^ 0x80));  // column 512: block 0, vector 0
  EXPECT_EQ(std::memcmp(q8i.data.data() + chunk1 + 2 * 512 + 32, q8.scales.data() + 9 * 64 + 32, 32), 0);
  // Row 3 of the first group, chunk 0: codes at 3 * 512, scales after the group's 8 x 512 codes.
  EXPECT_EQ(q8i.data[3 * 512 + 4 * 2 + 1], uint8_t(q8.data[3 * 1024 + 32 * 2 + 1] ^ 0x80));
  EXPECT_EQ(std::memcmp(q8i.data.data() + 8 * 512 + 3 * 32, q8.scales.data() + 3 * 64, 32), 0);

  // Blocks of whole groups written at their own offset give the same bytes (how the loader splits).
  for (WeightFormat f : {WeightFormat::Q8, WeightFormat::Q4}) {
    const OwnedMatrix plain = random_matrix(f, 21, 1536, false, rng);
    const OwnedMatrix whole = interleaved_copy(plain);
    std::vector<uint8_t> blocks(whole.data.size(), 0);
    for (int64_t r0 : {0, 8, 16}) {
      const int64_t count = std::min<int64_t>(8, 21 - r0);
      write_interleaved(plain.view.slice_rows(r0, count), blocks.data() + interleaved_bytes(f, r0, 1536));
    }
    EXPECT_EQ(blocks, whole.data) << weight_format_name(f);
    EXPECT_NO_THROW(whole.view.slice_rows(8, 13));
    EXPECT_THROW(whole.view.slice_rows(4, 8), Error);
    EXPECT_THROW(whole.view.slice_rows(8, 4), Error);
    std::vector<float> a(1536), b(1536);
    plain.view.row_to_float(17, a.data());
    whole.view.slice_rows(16, 5).row_to_float(1, b.data());
    EXPECT_EQ(a, b) << weight_format_name(f);
  }
}

TEST(InterleavedWeights, OnlyQuantizedWholeChunksAndNoColumnSlices) {
  std::mt19937 rng(7);
  EXPECT_FALSE(can_interleave(random_matrix(WeightFormat::BF16, 2, 512, false, rng).view));
  EXPECT_FALSE(can_interleave(random_matrix(WeightFormat::Q8, 2, 256, false, rng).view));
  EXPECT_FALSE(can_interleave(random_matrix(WeightFormat::Q4, 2, 544, false, rng).view));
  const OwnedMatrix inter = interleaved_copy(random_matrix(WeightFormat::Q4, 2, 512, false, rng));
  EXPECT_FALSE(can_interleave(inter.view));
  EXPECT_THROW(inter.view.slice_cols(0, 256), Error);
  EXPECT_EQ(cpu::preferred_layout(random_matrix(WeightFormat::BF16, 2, 512, false, rng).view), WeightLayout::Plain);
  EXPECT_EQ(cpu::preferred_layout(random_matrix(WeightFormat::Q8, 2, 256, false, rng).view), WeightLayout::Plain);
  const WeightLayout q8_512 = cpu::preferred_layout(random_matrix(WeightFormat::Q8, 2, 512, false, rng).view);
  EXPECT_EQ(q8_512, cpu::active_kernels().interleaved ? WeightLayout::Interleaved : WeightLayout::Plain);
}

// y from cpu::matmul (threaded) and from matmul_rows on a row range, against the double reference.
void check(const cpu::KernelTable& k, ThreadPool& pool, const WeightMatrix& w, int64_t n, std::mt19937& rng,
           const std::string& what) {
  const int64_t x_stride = w.cols + 16, y_stride = w.rows + 3;
  const std::vector<float> x = random_vector(size_t(n * x_stride), rng);
  std::vector<float> y(size_t(n * y_stride), -1.0f), y_rows(size_t(n * y_stride), -1.0f);
  cpu::matmul(pool, k, w, x.data(), x_stride, n, y.data(), y_stride);
  const int64_t r0 = w.rows / 3, r1 = w.rows;
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
      if (r >= r0 && !(std::fabs(got_rows - e.value) <= e.tolerance) && failures++ < 5)
        ADD_FAILURE() << what << " matmul_rows: row " << r << " token " << i << ": " << got_rows << " vs " << e.value;
      if (r < r0 && got_rows != -1.0f && failures++ < 5) ADD_FAILURE() << what << ": row " << r << " written";
    }
  }
}

class InterleavedMatmul : public ::testing::TestWithParam<Isa> {};

TEST_P(InterleavedMatmul, MatchesTheReferenceForEveryTokenCount) {
  if (int(GetParam()) > int(best_supported_isa())) GTEST_SKIP() << "not supported by this CPU";
  const cpu::KernelTable& k = cpu::kernels_for(GetParam());
  ThreadPool pool(2);
  std::mt19937 rng(8);
  for (WeightFormat f : {WeightFormat::Q8, WeightFormat::Q4})
    for (int64_t rows : {1, 5, 19, 70})
      for (int64_t cols : {512, 1536})
        for (int64_t n : {1, 2, 3, 7, 8, 9, 15, 16, 25}) {
          const OwnedMatrix m = interleaved_copy(random_matrix(f, rows, cols, false, rng));
          check(k, pool, m.view, n, rng,
                std::string(isa_name(GetParam())) + " " + std::string(weight_format_name(f)) + " " +
                    std::to_string(rows) + "x" + std::to_string(cols) + " n=" + std::to_string(n));
        }
}

// Enough columns and tokens for the prefill loop nest to split columns into several chunks.
TEST_P(InterleavedMatmul, PrefillBlocking) {
  if (int(GetParam()) > int(best_supported_isa())) GTEST_SKIP() << "not supported by this CPU";
  const cpu::KernelTable& k = cpu::kernels_for(GetParam());
  ThreadPool pool(2);
  std::mt19937 rng(9);
  for (WeightFormat f : {WeightFormat::Q8, WeightFormat::Q4}) {
    const OwnedMatrix m = interleaved_copy(random_matrix(f, 37, 5120, false, rng));
    check(k, pool, m.view, 70, rng, std::string(weight_format_name(f)) + " prefill");
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, InterleavedMatmul, ::testing::ValuesIn(all_isas()),
                         [](const auto& info) { return std::string(isa_name(info.param)); });

}  // namespace
}  // namespace tandem::test
