// Gemma4Model's row trimming: once the last layer that writes the KV cache has stored every row's
// K/V, only the rows whose logits are wanted run on (its queries, attention, output projection,
// MLP and PLE block, then the KV-shared layers and the LM head). Checked by counting the rows each
// matrix is multiplied with, and by comparing against the same prompt with every row's logits
// wanted, where nothing can be trimmed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "model/checkpoint.h"
#include "model/gemma4.h"
#include "parallel/communicator.h"
#include "support/test_support.h"

namespace tandem {
namespace {

// CpuOps that remembers how many rows each matrix was last multiplied with.
class RowCountingOps final : public Ops {
 public:
  explicit RowCountingOps(ThreadPool& pool) : inner_(pool) {}
  std::map<const WeightMatrix*, int64_t> rows;

  std::string_view name() const override { return "row-counting"; }
  void matmul(const WeightMatrix& w, const float* x, int64_t x_stride, int64_t n, float* y,
              int64_t y_stride) override {
    rows[&w] = n;
    inner_.matmul(w, x, x_stride, n, y, y_stride);
  }
  void matmuls(std::span<const MatmulTarget> targets, const float* x, int64_t x_stride, int64_t n) override {
    for (const MatmulTarget& t : targets) rows[t.w] = n;
    inner_.matmuls(targets, x, x_stride, n);
  }
  void rms_norm(float* out, int64_t out_stride, const float* x, int64_t x_stride, int64_t n, int64_t dim,
                const float* weight, float eps) override {
    inner_.rms_norm(out, out_stride, x, x_stride, n, dim, weight, eps);
  }
  void rope(float* x, int64_t x_stride, int64_t n, int heads, int head_dim, const float* cos,
            const float* sin) override {
    inner_.rope(x, x_stride, n, heads, head_dim, cos, sin);
  }
  void gelu_gate(float* gate, int64_t gate_stride, const float* up, int64_t up_stride, int64_t n,
                 int64_t width) override {
    inner_.gelu_gate(gate, gate_stride, up, up_stride, n, width);
  }
  void add(float* x, const float* y, int64_t count) override { inner_.add(x, y, count); }
  void scale(float* x, int64_t count, float s) override { inner_.scale(x, count, s); }
  void softcap(float* x, int64_t count, float cap) override { inner_.softcap(x, count, cap); }
  void embed(const WeightMatrix& table, const int32_t* ids, int64_t n, float scale, float* out,
             int64_t out_stride) override {
    inner_.embed(table, ids, n, scale, out, out_stride);
  }
  void store_kv(const KvLayerView& kv, std::span<const KvSequence> sequences, const float* k, int64_t k_stride,
                const float* v, int64_t v_stride) override {
    inner_.store_kv(kv, sequences, k, k_stride, v, v_stride);
  }
  void attention(const AttentionBatch& batch) override { inner_.attention(batch); }

 private:
  cpu::CpuOps inner_;
};

class LogitRows : public ::testing::TestWithParam<std::string> {
 protected:
  std::string checkpoint_dir() const {
    return test::checkpoint_for(GetParam());
  }
};

TEST_P(LogitRows, OnlyTheWantedRowsRunPastTheLastCacheWritingLayer) {
  auto ckpt = Gemma4Checkpoint::open(checkpoint_dir());
  const Gemma4Config& c = ckpt->config;
  const ModelWeights& w = ckpt->weights;
  const int last_writer = c.first_kv_shared_layer() - 1;
  ASSERT_GE(last_writer, 1);
  ThreadPool pool(2);
  RowCountingOps ops(pool);
  LocalCommunicator comm;
  KvCache cache(c, w, KvCache::plan(c, w, 16 << 20, 4, 32, 16, KvDType::F32));
  Gemma4Model model(c, w, ops, comm, cache, 64, 32);
  const std::vector<int32_t> prompt = test::pseudo_random_ids(20, c.vocab_size, 31);

  // Every row's logits: nothing is trimmed.
  KvSequenceBlocks all_kv;
  ASSERT_TRUE(cache.reserve(all_kv, 20));
  const StepSequence all{&all_kv, prompt, 20};
  model.forward(std::span(&all, 1));
  ASSERT_EQ(model.logit_rows(), 20);
  const std::vector<float> expected(model.logits(19), model.logits(19) + model.vocab_local());
  EXPECT_EQ(ops.rows[&w.layers[size_t(last_writer)].down_proj], 20);
  cache.release(all_kv);

  // The last row's logits only.
  ops.rows.clear();
  KvSequenceBlocks kv;
  ASSERT_TRUE(cache.reserve(kv, 20));
  const StepSequence last{&kv, prompt, 1};
  model.forward(std::span(&last, 1));
  ASSERT_EQ(model.logit_rows(), 1);
  float worst = 0, largest = 1;
  for (int64_t i = 0; i < model.vocab_local(); ++i) {
    worst = std::max(worst, std::abs(model.logits(0)[i] - expected[size_t(i)]));
    largest = std::max(largest, std::abs(expected[size_t(i)]));
  }
  EXPECT_LE(worst, 1e-5f * largest);  // the same sums, but a one-row matmul instead of a 20-row one
  const LayerWeights& writer = w.layers[size_t(last_writer)];
  EXPECT_EQ(ops.rows[&w.layers[size_t(last_writer) - 1].q_proj], 20);
  EXPECT_EQ(ops.rows[&w.layers[size_t(last_writer) - 1].down_proj], 20);
  EXPECT_EQ(ops.rows[&writer.k_proj], 20);
  EXPECT_EQ(ops.rows[&writer.v_proj], 20);
  for (const WeightMatrix* m : {&writer.q_proj, &writer.o_proj, &writer.gate_proj, &writer.down_proj, &w.lm_head})
    EXPECT_EQ(ops.rows[m], 1);
  if (c.ple_dim > 0) {
    EXPECT_EQ(ops.rows[&writer.ple_projection], 1);
  }
  EXPECT_EQ(ops.rows[&w.layers.back().up_proj], 1);  // the last writer itself when nothing is shared

  // A non-final prefill chunk wants no logits: past the last writer's K/V nothing runs.
  ops.rows.clear();
  const std::vector<int32_t> more = test::pseudo_random_ids(6, c.vocab_size, 32);
  ASSERT_TRUE(cache.reserve(kv, 26));
  const StepSequence chunk{&kv, more, 0};
  model.forward(std::span(&chunk, 1));
  EXPECT_EQ(model.logit_rows(), 0);
  EXPECT_EQ(ops.rows[&writer.k_proj], 6);
  EXPECT_EQ(ops.rows.count(&writer.q_proj), 0u);
  EXPECT_EQ(ops.rows.count(&w.lm_head), 0u);
  EXPECT_EQ(kv.length, 26);
  cache.release(kv);
}

// The golden E4B-like checkpoint, E2B-like, one without KV sharing (its last layer is the last
// writer, and the rows are trimmed within it, before the LM head), and one of sizes off the
// kernels' multiples.
INSTANTIATE_TEST_SUITE_P(Checkpoints, LogitRows,
                         ::testing::Values("golden", "tiny-e2b", "tiny-unshared", "tiny-odd"),
                         [](const auto& info) { return test::checkpoint_label(info.param); });

}  // namespace
}  // namespace tandem
