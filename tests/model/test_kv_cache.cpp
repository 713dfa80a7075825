#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>

#include "core/error.h"
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

// A sequence keeps sliding blocks that left its window while it holds fewer than its share of
// the pool (its window and a chunk), and gives the oldest back as it needs new ones. Prefix reuse
// cuts a table back to a prefix: full-attention layers keep the blocks of [0, length), sliding
// layers those a query there sees, and the rest goes back to the pools. A prefix whose window
// starts in a block already given back cannot be cut back to.
TEST(KvCache, SlidingLayersKeepTheirShareAndTruncatedCutsBackToAPrefix) {
  auto ckpt = Gemma4Checkpoint::open(test::checkpoint_for("golden"));
  const Gemma4Config& c = ckpt->config;
  ASSERT_EQ(c.sliding_window, 16);  // the numbers below assume it, with blocks of 16 positions
  KvCache cache(c, ckpt->weights, KvCache::plan(c, ckpt->weights, 16 << 20, 4, 32, 16, KvDType::F32));
  ASSERT_EQ(cache.options().sliding_blocks_per_sequence, 4);  // window 16 and chunks of 32
  const int64_t free_full = cache.free_full_blocks(), free_sliding = cache.free_sliding_blocks();
  KvSequenceBlocks seq;
  auto grow = [&](int end) {  // as a prefill chunk or a decode does
    ASSERT_TRUE(cache.reserve(seq, end));
    seq.length = end;
    cache.trim_window(seq);
  };
  grow(32);
  grow(64);
  EXPECT_EQ(seq.sliding_first, 0) << "blocks 0-3, four: all kept although a query at 64 sees only 49-64";
  EXPECT_EQ(cache.blocks_needed(seq, 70).second, 0) << "block 4 comes with block 0 given back";
  grow(70);
  ASSERT_EQ(seq.full.size(), 5u);
  ASSERT_EQ(seq.sliding_first, 1);
  ASSERT_EQ(seq.sliding.size(), 4u);
  EXPECT_EQ(cache.free_sliding_blocks(), free_sliding - 4);

  const auto same_block = cache.truncated(seq, 66);  // a query at 66 sees 51-66: blocks 3-4
  ASSERT_TRUE(same_block);
  EXPECT_EQ(same_block->length, 66);
  EXPECT_EQ(same_block->full, seq.full);
  EXPECT_EQ(same_block->sliding_first, 3);
  EXPECT_EQ(same_block->sliding, std::vector<int32_t>(seq.sliding.begin() + 2, seq.sliding.end()));
  const auto block_edge = cache.truncated(seq, 64);  // sees 49-64: block 3 (and 4 once written)
  ASSERT_TRUE(block_edge);
  EXPECT_EQ(block_edge->full, std::vector<int32_t>(seq.full.begin(), seq.full.begin() + 4));
  EXPECT_EQ(block_edge->sliding, std::vector<int32_t>(seq.sliding.begin() + 2, seq.sliding.begin() + 3));
  EXPECT_EQ(block_edge->sliding_first, 3);
  EXPECT_TRUE(cache.truncated(seq, 31)) << "a query at 31 sees 16-31: block 1 on, still held";
  EXPECT_FALSE(cache.truncated(seq, 30)) << "a query at 30 sees position 15, in block 0, given back";
  EXPECT_FALSE(cache.truncated(seq, 71)) << "past what is stored";
  EXPECT_EQ(cache.free_full_blocks(), free_full - 5) << "truncated() changes nothing";

  cache.truncate(seq, 64);
  EXPECT_EQ(seq.length, 64);
  EXPECT_EQ(seq.full.size(), 4u);
  EXPECT_EQ(seq.sliding.size(), 1u);
  EXPECT_EQ(cache.free_full_blocks(), free_full - 4);
  EXPECT_EQ(cache.free_sliding_blocks(), free_sliding - 1);
  grow(80);  // on from there as a sequence prefilled to 64 would go
  EXPECT_EQ(seq.full.size(), 5u);
  EXPECT_EQ(seq.sliding_first, 3);
  EXPECT_EQ(seq.sliding.size(), 2u);
  EXPECT_THROW(cache.truncate(seq, 10), Error);
  cache.release(seq);
  EXPECT_EQ(cache.free_full_blocks(), free_full);
  EXPECT_EQ(cache.free_sliding_blocks(), free_sliding);
}

