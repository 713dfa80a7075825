#include <gtest/gtest.h>

#include <cstdint>

#include "model/checkpoint.h"
#include "model/kv_cache.h"
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

}  // namespace
}  // namespace tandem
