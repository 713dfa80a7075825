// ProfilingOps forwards every call unchanged and counts each kind of call in the phase that was set
// when it ran; calls outside a phase count nowhere.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/profiling_ops.h"
#include "matrix_factory.h"

namespace tandem::test {
namespace {

TEST(ProfilingOps, ForwardsEveryCallAndCountsItInItsPhase) {
  std::mt19937 rng(31);
  ThreadPool pool(2);
  cpu::CpuOps inner(pool);
  ProfilingOps ops(inner);
  const OwnedMatrix a = random_matrix(WeightFormat::BF16, 48, 64, false, rng);
  const OwnedMatrix b = random_matrix(WeightFormat::BF16, 48, 64, false, rng);
  const std::vector<float> x = random_vector(2 * 64, rng);

  std::vector<float> want(2 * 48), got(2 * 48);
  inner.matmul(a.view, x.data(), 64, 2, want.data(), 48);
  ops.matmul(a.view, x.data(), 64, 2, got.data(), 48);  // before any phase: forwarded, not counted
  EXPECT_EQ(got, want);

  ops.set_phase("decode");
  std::fill(got.begin(), got.end(), 0.0f);
  ops.matmul(a.view, x.data(), 64, 2, got.data(), 48);
  EXPECT_EQ(got, want);
  ops.matmul(a.view, x.data(), 64, 2, got.data(), 48);
  // A group of two, and a soft-capped group of one (counted as a matmul of its matrix).
  std::vector<float> ya(2 * 48), yb(2 * 48), want_b(2 * 48), capped(2 * 48), want_capped(2 * 48);
  const MatmulTarget pair[] = {{&a.view, ya.data(), 48}, {&b.view, yb.data(), 48}};
  ops.matmuls(pair, x.data(), 64, 2);
  inner.matmul(b.view, x.data(), 64, 2, want_b.data(), 48);
  EXPECT_EQ(ya, want);
  EXPECT_EQ(yb, want_b);
  const MatmulTarget lm_head{&b.view, capped.data(), 48, 0.5f};
  ops.matmuls(std::span(&lm_head, 1), x.data(), 64, 2);
  want_capped = want_b;
  inner.softcap(want_capped.data(), int64_t(want_capped.size()), 0.5f);
  EXPECT_EQ(capped, want_capped);

  ops.set_phase("batch");
  std::vector<float> s = x, s_want = x;
  ops.add(s.data(), x.data(), int64_t(x.size()));
  inner.add(s_want.data(), x.data(), int64_t(x.size()));
  EXPECT_EQ(s, s_want);
  ops.set_phase("decode");  // a phase set again continues where it was
  ops.rms_norm(s.data(), 64, s.data(), 64, 2, 64, nullptr, 1e-6f);
  ops.set_phase("");
  ops.add(s.data(), x.data(), int64_t(x.size()));  // counts nowhere

  std::map<std::pair<std::string, std::string>, int64_t> calls;
  std::vector<std::string> phases;
  for (const ProfilingOps::Entry& e : ops.entries()) {
    calls[{e.phase, e.what}] = e.calls;
    EXPECT_GE(e.seconds, 0.0) << e.what;
    if (phases.empty() || phases.back() != e.phase) phases.push_back(e.phase);
  }
  EXPECT_EQ(phases, (std::vector<std::string>{"decode", "batch"}));
  const std::map<std::pair<std::string, std::string>, int64_t> expected = {
      {{"decode", "matmul 48x64"}, 3},  // two matmuls and the capped group of one
      {{"decode", "matmuls 2: 96x64"}, 1},
      {{"decode", "rms_norm"}, 1},
      {{"batch", "add"}, 1},
  };
  EXPECT_EQ(calls, expected);
}

}  // namespace
}  // namespace tandem::test
