// The fast forward pass against the float32 reference: logits within float32 rounding of theirs
// (see logit_tolerance) and identical greedy ids on E4B- and E2B-like checkpoints, for every instruction set the CPU has, any chunking, and
// any mix of sequences in one batch.
#include <gtest/gtest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

#include "core/cpu_features.h"
#include "core/error.h"
#include "core/huge_pages.h"
#include "kernels/cpu/cpu_ops.h"
#include "model/checkpoint.h"
#include "model/gemma4.h"
#include "model/quantize_checkpoint.h"
#include "kernels/cpu/kernels.h"
#include "model/reference.h"
#include "model/sequence_model.h"
#include "support/test_support.h"

namespace tandem {
namespace {

using test::pseudo_random_ids;

float max_abs_diff(const std::vector<float>& a, const float* b) {
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

// The fast kernels sum in other orders than the reference (8 or 16 lanes, tiles, threads), and
// the tiny checkpoints' random layers amplify those roundings: over 16 prompts the worst logit
// difference was 2-8e-5 (scalar 2-5e-5) with logits of |11-13|, and one prompt of the E2B-like
// checkpoint reached 1.14e-4 on AVX2 (9.1e-5 scalar). So the bound scales with the logits, about
// 170 float32 ulps of the largest one.
float logit_tolerance(const std::vector<float>& expected) {
  float largest = 1.0f;
  for (float v : expected) largest = std::max(largest, std::abs(v));
  return 2e-5f * largest;
}

int32_t argmax(const std::vector<float>& v) { return int32_t(std::max_element(v.begin(), v.end()) - v.begin()); }

std::vector<int32_t> greedy(SequenceModel& m, const std::vector<int32_t>& prompt, int steps) {
  m.reset();
  std::vector<int32_t> out;
  int32_t next = argmax(m.forward(prompt, false).back());
  for (int i = 0; i < steps; ++i) {
    out.push_back(next);
    const int32_t one[1] = {next};
    next = argmax(m.forward(one, false).back());
  }
  return out;
}

class FastForward : public ::testing::TestWithParam<std::string> {
 protected:
  std::string checkpoint_dir() const {
    return test::checkpoint_for(GetParam());
  }
  void TearDown() override { set_isa_cap(Isa::Avx512Amx); }
};

TEST_P(FastForward, MatchesReferenceOnEveryIsa) {
  auto ckpt = Gemma4Checkpoint::open(checkpoint_dir());
  const auto ids = pseudo_random_ids(60, ckpt->config.vocab_size, 11);
  ReferenceModel reference(ckpt->config, ckpt->weights);
  const auto expected = reference.forward(ids, true);
  const auto expected_greedy = greedy(reference, ids, 30);
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx2Vnni, Isa::Avx512, Isa::Avx512Amx}) {
    if (!isa_supported(isa)) {
      GTEST_LOG_(INFO) << "skipping " << isa_name(isa) << ": not supported by this CPU";
      continue;
    }
    set_isa_cap(isa);
    // Chunks of 24 tokens take the register tiles, one chunk of 60 the float prefill panels.
    for (int chunk : {24, 60})
      for (int threads : {1, 2}) {
        ThreadPool pool(threads);
        cpu::CpuOps ops(pool, cpu::active_kernels());
        LocalCommunicator comm;
        FastSequenceModel fast(*ckpt, ops, comm, 200, chunk);
        const auto got = fast.forward(ids, true);
        ASSERT_EQ(got.size(), expected.size());
        for (size_t p = 0; p < got.size(); ++p)
          ASSERT_LE(max_abs_diff(expected[p], got[p].data()), logit_tolerance(expected[p]))
              << isa_name(isa) << " chunk " << chunk << " position " << p;
        EXPECT_EQ(greedy(fast, ids, 30), expected_greedy) << isa_name(isa) << " chunk " << chunk << " threads " << threads;
      }
  }
}

// Resident weights in the row groups the active kernels read (BF16 with AVX-512): decode tiles,
// batch tiles and panels over them keep the reference's logits and greedy ids.
TEST_P(FastForward, ResidentRowGroupsMatchReference) {
  ThreadPool pool(2);
  auto ckpt = Gemma4Checkpoint::open(checkpoint_dir(), ShardPlan{}, WeightResidency::Resident, pool, false,
                                     cpu::preferred_layout);
  // Row groups need whole 64-byte vectors in every row (kernels/weight.h): odd widths stay plain.
  const bool row_groups = cpu::active_kernels().interleaved_float && ckpt->config.hidden_size % 32 == 0;
  EXPECT_EQ(ckpt->weights.layers[0].gate_proj.layout, row_groups ? WeightLayout::Interleaved : WeightLayout::Plain);
  EXPECT_EQ(ckpt->weights.lm_head.layout, row_groups ? WeightLayout::Interleaved : WeightLayout::Plain);
  const auto ids = pseudo_random_ids(60, ckpt->config.vocab_size, 12);
  ReferenceModel reference(ckpt->config, ckpt->weights);  // reads any layout through row_to_float
  const auto expected = reference.forward(ids, true);
  cpu::CpuOps ops(pool);
  LocalCommunicator comm;
  for (int chunk : {4, 24, 60}) {
    FastSequenceModel fast(*ckpt, ops, comm, 200, chunk);
    const auto got = fast.forward(ids, true);
    ASSERT_EQ(got.size(), expected.size());
    for (size_t p = 0; p < got.size(); ++p)
      ASSERT_LE(max_abs_diff(expected[p], got[p].data()), logit_tolerance(expected[p])) << "chunk " << chunk << " position " << p;
    if (chunk == 4) {
      EXPECT_EQ(greedy(fast, ids, 30), greedy(reference, ids, 30));
    }
  }
}

TEST_P(FastForward, ChunkingDoesNotChangeLogits) {
  auto ckpt = Gemma4Checkpoint::open(checkpoint_dir());
  const auto ids = pseudo_random_ids(45, ckpt->config.vocab_size, 4);
  ThreadPool pool(2);
  cpu::CpuOps ops(pool);
  LocalCommunicator comm;
  FastSequenceModel one_shot(*ckpt, ops, comm, 100, 64);
  const auto whole = one_shot.forward(ids, false).back();
  for (int chunk : {1, 5, 16, 17}) {
    FastSequenceModel chunked(*ckpt, ops, comm, 100, chunk);
    const auto last = chunked.forward(ids, false).back();
    EXPECT_LE(max_abs_diff(whole, last.data()), 1e-5f) << "chunk " << chunk;
  }
}

// Sequences of different lengths, some prefilling and some decoding, in one step: each gets the
// logits it gets alone, and the KV blocks all come back when they are released.
TEST_P(FastForward, BatchingDoesNotChangeResults) {
  auto ckpt = Gemma4Checkpoint::open(checkpoint_dir());
  const Gemma4Config& c = ckpt->config;
  ThreadPool pool(2);
  cpu::CpuOps ops(pool);
  LocalCommunicator comm;
  KvCache cache(c, ckpt->weights, KvCache::plan(c, ckpt->weights, 64 << 20, 8, 32, 16, KvDType::F32));
  const int64_t free_full = cache.free_full_blocks(), free_sliding = cache.free_sliding_blocks();
  Gemma4Model model(c, ckpt->weights, ops, comm, cache, 128, 16);

  const int n_seq = 5;
  std::vector<std::vector<int32_t>> prompts;
  for (int s = 0; s < n_seq; ++s) prompts.push_back(pseudo_random_ids(3 + 9 * s, c.vocab_size, 100 + s));

  // Alone: each sequence prefilled in one step, then 6 greedy decode steps.
  std::vector<std::vector<int32_t>> alone(n_seq);
  std::vector<std::vector<float>> alone_first_logits(n_seq);
  for (int s = 0; s < n_seq; ++s) {
    KvSequenceBlocks kv;
    std::vector<int32_t> tokens = prompts[s];
    for (int step = 0; step < 7; ++step) {
      StepSequence st{&kv, std::span<const int32_t>(tokens), 1};
      ASSERT_TRUE(cache.reserve(kv, kv.length + int(tokens.size())));
      model.forward(std::span(&st, 1));
      std::vector<float> row(model.logits(0), model.logits(0) + model.vocab_local());
      if (step == 0) alone_first_logits[s] = row;
      tokens = {argmax(row)};
      alone[s].push_back(tokens[0]);
    }
    cache.release(kv);
  }

  // Together: sequences join at different steps (continuous batching), prompts in chunks of 7.
  std::vector<KvSequenceBlocks> kv(n_seq);
  std::vector<std::vector<int32_t>> together(n_seq);
  std::vector<size_t> prefilled(n_seq, 0);
  std::vector<int32_t> next(n_seq, -1);
  for (int step = 0; step < 40; ++step) {
    std::vector<StepSequence> batch;
    std::vector<int> who;
    for (int s = 0; s < n_seq && s <= step; ++s) {
      if (together[s].size() == 7) continue;
      StepSequence st;
      st.kv = &kv[s];
      if (prefilled[s] < prompts[s].size()) {
        const size_t n = std::min<size_t>(7, prompts[s].size() - prefilled[s]);
        st.tokens = std::span<const int32_t>(prompts[s]).subspan(prefilled[s], n);
        prefilled[s] += n;
        st.logit_rows = prefilled[s] == prompts[s].size() ? 1 : 0;
      } else {
        st.tokens = std::span<const int32_t>(&next[s], 1);
      }
      ASSERT_TRUE(cache.reserve(kv[s], kv[s].length + int(st.tokens.size())));
      batch.push_back(st);
      who.push_back(s);
    }
    if (batch.empty()) break;
    model.forward(batch);
    int row = 0;
    for (size_t b = 0; b < batch.size(); ++b) {
      if (batch[b].logit_rows == 0) continue;
      const int s = who[b];
      std::vector<float> logits(model.logits(row), model.logits(row) + model.vocab_local());
      if (together[s].empty()) {
        EXPECT_LE(max_abs_diff(alone_first_logits[s], logits.data()), 1e-5f) << "sequence " << s;
      }
      next[s] = argmax(logits);
      together[s].push_back(next[s]);
      ++row;
    }
  }
  for (int s = 0; s < n_seq; ++s) {
    EXPECT_EQ(together[s], alone[s]) << "sequence " << s;
    cache.release(kv[s]);
  }
  EXPECT_EQ(cache.free_full_blocks(), free_full);
  EXPECT_EQ(cache.free_sliding_blocks(), free_sliding);
}

TEST_P(FastForward, SlidingLayersKeepOnlyTheWindow) {
  auto ckpt = Gemma4Checkpoint::open(checkpoint_dir());
  const Gemma4Config& c = ckpt->config;
  ThreadPool pool(1);
  cpu::CpuOps ops(pool);
  LocalCommunicator comm;
  FastSequenceModel fast(*ckpt, ops, comm, 300, 8);
  const auto ids = pseudo_random_ids(200, c.vocab_size, 8);
  fast.forward(ids, false);
  // After 200 tokens, only the blocks the next query can see remain (window + one partial block).
  const int64_t window_blocks = (c.sliding_window + 15) / 16 + 1;
  KvSequenceBlocks probe;
  (void)probe;
  EXPECT_EQ(fast.position(), 200);
  EXPECT_LE(fast.model().cache().options().sliding_blocks - fast.model().cache().free_sliding_blocks(), window_blocks);
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, FastForward,
                         ::testing::Values("golden", "tiny-e2b", "tiny-unshared", "tiny-odd"),
                         [](const auto& info) { return test::checkpoint_label(info.param); });

TEST(FastForwardErrors, TooManyTokensOrUnreservedBlocks) {
  auto ckpt = Gemma4Checkpoint::open(test::golden_tiny_checkpoint());
  ThreadPool pool(1);
  cpu::CpuOps ops(pool);
  LocalCommunicator comm;
  KvCache cache(ckpt->config, ckpt->weights, KvCache::plan(ckpt->config, ckpt->weights, 8 << 20, 2, 8, 16, KvDType::F32));
  Gemma4Model model(ckpt->config, ckpt->weights, ops, comm, cache, 8, 2);
  KvSequenceBlocks kv;
  const auto ids = pseudo_random_ids(9, 512, 1);
  StepSequence too_long{&kv, std::span<const int32_t>(ids), 1};
  EXPECT_THROW(model.forward(std::span(&too_long, 1)), Error);
  StepSequence unreserved{&kv, std::span<const int32_t>(ids).subspan(0, 4), 1};
  EXPECT_THROW(model.forward(std::span(&unreserved, 1)), Error);
}

// Fraction of the pages of [p, p + bytes) that are backed by memory.
double resident_fraction(const void* p, size_t bytes) {
  const size_t page = size_t(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p) / page * page;
  const size_t pages = (reinterpret_cast<uintptr_t>(p) + bytes - begin + page - 1) / page;
  std::vector<unsigned char> in_core(pages);
  if (::mincore(reinterpret_cast<void*>(begin), pages * page, in_core.data()) != 0) return -1;
  return double(std::count_if(in_core.begin(), in_core.end(), [](unsigned char c) { return c & 1; })) / double(pages);
}

// A prefaulted pool is backed before any step writes it (a lazy one is not), and computes the same.
TEST(KvCachePrefault, BacksThePoolAtStartUpAndChangesNoResult) {
  auto ckpt = Gemma4Checkpoint::open(test::golden_tiny_checkpoint());
  const Gemma4Config& c = ckpt->config;
  ThreadPool pool(1);
  cpu::CpuOps ops(pool);
  LocalCommunicator comm;
  std::vector<float> logits[2];
  for (int prefault = 0; prefault < 2; ++prefault) {
    KvCacheOptions options = KvCache::plan(c, ckpt->weights, 8 << 20, 2, 8, 16, KvDType::F32);
    options.prefault = prefault == 1;
    KvCache cache(c, ckpt->weights, options);
    ASSERT_FALSE(c.layers[0].shares_kv);
    const void* pool_start = cache.layer_view(0).keys;  // the first layer's keys open the pool
    EXPECT_EQ(resident_fraction(pool_start, cache.bytes()), prefault ? 1.0 : 0.0) << "prefault " << prefault;

    Gemma4Model model(c, ckpt->weights, ops, comm, cache, 8, 1);
    KvSequenceBlocks kv;
    const auto ids = pseudo_random_ids(6, c.vocab_size, 3);
    ASSERT_TRUE(cache.reserve(kv, int(ids.size())));
    StepSequence step{&kv, std::span<const int32_t>(ids), 1};
    model.forward(std::span(&step, 1));
    logits[prefault].assign(model.logits(0), model.logits(0) + model.vocab_local());
  }
  EXPECT_EQ(logits[0], logits[1]);
}

// Backing only the lowest blocks (what a caller will use) leaves the rest of the pool unbacked. The
// pool is advised for 2 MB pages, so the asked blocks are backed in whole pages: a run (one layer's
// keys or values of one KV head) holds at most the two pages of its own first blocks and the page
// its successor's first blocks start in, and a block in the middle of a long run stays unbacked.
TEST(KvCachePrefault, BacksOnlyTheLowestBlocksWhenAsked) {
  auto ckpt = Gemma4Checkpoint::open(test::golden_tiny_checkpoint());
  const Gemma4Config& c = ckpt->config;
  KvCache cache(c, ckpt->weights, KvCache::plan(c, ckpt->weights, size_t(512) << 20, 8, 8, 16, KvDType::F32));
  cache.prefault_blocks(2, 2);
  int long_runs = 0;
  for (size_t layer = 0; layer < c.layers.size(); ++layer) {
    if (c.layers[layer].shares_kv) continue;
    SCOPED_TRACE(layer);
    const KvLayerView v = cache.layer_view(int(layer));
    const int64_t blocks = c.layers[layer].kind == AttentionKind::Full ? cache.options().full_blocks
                                                                       : cache.options().sliding_blocks;
    ASSERT_GE(blocks, 8);
    const auto* keys = static_cast<const float*>(v.keys);
    const auto* values = static_cast<const float*>(v.values);
    const size_t block_bytes = size_t(v.block_stride) * sizeof(float);
    const size_t two_blocks = 2 * block_bytes, run_bytes = size_t(blocks) * block_bytes;
    const size_t bound = two_blocks + 3 * kHugePageBytes;
    for (int g = 0; g < v.kv_heads; ++g)
      for (const float* run : {keys + v.key_offset(0, g, 0, 0), values + v.value_offset(0, g, 0, 0)}) {
        EXPECT_EQ(resident_fraction(run, two_blocks), 1.0);
        EXPECT_LE(resident_fraction(run, run_bytes) * double(run_bytes), double(bound));
        if (run_bytes < 2 * (two_blocks + 2 * kHugePageBytes) + block_bytes) continue;
        ++long_runs;
        EXPECT_EQ(resident_fraction(run + blocks / 2 * v.block_stride, block_bytes), 0.0);
      }
  }
  EXPECT_GT(long_runs, 0) << "no run is long enough to show an unbacked last block";
}

// Resident weights are byte copies of the mapped ones, so the logits must be bit-identical, for
// every rank's shard of a tensor-parallel plan too (each rank copies only its own slices).
TEST(ResidentWeights, GiveBitIdenticalLogitsToMappedWeights) {
  const std::string dir = test::synth_checkpoint("tiny-e2b");
  const auto ids = pseudo_random_ids(20, 512, 5);
  ThreadPool pool(2);
  cpu::CpuOps ops(pool);
  LocalCommunicator comm;
  for (const ShardPlan plan : {ShardPlan{0, 1}, ShardPlan{1, 2}}) {
    auto mapped = Gemma4Checkpoint::open(dir, plan, WeightResidency::Mapped, pool, false);
    auto resident = Gemma4Checkpoint::open(dir, plan, WeightResidency::Resident, pool, false);
    EXPECT_EQ(mapped->resident, nullptr);
    ASSERT_NE(resident->resident, nullptr);
    EXPECT_GT(resident->resident->bytes(), 0u);
    EXPECT_NE(resident->weights.layers[0].q_proj.data, mapped->weights.layers[0].q_proj.data);
    if (plan.size == 1) {
      FastSequenceModel a(*mapped, ops, comm, 64, 8), b(*resident, ops, comm, 64, 8);
      const auto la = a.forward(ids, true), lb = b.forward(ids, true);
      ASSERT_EQ(la.size(), lb.size());
      for (size_t p = 0; p < la.size(); ++p) EXPECT_EQ(la[p], lb[p]) << "position " << p;
    } else {
      const auto& m = mapped->weights.layers[0].gate_proj;
      const auto& r = resident->weights.layers[0].gate_proj;
      ASSERT_EQ(m.rows, r.rows);
      std::vector<float> rm(size_t(m.cols)), rr(size_t(r.cols));
      for (int64_t row = 0; row < m.rows; ++row) {
        m.row_to_float(row, rm.data());
        r.row_to_float(row, rr.data());
        ASSERT_EQ(rm, rr) << "row " << row;
      }
    }
  }
}

// Resident Q8/Q4 weights rearranged for the AVX-512 VNNI kernels (tiny: down_proj has 512
// columns) hold the same values and multiply like the plain mapped ones, up to float32 summation
// order, at every token count the model uses. (Whole-model logits are not compared: the tiny
// random model amplifies a one-step change in an activation's int8 rounding far past any bound.)
TEST(ResidentWeights, InterleavedQuantizedWeightsMultiplyLikeMappedOnes) {
  const std::string original = test::synth_checkpoint("tiny");
  ThreadPool pool(2);
  const cpu::KernelTable& k = cpu::active_kernels();
  for (WeightFormat type : {WeightFormat::Q8, WeightFormat::Q4}) {
    test::TempDir dir;
    quantize_checkpoint(original, dir.path(), type, false);
    auto mapped = Gemma4Checkpoint::open(dir.path(), ShardPlan{}, WeightResidency::Mapped, pool, false);
    auto resident = Gemma4Checkpoint::open(dir.path(), ShardPlan{}, WeightResidency::Resident, pool, false,
                                           cpu::preferred_layout);
    const WeightLayout expected = k.reads_interleaved(type) ? WeightLayout::Interleaved : WeightLayout::Plain;
    for (size_t l = 0; l < mapped->weights.layers.size(); ++l) {
      const WeightMatrix& a = mapped->weights.layers[l].down_proj;
      const WeightMatrix& b = resident->weights.layers[l].down_proj;
      ASSERT_EQ(a.layout, WeightLayout::Plain);
      ASSERT_EQ(b.layout, expected) << "layer " << l;
      EXPECT_EQ(resident->weights.layers[l].q_proj.layout, WeightLayout::Plain);  // 128 columns
      std::vector<float> ra(static_cast<size_t>(a.cols)), rb(static_cast<size_t>(b.cols));
      for (int64_t r = 0; r < a.rows; ++r) {
        a.row_to_float(r, ra.data());
        b.row_to_float(r, rb.data());
        ASSERT_EQ(ra, rb) << "layer " << l << " row " << r;
      }
      for (int64_t n : {1, 2, 5, 8, 15, 16, 24}) {
        std::vector<float> x(size_t(n * a.cols)), ya(size_t(n * a.rows)), yb(size_t(n * a.rows));
        for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(i) * 0.37f + float(l)) * (i % 7 == 0 ? 8.0f : 1.0f);
        cpu::matmul(pool, k, a, x.data(), a.cols, n, ya.data(), a.rows);
        cpu::matmul(pool, k, b, x.data(), b.cols, n, yb.data(), b.rows);
        for (size_t i = 0; i < ya.size(); ++i)
          ASSERT_NEAR(ya[i], yb[i], 1e-4f * (1.0f + std::fabs(ya[i])))
              << weight_format_name(type) << " layer " << l << " n " << n << " value " << i;
      }
    }
  }
}

}  // namespace
}  // namespace tandem