// copy_prefix gives an empty sequence the blocks for a prefix (the shape truncated() gives): the
// full-attention blocks the prefix fills are shared, and its last, partly filled block and the
// sliding blocks are copies of their own holding every K and V of every layer that owns a cache;
// the source is unchanged, and a pool too short for the copy changes nothing. A shared block goes
// back to the pool with its last holder.
TEST(KvCache, CopyPrefixSharesTheBlocksItFillsAndCopiesTheRest) {
  auto ckpt = Gemma4Checkpoint::open(test::checkpoint_for("golden"));
  const Gemma4Config& c = ckpt->config;
  KvCache cache(c, ckpt->weights, KvCache::plan(c, ckpt->weights, 16 << 20, 4, 32, 16, KvDType::F32));
  KvSequenceBlocks source;
  for (int end : {32, 64, 70}) {
    ASSERT_TRUE(cache.reserve(source, end));
    source.length = end;
    cache.trim_window(source);
  }
  // Every float of every block of every cache-owning layer gets a value unique to its place.
  auto value_at = [](int layer, int part, int64_t index) { return float(layer * 1000003 + part * 500009 + index % 400000); };
  auto for_each_float = [&](auto&& f) {
    for (int layer = 0; layer < c.first_kv_shared_layer(); ++layer) {
      const KvLayerView v = cache.layer_view(layer);
      const int64_t blocks = c.layers[size_t(layer)].kind == AttentionKind::Full ? cache.options().full_blocks
                                                                                : cache.options().sliding_blocks;
      for (int part = 0; part < 2; ++part) {
        float* base = static_cast<float*>(part == 0 ? v.keys : v.values);
        for (int64_t i = 0; i < blocks * v.block_stride * v.kv_heads; ++i) f(layer, part, base, i, v, blocks);
      }
    }
  };
  for_each_float([&](int layer, int part, float* base, int64_t i, const KvLayerView&, int64_t) {
    base[i] = value_at(layer, part, i);
  });
  const KvSequenceBlocks before = source;
  const int64_t free_full = cache.free_full_blocks(), free_sliding = cache.free_sliding_blocks();
  const auto want = cache.truncated(source, 66);
  ASSERT_TRUE(want);
  const auto needed = cache.copy_blocks_needed(source, 66);
  ASSERT_TRUE(needed);
  ASSERT_EQ(want->full.size(), 5u) << "66 positions: four whole blocks and two positions of a fifth";
  EXPECT_EQ(needed->first, 1);
  EXPECT_EQ(needed->second, int64_t(want->sliding.size()));

  KvSequenceBlocks copy;
  ASSERT_TRUE(cache.copy_prefix(source, copy, 66));
  EXPECT_EQ(copy.length, 66);
  EXPECT_EQ(copy.sliding_first, want->sliding_first);
  ASSERT_EQ(copy.full.size(), want->full.size());
  ASSERT_EQ(copy.sliding.size(), want->sliding.size());
  EXPECT_EQ(cache.free_full_blocks(), free_full - 1);
  EXPECT_EQ(cache.free_sliding_blocks(), free_sliding - int64_t(copy.sliding.size()));
  EXPECT_EQ(source.full, before.full);
  EXPECT_EQ(source.sliding, before.sliding);
  for (size_t b = 0; b < 4; ++b) {
    EXPECT_EQ(copy.full[b], source.full[b]) << "a whole block is shared";
    EXPECT_EQ(cache.full_block_holders(source.full[b]), 2);
  }
  EXPECT_EQ(std::count(source.full.begin(), source.full.end(), copy.full[4]), 0) << "the partial block is copied";
  EXPECT_EQ(cache.full_block_holders(copy.full[4]), 1);
  EXPECT_EQ(cache.full_block_holders(source.full[4]), 1);
  for (int layer = 0; layer < c.first_kv_shared_layer(); ++layer) {
    const KvLayerView v = cache.layer_view(layer);
    const bool full = c.layers[size_t(layer)].kind == AttentionKind::Full;
    const std::vector<int32_t>& from = full ? want->full : want->sliding;
    const std::vector<int32_t>& to = full ? copy.full : copy.sliding;
    for (size_t b = 0; b < from.size(); ++b) {
      if (!full || b == 4) EXPECT_EQ(std::count(from.begin(), from.end(), to[b]), 0) << "a block of its own";
      for (int part = 0; part < 2; ++part) {
        const float* base = static_cast<const float*>(part == 0 ? v.keys : v.values);
        for (int h = 0; h < v.kv_heads; ++h)
          for (int64_t i = 0; i < v.block_stride; ++i) {
            const int64_t at_from = from[b] * v.block_stride + h * v.head_stride + i;
            const int64_t at_to = to[b] * v.block_stride + h * v.head_stride + i;
            ASSERT_EQ(base[at_to], value_at(layer, part, at_from)) << "layer " << layer << " block " << b;
          }
      }
    }
  }
  EXPECT_THROW(cache.copy_prefix(source, copy, 40), Error) << "only into an empty sequence";
  EXPECT_THROW({ KvSequenceBlocks other; cache.copy_prefix(source, other, 30); }, Error)
      << "a query at 30 sees a block the source gave back";

  // Too few blocks left: nothing changes.
  std::vector<KvSequenceBlocks> hogs;
  for (KvSequenceBlocks hog; cache.reserve(hog, 16); hog = KvSequenceBlocks{}) hogs.push_back(hog);
  const int64_t left_full = cache.free_full_blocks(), left_sliding = cache.free_sliding_blocks();
  KvSequenceBlocks refused;
  EXPECT_FALSE(cache.copy_prefix(source, refused, 66));
  EXPECT_TRUE(refused.full.empty() && refused.sliding.empty());
  EXPECT_EQ(cache.free_full_blocks(), left_full);
  EXPECT_EQ(cache.free_sliding_blocks(), left_sliding);
  for (KvSequenceBlocks& s : hogs) cache.release(s);
  // A prefix of whole blocks takes no full block at all.
  KvSequenceBlocks whole;
  ASSERT_EQ(cache.copy_blocks_needed(source, 64)->first, 0);
  const int64_t before_whole = cache.free_full_blocks();
  ASSERT_TRUE(cache.copy_prefix(source, whole, 64));
  EXPECT_EQ(cache.free_full_blocks(), before_whole);
  EXPECT_EQ(whole.full, std::vector<int32_t>(source.full.begin(), source.full.begin() + 4));
  EXPECT_EQ(cache.full_block_holders(source.full[0]), 3);
  // The source going first leaves the shared blocks with the others.
  const std::vector<int32_t> shared(source.full.begin(), source.full.begin() + 4);
  cache.release(source);
  for (int32_t b : shared) EXPECT_EQ(cache.full_block_holders(b), 2);
  cache.release(copy);
  for (int32_t b : shared) EXPECT_EQ(cache.full_block_holders(b), 1);
  cache.release(whole);
  for (int32_t b : shared) EXPECT_EQ(cache.full_block_holders(b), 0);
  EXPECT_EQ(cache.free_full_blocks(), cache.options().full_blocks);
  EXPECT_EQ(cache.free_sliding_blocks(), cache.options().sliding_blocks);
}

