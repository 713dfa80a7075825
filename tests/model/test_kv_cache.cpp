#include <gtest/gtest.h>

#include <cstdint>

#include "model/checkpoint.h"
#include "model/kv_cache.h"
#include "model/quantize_checkpoint.h"
#include "support/test_support.h"

namespace tandem {
namespace {

// The cache's blocks live in memory advised for 2 MB pages (attention streams through them), and
// every cache-owning layer's keys and values are in that one mapping.
TEST(KvCache, BlocksLiveInMemoryAdvisedForHugePages) {
  if (!test::kernel_has_transparent_huge_pages()) GTEST_SKIP() << "this kernel has no transparent huge pages";
  auto ckpt = Gemma4Checkpoint::open(test::checkpoint_for("golden"));
  const Gemma4Config& c = ckpt->config;
  KvCache cache(c, ckpt->weights, KvCache::plan(c, ckpt->weights, 16 << 20, 4, 32, 16, KvDType::F32));
  const test::MappingFlags first = test::mapping_flags_of(cache.layer_view(0).keys);
  EXPECT_NE(first.flags.find(" hg"), std::string::npos) << first.flags;
  for (int layer = 0; layer < c.first_kv_shared_layer(); ++layer) {
    const KvLayerView v = cache.layer_view(layer);
    for (const void* p : {v.keys, v.values}) {
      const uintptr_t at = reinterpret_cast<uintptr_t>(p);
      EXPECT_TRUE(at >= first.begin && at < first.end) << "layer " << layer;
    }
  }
}

// Float weights keep an f32 cache (greedy decode token-exact against the float32 reference);
// quantized ones, whose outputs move far more than bf16 K/V rounding moves them, get a bf16 cache.
TEST(KvCache, DefaultElementTypeFollowsTheStreamedWeights) {
  for (WeightFormat format : {WeightFormat::F32, WeightFormat::BF16, WeightFormat::F16, WeightFormat::Q8,
                              WeightFormat::Q4}) {
    ModelWeights weights;
    weights.layers.resize(3);
    for (LayerWeights& l : weights.layers) l.gate_proj.format = l.down_proj.format = format;
    EXPECT_EQ(default_kv_dtype(weights), is_quantized(format) ? KvDType::BF16 : KvDType::F32)
        << weight_format_name(format);
  }
  ModelWeights none;
  EXPECT_EQ(default_kv_dtype(none), KvDType::F32);
  // A real quantized checkpoint as the loader binds it, and the float one it came from.
  const std::string original = test::synth_checkpoint("tiny");
  test::TempDir q4;
  quantize_checkpoint(original, q4.path(), WeightFormat::Q4, false);
  EXPECT_EQ(default_kv_dtype(Gemma4Checkpoint::open(original)->weights), KvDType::F32);
  EXPECT_EQ(default_kv_dtype(Gemma4Checkpoint::open(q4.path())->weights), KvDType::BF16);
}

}  // namespace
}  // namespace tandem
