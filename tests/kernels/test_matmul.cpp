// matmul_rows of every ISA table this CPU runs, for every weight format, against a double
// reference on odd shapes: column tails, odd row and token counts, padded strides and slices.
#include <gtest/gtest.h>

#include <random>
#include <utility>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "matrix_factory.h"

namespace tandem::test {
namespace {

using cpu::KernelTable;

const std::vector<int64_t> kRows = {1, 3, 17, 64, 65};
const std::vector<int64_t> kFloatCols = {1, 7, 32, 33, 100, 256, 1000};
const std::vector<int64_t> kQuantCols = {32, 64, 96, 160, 256, 1024};
const std::vector<int64_t> kTokens = {1, 2, 3, 5, 8, 13, 15, 16, 17, 64};

constexpr float kSentinel = -12345.0f;

bool skip_unsupported(Isa isa) {
  if (!isa_supported(isa)) {
    std::printf("[ SKIPPED  ] %s: not supported by this CPU\n", std::string(isa_name(isa)).c_str());
    return true;
  }
  return false;
}

// Runs k.matmul_rows over rows [r0, r1) and checks every written value and that nothing else
// in y was touched.
void check_matmul_rows(const KernelTable& k, const WeightMatrix& w, int64_t n, int64_t r0, int64_t r1, std::mt19937& rng,
                       const std::string& what) {
  const int64_t x_stride = w.cols + 3, y_stride = w.rows + 5;
  const std::vector<float> x = random_vector(size_t(n * x_stride), rng);
  std::vector<float> y(static_cast<size_t>(n * y_stride), kSentinel);
  k.matmul_rows(w, r0, r1, x.data(), x_stride, n, y.data(), y_stride);
  std::vector<float> row(static_cast<size_t>(w.cols));
  int failures = 0;
  for (int64_t r = 0; r < w.rows; ++r) {
    w.row_to_float(r, row.data());
    for (int64_t i = 0; i < n; ++i) {
      const float got = y[size_t(i * y_stride + r)];
      if (r < r0 || r >= r1) {
        if (got != kSentinel && failures++ < 5) ADD_FAILURE() << what << ": row " << r << " written outside the range";
        continue;
      }
      const Expected e = expected_dot(row, x.data() + i * x_stride, w.cols, is_quantized(w.format));
      if (!(std::fabs(got - e.value) <= e.tolerance) && failures++ < 5)
        ADD_FAILURE() << what << ": row " << r << " token " << i << ": got " << got << ", expected " << e.value
                      << " +- " << e.tolerance;
    }
  }
  for (int64_t i = 0; i < n; ++i)
    for (int64_t r = w.rows; r < y_stride; ++r)
      if (y[size_t(i * y_stride + r)] != kSentinel && failures++ < 5) ADD_FAILURE() << what << ": wrote past the rows";
}

class MatmulRows : public ::testing::TestWithParam<Isa> {};

TEST_P(MatmulRows, AllFormatsAndShapes) {
  if (skip_unsupported(GetParam())) GTEST_SKIP();
  const KernelTable& k = cpu::kernels_for(GetParam());
  std::mt19937 rng(42);
  for (WeightFormat f : {WeightFormat::F32, WeightFormat::F16, WeightFormat::BF16, WeightFormat::Q8, WeightFormat::Q4}) {
    const auto& cols_list = is_quantized(f) ? kQuantCols : kFloatCols;
    for (int64_t rows : kRows)
      for (int64_t cols : cols_list)
        for (int64_t n : kTokens) {
          const bool sliced = (rows + cols + n) % 2 == 1;
          OwnedMatrix m = random_matrix(f, rows, cols, sliced, rng);
          const std::string what = std::string(isa_name(GetParam())) + " " + std::string(weight_format_name(f)) +
                                   " rows=" + std::to_string(rows) + " cols=" + std::to_string(cols) +
                                   " n=" + std::to_string(n) + (sliced ? " sliced" : "");
          check_matmul_rows(k, m.view, n, 0, rows, rng, what);
        }
  }
}

TEST_P(MatmulRows, SubRangesOfRows) {
  if (skip_unsupported(GetParam())) GTEST_SKIP();
  const KernelTable& k = cpu::kernels_for(GetParam());
  std::mt19937 rng(7);
  for (WeightFormat f : {WeightFormat::F32, WeightFormat::F16, WeightFormat::BF16, WeightFormat::Q8, WeightFormat::Q4}) {
    OwnedMatrix m = random_matrix(f, 37, is_quantized(f) ? 96 : 41, true, rng);
    for (auto [r0, r1] : std::vector<std::pair<int64_t, int64_t>>{{0, 0}, {5, 6}, {3, 30}, {13, 37}})
      for (int64_t n : {1, 4, 9, 50})
        check_matmul_rows(k, m.view, n, r0, r1, rng,
                          std::string(weight_format_name(f)) + " rows [" + std::to_string(r0) + ", " +
                              std::to_string(r1) + ") n=" + std::to_string(n));
  }
}

// The prefill loop nest chunks columns and tokens; shapes large enough to take several chunks.
TEST_P(MatmulRows, PrefillBlocking) {
  if (skip_unsupported(GetParam())) GTEST_SKIP();
  const KernelTable& k = cpu::kernels_for(GetParam());
  std::mt19937 rng(11);
  for (WeightFormat f : {WeightFormat::BF16, WeightFormat::F16, WeightFormat::Q8, WeightFormat::Q4}) {
    OwnedMatrix m = random_matrix(f, 21, is_quantized(f) ? 4096 + 32 : 4099, false, rng);
    check_matmul_rows(k, m.view, 130, 0, 21, rng, std::string(weight_format_name(f)) + " prefill");
  }
}

// Many tokens of float weights take packed panels: groups of 64 rows (16 on AVX2), column blocks
// of up to 2560 (4096 on AVX2), tiles of 6 tokens. Row ranges that start and end inside a group,
// columns that need several blocks and end in a tail, a token count with a partial tile.
TEST_P(MatmulRows, FloatPanels) {
  if (skip_unsupported(GetParam())) GTEST_SKIP();
  const KernelTable& k = cpu::kernels_for(GetParam());
  std::mt19937 rng(13);
  for (WeightFormat f : {WeightFormat::F32, WeightFormat::F16, WeightFormat::BF16}) {
    OwnedMatrix m = random_matrix(f, 150, 5203, false, rng);
    for (auto [r0, r1] : std::vector<std::pair<int64_t, int64_t>>{{0, 150}, {7, 139}})
      check_matmul_rows(k, m.view, 53, r0, r1, rng,
                        std::string(weight_format_name(f)) + " panels rows [" + std::to_string(r0) + ", " +
                            std::to_string(r1) + ")");
    OwnedMatrix no_columns = random_matrix(f, 20, 0, false, rng);  // y is all zeros, not left unwritten
    check_matmul_rows(k, no_columns.view, 53, 0, 20, rng, std::string(weight_format_name(f)) + " panels, no columns");
  }
}

// Many tokens of Q8/Q4 weights take packed panels of column chunks (256 columns on AVX2, 512 with
// VNNI), several chunks per pass and rows in blocks: row ranges that start and end inside a tile,
// columns over several passes ending in a partial chunk, token counts with a partial tile. And
// every Q8 weight at -128, which the AVX2 kernels can only negate through the activations' sign.
TEST_P(MatmulRows, QuantizedPanels) {
  if (skip_unsupported(GetParam())) GTEST_SKIP();
  const KernelTable& k = cpu::kernels_for(GetParam());
  std::mt19937 rng(17);
  for (WeightFormat f : {WeightFormat::Q8, WeightFormat::Q4}) {
    OwnedMatrix m = random_matrix(f, 150, 5920, false, rng);  // 185 blocks: 23 chunks of 8 and one block
    for (int64_t n : {16, 53})
      for (auto [r0, r1] : std::vector<std::pair<int64_t, int64_t>>{{0, 150}, {7, 139}})
        check_matmul_rows(k, m.view, n, r0, r1, rng,
                          std::string(weight_format_name(f)) + " panels n=" + std::to_string(n) + " rows [" +
                              std::to_string(r0) + ", " + std::to_string(r1) + ")");
  }
  OwnedMatrix lowest = random_matrix(WeightFormat::Q8, 5, 288, false, rng);
  for (int64_t r = 0; r < 5; ++r) std::memset(lowest.data.data() + r * lowest.view.row_stride, 0x80, 288);
  for (int64_t n : {1, 5, 16, 20}) check_matmul_rows(k, lowest.view, n, 0, 5, rng, "q8 all -128 n=" + std::to_string(n));
}

// Zero and huge activations: all-zero quantization blocks must give exact zeros, not NaN.
TEST_P(MatmulRows, ZeroActivations) {
  if (skip_unsupported(GetParam())) GTEST_SKIP();
  const KernelTable& k = cpu::kernels_for(GetParam());
  std::mt19937 rng(3);
  for (WeightFormat f : {WeightFormat::F32, WeightFormat::BF16, WeightFormat::Q8, WeightFormat::Q4}) {
    OwnedMatrix m = random_matrix(f, 9, 64, false, rng);
    std::vector<float> x(64 * 2, 0.0f), y(9 * 2, kSentinel);
    for (int c = 32; c < 64; ++c) x[size_t(64 + c)] = 1e30f * (c % 2 ? 1 : -1) / 1e30f;  // second token: one live block
    k.matmul_rows(m.view, 0, 9, x.data(), 64, 2, y.data(), 9);
    std::vector<float> row(64);
    for (int r = 0; r < 9; ++r) {
      EXPECT_EQ(y[size_t(r)], 0.0f) << weight_format_name(f);
      m.view.row_to_float(r, row.data());
      const Expected e = expected_dot(row, x.data() + 64, 64, is_quantized(f));
      EXPECT_NEAR(y[size_t(9 + r)], e.value, e.tolerance) << weight_format_name(f);
    }
  }
}

// Plain Q4 rows on the AVX-512 VNNI tables: up to 15 tokens take groups of four rows (tails of
// 1-3 rows, partial 128-column groups), and each token gets, bitwise, what it gets alone, over any
// row range. (The other tables' batches add in another order than their one-token tiles.)
TEST_P(MatmulRows, PlainQ4BatchesGiveEachTokenItsOneTokenResult) {
  if (skip_unsupported(GetParam())) return;
  if (GetParam() < Isa::Avx512 || !cpu_features().avx512_vnni)
    GTEST_SKIP() << "only the AVX-512 VNNI kernels promise this";
  const KernelTable& k = cpu::kernels_for(GetParam());
  std::mt19937 rng(41);
  for (int64_t rows : {70, 203})
    for (int64_t cols : {96, 256, 2560}) {
      const OwnedMatrix m = random_matrix(WeightFormat::Q4, rows, cols, true, rng);
      for (const auto& [r0, r1] : {std::pair<int64_t, int64_t>{0, rows}, {5, rows - 6}}) {
        for (int64_t n : {2, 3, 8, 9, 15}) {
          const int64_t x_stride = cols + 3, y_stride = rows + 5;
          const std::vector<float> x = random_vector(size_t(n * x_stride), rng);
          std::vector<float> batch(size_t(n * y_stride), kSentinel), alone(size_t(y_stride), kSentinel);
          k.matmul_rows(m.view, r0, r1, x.data(), x_stride, n, batch.data(), y_stride);
          for (int64_t i = 0; i < n; ++i) {
            k.matmul_rows(m.view, r0, r1, x.data() + i * x_stride, x_stride, 1, alone.data(), y_stride);
            for (int64_t r = r0; r < r1; ++r)
              ASSERT_EQ(batch[size_t(i * y_stride + r)], alone[size_t(r)])
                  << isa_name(GetParam()) << " " << rows << "x" << cols << " rows [" << r0 << ", " << r1 << ") n=" << n
                  << " token " << i << " row " << r;
          }
        }
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Isas, MatmulRows, ::testing::ValuesIn(all_isas()),
                         [](const auto& info) { return std::string(isa_name(info.param)); });

}  // namespace
}  // namespace tandem::test
