// The AVX-512 VNNI kernels' activation layout (matmul_avx512_vnni_panel.cpp): bytes checked
// against the layout as documented there, computed here element by element.
#include <gtest/gtest.h>

#include <cfenv>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/cpu_features.h"
#include "kernels/cpu/isa_kernels.h"
#include "kernels/weight.h"

namespace tandem {
namespace {

// Per 512-column chunk: 8 x 64 code bytes (vector k, lane j: codes 4k .. 4k + 3 of block j) | 16
// float scales | 16 int32 corrections (-offset * the block's code sum); zero past cols.
std::vector<uint8_t> expected_panel(WeightFormat format, const std::vector<float>& x) {
  const int64_t cols = int64_t(x.size()), chunks = (cols + 511) / 512;
  const int32_t offset = format == WeightFormat::Q4 ? 8 : 128;
  std::vector<uint8_t> out(size_t(chunks * 640), 0);
  for (int64_t b = 0; b < cols / kQuantBlock; ++b) {
    const float* xb = x.data() + b * kQuantBlock;
    float amax = 0.0f;
    for (int i = 0; i < kQuantBlock; ++i) amax = std::max(amax, std::fabs(xb[i]));
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    uint8_t* chunk = out.data() + (b / 16) * 640;
    const int64_t j = b % 16;
    int32_t sum = 0;
    for (int i = 0; i < kQuantBlock; ++i) {
      const int q = int(std::nearbyint(xb[i] * inv));  // round half to even, as the vector convert
      chunk[64 * (i / 4) + 4 * j + i % 4] = uint8_t(int8_t(q));
      sum += q;
    }
    const float scale = amax / 127.0f;
    const int32_t correction = -offset * sum;
    std::memcpy(chunk + 512 + 4 * j, &scale, 4);
    std::memcpy(chunk + 576 + 4 * j, &correction, 4);
  }
  return out;
}

TEST(PanelActivations, FollowTheDocumentedLayout) {
  if (!cpu_features().avx512_vnni) GTEST_SKIP() << "no AVX-512 VNNI";
  ASSERT_EQ(std::fegetround(), FE_TONEAREST);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  // Two whole chunks and a partial one (5 blocks), so both quantizer paths run.
  for (const int64_t cols : {int64_t(512), int64_t(1024 + 160), int64_t(96)}) {
    std::vector<float> x(static_cast<size_t>(cols));
    for (auto& v : x) v = normal(rng);
    for (int i = 0; i < 32 && 64 + i < cols; ++i) x[size_t(64 + i)] = 0.0f;          // a zero block
    if (cols > 200) x[size_t(130)] = -40.0f;                                          // a block's outlier
    for (int i = 0; i < 32 && 160 + i < cols; ++i) x[size_t(160 + i)] = -1.0f - i;   // all negative
    for (const WeightFormat format : {WeightFormat::Q8, WeightFormat::Q4}) {
      const std::vector<uint8_t> want = expected_panel(format, x);
      ASSERT_EQ(cpu::detail::avx512vnni_panel_stride(cols), int64_t(want.size()));
      std::vector<uint8_t> got(want.size() + 64, 0xcd);
      auto* aligned = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(got.data()) + 63) / 64 * 64);
      cpu::detail::avx512vnni_panel_quantize(format, cols, x.data(), aligned);
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_EQ(int(aligned[i]), int(want[i])) << "cols " << cols << ", byte " << i << " (chunk " << i / 640
                                                 << ", offset " << i % 640 << ")";
    }
  }
}

}  // namespace
}  // namespace tandem