// A sequence cut back inside a block it shares writes on from there, so the cut gives it a copy of
// that block first (the others keep reading theirs); with no block left for the copy the cut is
// refused and changes nothing. Cutting at a block's edge needs no copy.
TEST(KvCache, CuttingInsideASharedBlockCopiesItFirst) {
  auto ckpt = Gemma4Checkpoint::open(test::checkpoint_for("golden"));
  const Gemma4Config& c = ckpt->config;
  KvCache cache(c, ckpt->weights, KvCache::plan(c, ckpt->weights, 16 << 20, 4, 32, 16, KvDType::F32));
  int full_layer = -1;
  for (int layer = 0; layer < c.first_kv_shared_layer() && full_layer < 0; ++layer)
    if (c.layers[size_t(layer)].kind == AttentionKind::Full) full_layer = layer;
  ASSERT_GE(full_layer, 0);
  const KvLayerView v = cache.layer_view(full_layer);
  auto first_key = [&](int32_t block) { return static_cast<float*>(v.keys) + int64_t(block) * v.block_stride; };
  KvSequenceBlocks source;
  ASSERT_TRUE(cache.reserve(source, 48));
  source.length = 48;
  for (int32_t b : source.full) *first_key(b) = float(100 + b);
  KvSequenceBlocks other;
  ASSERT_TRUE(cache.copy_prefix(source, other, 48));
  ASSERT_EQ(other.full, source.full);
  const std::vector<int32_t> shared = source.full;

  EXPECT_EQ(cache.truncate_blocks_needed(source, 32, [&](int32_t b) { return cache.full_block_holders(b); }), 0);
  EXPECT_EQ(cache.truncate_blocks_needed(source, 40, [&](int32_t b) { return cache.full_block_holders(b); }), 1);
  // No block free for the copy: refused, nothing changed.
  KvSequenceBlocks hog;
  while (cache.free_full_blocks() > 0) {
    ASSERT_TRUE(cache.reserve(hog, hog.length + 16));
    hog.length += 16;
    cache.trim_window(hog);
  }
  EXPECT_FALSE(cache.truncate(source, 40));
  EXPECT_EQ(source.full, shared);
  EXPECT_EQ(source.length, 48);
  cache.release(hog);

  ASSERT_TRUE(cache.truncate(source, 40));
  ASSERT_EQ(source.full.size(), 3u);
  EXPECT_EQ(source.full[0], shared[0]);
  EXPECT_EQ(source.full[1], shared[1]);
  EXPECT_NE(source.full[2], shared[2]) << "a copy of its own";
  EXPECT_EQ(*first_key(source.full[2]), float(100 + shared[2])) << "holding what the shared block held";
  EXPECT_EQ(cache.full_block_holders(shared[2]), 1);
  EXPECT_EQ(cache.full_block_holders(source.full[2]), 1);
  EXPECT_EQ(cache.full_block_holders(shared[0]), 2);
  const int64_t before_release = cache.free_full_blocks();
  cache.release(other);
  EXPECT_EQ(cache.free_full_blocks(), before_release + 1) << "only its third block had no other holder left";
  EXPECT_EQ(cache.full_block_holders(shared[2]), 0);
  EXPECT_EQ(cache.full_block_holders(shared[0]), 1);
  cache.release(source);
  EXPECT_EQ(cache.free_full_blocks(), cache.options().full_blocks);
}

