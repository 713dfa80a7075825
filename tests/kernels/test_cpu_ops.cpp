// CpuOps hands a norm or a gate to the pool only above a size (small ones run on the calling
// thread): on either side of it, and on pools of 1-3 threads, every row gets exactly what the
// kernel gives it called on that row alone, with strided rows and gate rows split between the
// threads inside a row.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

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

}  // namespace
}  // namespace tandem::test
