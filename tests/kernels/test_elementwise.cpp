// The elementwise kernels of every ISA table this CPU runs against double-precision references:
// tails of every length, and tanh/exp across their whole range.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "matrix_factory.h"

namespace tandem::test {
namespace {

using cpu::KernelTable;
using cpu::kGeluZeroBelow;

const std::vector<int64_t> kLengths = {1, 3, 7, 8, 15, 16, 17, 31, 33, 100, 257, 2560};

class Elementwise : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!isa_supported(GetParam())) GTEST_SKIP() << isa_name(GetParam()) << ": not supported by this CPU";
  }
  const KernelTable& k() const { return cpu::kernels_for(GetParam()); }
  std::mt19937 rng{5};
};

TEST_P(Elementwise, RmsNorm) {
  for (int64_t n : kLengths)
    for (bool with_weight : {false, true}) {
      const std::vector<float> x = random_vector(size_t(n), rng, -3, 3), w = random_vector(size_t(n), rng, 0.5, 2);
      std::vector<float> out(static_cast<size_t>(n));
      k().rms_norm(out.data(), x.data(), with_weight ? w.data() : nullptr, n, 1e-6f);
      double ss = 0;
      for (float v : x) ss += double(v) * v;
      const double s = 1.0 / std::sqrt(ss / double(n) + 1e-6);
      for (int64_t i = 0; i < n; ++i) {
        const double e = double(x[size_t(i)]) * s * (with_weight ? w[size_t(i)] : 1.0);
        EXPECT_NEAR(out[size_t(i)], e, 2e-6 * std::fabs(e) + 1e-7) << "n=" << n << " i=" << i;
      }
      std::vector<float> in_place = x;  // out may alias x
      k().rms_norm(in_place.data(), in_place.data(), with_weight ? w.data() : nullptr, n, 1e-6f);
      EXPECT_EQ(in_place, out);
    }
}

TEST_P(Elementwise, GeluGate) {
  for (int64_t n : kLengths) {
    std::vector<float> g = random_vector(size_t(n), rng, -12, 12);
    const std::vector<float> up = random_vector(size_t(n), rng, -2, 2), g0 = g;
    k().gelu_gate(g.data(), up.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const double v = g0[size_t(i)];
      const double e = 0.5 * v * (1 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))) * up[size_t(i)];
      EXPECT_NEAR(g[size_t(i)], e, 2e-6 * std::fabs(v * up[size_t(i)]) + 1e-30) << "n=" << n << " g=" << v;
    }
  }
}

// Strongly negative gates give 0, as the reference's 0.5 g (1 + tanh(u)) once tanh(u) is -1 in
// float, and no result is subnormal (each one costs a vector ~100x its time on x86).
TEST_P(Elementwise, GeluGateIsZeroWhereTanhSaturatesAndNeverSubnormal) {
  std::vector<float> g, up;
  for (float v = -200.0f; v <= 200.0f; v += 0.013f)
    for (float u : {1.0f, 1e-3f, -1e-6f}) {
      g.push_back(v);
      up.push_back(u);
    }
  const std::vector<float> g0 = g;
  k().gelu_gate(g.data(), up.data(), int64_t(g.size()));
  for (size_t i = 0; i < g.size(); ++i) {
    const float v = g0[i];
    EXPECT_TRUE(g[i] == 0.0f || std::fabs(g[i]) >= FLT_MIN) << "g=" << v << " up=" << up[i] << " -> " << g[i];
    const float u = 0.7978845608028654f * (v + 0.044715f * v * v * v);
    if (std::tanh(u) == -1.0f && u < 0.5f * kGeluZeroBelow) {
      EXPECT_EQ(g[i], 0.0f) << "g=" << v;
    }
  }
  // A NaN gate stays NaN, in the vector body and in the tail, so that it reaches the logits.
  for (int64_t n : {17, 33}) {
    std::vector<float> gates(size_t(n), 1.0f), ups(size_t(n), 1.0f);
    gates[0] = gates[size_t(n) - 1] = std::nanf("");
    k().gelu_gate(gates.data(), ups.data(), n);
    EXPECT_TRUE(std::isnan(gates[0]) && std::isnan(gates[size_t(n) - 1])) << "n=" << n;
  }
}

TEST_P(Elementwise, SoftcapIsAccurateEverywhere) {
  std::vector<float> x;
  for (float v = -120.0f; v <= 120.0f; v += 0.0137f) x.push_back(v);
  for (float v : {0.0f, -0.0f, 1e-30f, -1e-20f, 1e-7f, 0.62f, 0.63f, 1e6f, -1e30f}) x.push_back(v);
  std::vector<float> y = x;
  k().softcap(y.data(), int64_t(y.size()), 30.0f);
  for (size_t i = 0; i < x.size(); ++i) {
    const double e = 30.0 * std::tanh(double(x[i]) / 30.0);
    EXPECT_NEAR(y[i], e, 1e-6 * std::fabs(e) + 1e-37) << "x=" << x[i];
  }
  for (int64_t n : kLengths) {  // tails leave the rest alone
    std::vector<float> v(size_t(n) + 3, 5.0f);
    k().softcap(v.data(), n, 30.0f);
    EXPECT_EQ(v[size_t(n)], 5.0f);
    EXPECT_NEAR(v[size_t(n) - 1], 30.0 * std::tanh(5.0 / 30.0), 1e-6);
  }
}

TEST_P(Elementwise, AddScaleAxpyDot) {
  for (int64_t n : kLengths) {
    const std::vector<float> a = random_vector(size_t(n), rng), b = random_vector(size_t(n), rng);
    std::vector<float> x = a;
    k().add(x.data(), b.data(), n);
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(x[size_t(i)], a[size_t(i)] + b[size_t(i)]);
    x = a;
    k().scale(x.data(), n, 0.37f);
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(x[size_t(i)], a[size_t(i)] * 0.37f);
    x = a;
    k().axpy(x.data(), -1.5f, b.data(), n);
    for (int64_t i = 0; i < n; ++i)
      EXPECT_NEAR(x[size_t(i)], double(a[size_t(i)]) - 1.5 * b[size_t(i)], 1e-6 * (std::fabs(a[size_t(i)]) + 2));
    double d = 0, mag = 0;
    for (int64_t i = 0; i < n; ++i) {
      d += double(a[size_t(i)]) * b[size_t(i)];
      mag += std::fabs(double(a[size_t(i)]) * b[size_t(i)]);
    }
    EXPECT_NEAR(k().dot(a.data(), b.data(), n), d, 1e-6 * mag + 1e-30) << "n=" << n;
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, Elementwise, ::testing::ValuesIn(all_isas()),
                         [](const auto& info) { return std::string(isa_name(info.param)); });

}  // namespace
}  // namespace tandem::test
