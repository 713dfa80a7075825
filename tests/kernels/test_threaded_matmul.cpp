// cpu::matmul splits rows across a pool: the same numbers as one thread, for pools of 1-3 threads,
// every format and token counts on both sides of the decode/prefill switch.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "matrix_factory.h"

namespace tandem::test {
namespace {

TEST(ThreadedMatmul, MatchesOneThreadForEveryPoolSize) {
  std::mt19937 rng(9);
  for (Isa isa : all_isas()) {
    if (!isa_supported(isa)) continue;
    const cpu::KernelTable& k = cpu::kernels_for(isa);
    for (WeightFormat f : {WeightFormat::F32, WeightFormat::F16, WeightFormat::BF16, WeightFormat::Q8, WeightFormat::Q4}) {
      OwnedMatrix m = random_matrix(f, 203, 256, true, rng);
      for (int64_t n : {1, 3, 8, 40}) {
        const int64_t x_stride = 260, y_stride = 211;
        const std::vector<float> x = random_vector(size_t(n * x_stride), rng);
        std::vector<float> expected(static_cast<size_t>(n * y_stride), -1.0f);
        ThreadPool one(1);
        cpu::matmul(one, k, m.view, x.data(), x_stride, n, expected.data(), y_stride);
        std::vector<float> row(256);
        for (int64_t r = 0; r < m.view.rows; r += 50) {  // spot-check against the reference too
          m.view.row_to_float(r, row.data());
          const Expected e = expected_dot(row, x.data(), 256, is_quantized(f));
          EXPECT_NEAR(expected[size_t(r)], e.value, e.tolerance);
        }
        for (int threads : {2, 3}) {
          ThreadPool pool(threads);
          std::vector<float> y(static_cast<size_t>(n * y_stride), -1.0f);
          cpu::matmul(pool, k, m.view, x.data(), x_stride, n, y.data(), y_stride);
          EXPECT_EQ(y, expected) << isa_name(isa) << " " << weight_format_name(f) << " n=" << n << " threads=" << threads;
        }
      }
    }
  }
}

TEST(ThreadedMatmul, GroupGivesEachMatrixItsOwnMatmul) {
  // q/k/v-like groups: different heights (one not a multiple of any tile), the same width; and a
  // group mixing formats, which cannot share quantized activations.
  std::mt19937 rng(4);
  for (Isa isa : all_isas()) {
    if (!isa_supported(isa)) continue;
    const cpu::KernelTable& k = cpu::kernels_for(isa);
    for (WeightFormat f : {WeightFormat::F32, WeightFormat::BF16, WeightFormat::Q8, WeightFormat::Q4}) {
      const WeightFormat other = f == WeightFormat::Q4 ? WeightFormat::Q8 : WeightFormat::Q4;
      std::vector<OwnedMatrix> ms;
      ms.push_back(random_matrix(f, 203, 256, true, rng));
      ms.push_back(random_matrix(f, 64, 256, false, rng));
      ms.push_back(random_matrix(f, 37, 256, true, rng));
      ms.push_back(random_matrix(other, 50, 256, false, rng));
      for (size_t count : {size_t(1), size_t(3), size_t(4)}) {
        for (int64_t n : {1, 3, 20}) {
          const int64_t x_stride = 260;
          const std::vector<float> x = random_vector(size_t(n * x_stride), rng);
          std::vector<std::vector<float>> expected(count), got(count);
          std::vector<MatmulTarget> targets;
          ThreadPool one(1);
          for (size_t i = 0; i < count; ++i) {
            const int64_t y_stride = ms[i].view.rows + 5;
            expected[i].assign(size_t(n * y_stride), -1.0f);
            got[i].assign(size_t(n * y_stride), -1.0f);
            cpu::matmul(one, k, ms[i].view, x.data(), x_stride, n, expected[i].data(), y_stride);
            targets.push_back({&ms[i].view, got[i].data(), y_stride});
          }
          for (int threads : {1, 2, 3}) {
            ThreadPool pool(threads);
            for (auto& g : got) std::fill(g.begin(), g.end(), -1.0f);
            cpu::matmul_group(pool, k, targets, x.data(), x_stride, n);
            for (size_t i = 0; i < count; ++i)
              EXPECT_EQ(got[i], expected[i]) << isa_name(isa) << " " << weight_format_name(f) << " matrix " << i
                                             << " of " << count << " n=" << n << " threads=" << threads;
          }
        }
      }
    }
  }
}

TEST(ThreadedMatmul, TinyAndEmptyShapes) {
  ThreadPool pool(3);
  std::mt19937 rng(1);
  const cpu::KernelTable& k = cpu::active_kernels();
  OwnedMatrix m = random_matrix(WeightFormat::BF16, 5, 3, false, rng);
  const std::vector<float> x = random_vector(6, rng);
  std::vector<float> y(10, -1.0f);
  cpu::matmul(pool, k, m.view, x.data(), 3, 2, y.data(), 5);
  std::vector<float> row(3);
  for (int r = 0; r < 5; ++r) {
    m.view.row_to_float(r, row.data());
    EXPECT_NEAR(y[size_t(r)], expected_dot(row, x.data(), 3, false).value, 1e-6);
  }
  cpu::matmul(pool, k, m.view, x.data(), 3, 0, y.data(), 5);  // no tokens: nothing to do
  WeightMatrix empty = m.view.slice_rows(0, 0);
  cpu::matmul(pool, k, empty, x.data(), 3, 2, y.data(), 5);
}

}  // namespace
}  // namespace tandem::test