// A pinned prompt window: the sliding blocks a query at the prompt's end (or one before) sees stay
// when the sequence goes on far past them, so it can be cut back there; nothing else is kept, and
// the pool gets every block back at the end.
TEST(KvCache, APinnedPromptWindowOutlivesTheSequencesOwnWindow) {
  auto ckpt = Gemma4Checkpoint::open(test::checkpoint_for("golden"));
  const Gemma4Config& c = ckpt->config;
  KvCache cache(c, ckpt->weights, KvCache::plan(c, ckpt->weights, 16 << 20, 4, 32, 16, KvDType::F32, true));
  ASSERT_EQ(cache.options().pinned_blocks_per_sequence, 2);  // a window of 16 spans two blocks at most
  const int64_t free_sliding = cache.free_sliding_blocks();
  KvSequenceBlocks seq;
  cache.pin(seq, 40);  // a 40-token prompt: queries at 39 and 40 see blocks 1-2
  for (int end : {32, 40, 72, 104, 136, 168, 200}) {  // prefill chunks, then steps of 32
    ASSERT_TRUE(cache.reserve(seq, end));
    seq.length = end;
    cache.trim_window(seq);
  }
  EXPECT_EQ(seq.sliding_first, 9) << "its own run: its share of 4 blocks, 9-12";
  EXPECT_EQ(seq.pinned_first, 1);
  EXPECT_EQ(seq.pinned.size(), 2u);
  EXPECT_EQ(cache.free_sliding_blocks(), free_sliding - 6) << "blocks 0 and 3-8 went back";
  for (int prefix : {31, 39, 40, 48}) {
    const auto cut = cache.truncated(seq, prefix);
    ASSERT_TRUE(cut) << prefix;
    EXPECT_EQ(cut->sliding_first, (prefix - 15) / 16) << prefix;
    EXPECT_TRUE(cut->pinned.empty());
  }
  EXPECT_FALSE(cache.truncated(seq, 30)) << "sees block 0";
  EXPECT_FALSE(cache.truncated(seq, 100)) << "sees blocks 5-6";
  const std::vector<int32_t> pinned = seq.pinned;
  cache.truncate(seq, 40);
  EXPECT_EQ(seq.sliding, pinned);
  EXPECT_EQ(cache.free_sliding_blocks(), free_sliding - 2);
  cache.release(seq);
  EXPECT_EQ(cache.free_sliding_blocks(), free_sliding);
}

}  // namespace
}  // namespace tandem
